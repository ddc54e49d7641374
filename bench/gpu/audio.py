#!/usr/bin/env python3
"""Gemma 3n's audio tower (the released E2B/E4B conformer, random weights) on metalkv beside
transformers, in one run: the encode time of a 30 s clip (log-mel frames to the 188 soft
tokens, the embedder included) and how close the two outputs are (issue 38's target: at
least 0.5x transformers).

    python bench/gpu/audio.py --json FILE          # the GPU run (tools/cuda_run.sh bench-audio)
    python bench/gpu/audio.py --shape tiny --device host

1. Builds a transformers Gemma3nForConditionalGeneration whose audio_config is the released
   checkpoints' (12 conformer layers, hidden 1536, 8 heads of 192, a window of 12 keys back,
   the two stride-2 convolutions of 128 and 32 channels, 128 mel bins, one row in 4 kept;
   text hidden 2048) beside a one-layer text model with a small vocabulary (the embedder's
   ids moved down with it), random bf16 weights; the vision tower is left out (timm).
2. The clip: a 30 s tone through metalkv's log-mel features (2,997 frames).
3. metalkv: Gemma3nAudio (cpp/towers/conformer.h) over bf16 weights, activations float32;
   transformers: the same checkpoint in bfloat16 on the same device (get_audio_features).
   Each: a warm-up, then the median of --repeat encodes.
4. Agreement: the relative error of metalkv's soft tokens against transformers computing in
   float32, and the bf16 run's own error against the same reference.
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import device_name, log, median_seconds, report, table, tower_args  # noqa: E402

SHAPES = {  # Gemma3nAudioConfig's defaults are the released tower's
    "e4b": dict(audio={}, text_hidden=2048, seconds=30.0),
    "tiny": dict(audio=dict(hidden_size=64, input_feat_size=16, conf_num_hidden_layers=2, conf_num_attention_heads=4,
                            sscp_conv_channel_size=[8, 4]), text_hidden=64, seconds=1.0),
}


def parse_args(argv=None):
    return tower_args(__doc__.split("\n\n")[0], SHAPES, argv)


def no_vision_tower():
    """transformers builds Gemma 3n's vision tower with timm; the audio bench needs none."""
    import torch
    from transformers import AutoModel
    real = AutoModel.from_config

    def build(*args, **kwargs):  # (transformers 5.17 passes config=, 5.24 the config first)
        c = args[0] if args else kwargs["config"]
        return torch.nn.Identity() if c.model_type in ("gemma3n_vision", "timm_wrapper") else real(*args, **kwargs)

    return mock.patch.object(AutoModel, "from_config", side_effect=build)


def build(shape: dict, dtype, out: Path) -> Path:
    import torch
    from transformers import Gemma3nConfig, Gemma3nForConditionalGeneration
    torch.manual_seed(0)
    vocab = 1024  # the vision embedder's 128 ids, then the audio embedder's, end it
    text = dict(vocab_size=vocab, vocab_size_per_layer_input=vocab - 256, hidden_size=shape["text_hidden"],
                intermediate_size=[256], num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                head_dim=64, layer_types=["full_attention"], num_kv_shared_layers=0,
                activation_sparsity_pattern=[0.0], hidden_size_per_layer_input=16, laurel_rank=8)
    cfg = Gemma3nConfig(text_config=text, audio_config=dict(shape["audio"], vocab_offset=vocab - 128),
                        vision_config=dict(vocab_offset=vocab - 256), eoi_token_id=vocab - 256,
                        image_token_id=vocab - 255, eoa_token_id=vocab - 128, audio_token_id=vocab - 127,
                        boi_token_id=10, boa_token_id=11)
    with no_vision_tower():
        model = Gemma3nForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "language_model" in name:
                continue
            if name.endswith("per_dim_scale"):
                p.copy_(0.1 * torch.randn_like(p))
            elif p.ndim == 1:
                p.copy_(1.0 + 0.05 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p[0].numel() ** 0.5)
    model.to(dtype).save_pretrained(out, safe_serialization=True)
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    from transformers import Gemma3nForConditionalGeneration

    import metalkv
    from metalkv.media import AudioFeatureConfig, log_mel_features
    from metalkv.models.audio import Gemma3nAudio

    shape = SHAPES[args.shape]
    big = args.shape != "tiny"
    torch_dev = "cuda" if args.device == "cuda" else "cpu"
    n_mels = shape["audio"].get("input_feat_size", 128)
    rate = 16_000
    t = np.arange(int(shape["seconds"] * rate)) / rate
    samples = (0.5 * np.sin(2 * np.pi * 440 * t + 3 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    feats = log_mel_features(samples, AudioFeatureConfig.from_preprocessor_config({"feature_size": n_mels}))
    f, n_valid = feats.features, int(feats.mask.sum())
    with tempfile.TemporaryDirectory() as tmp:
        dtype = torch.bfloat16 if big else torch.float32
        path = build(shape, dtype, Path(tmp))
        config = json.loads((path / "config.json").read_text())
        dev = metalkv.Device(args.device)
        log(f"loading metalkv's tower on {args.device}")
        tower = Gemma3nAudio.load(dev, path, config)
        n_tokens = tower.tokens_for(len(f))
        ours = tower.encode(f, n_valid, n_tokens)
        t_ours = median_seconds(lambda: tower.encode(f, n_valid, n_tokens), args.repeat, lambda: None)

        with no_vision_tower():
            model = Gemma3nForConditionalGeneration.from_pretrained(path, dtype=dtype)
        model = model.to(torch_dev).eval()
        x = torch.from_numpy(f)[None].to(torch_dev, dtype)
        pad = ~torch.from_numpy(feats.mask)[None].to(torch_dev)
        sync = torch.cuda.synchronize if torch_dev == "cuda" else (lambda: None)

        def hf(m=model, xx=x):
            with torch.no_grad():
                out = m.model.get_audio_features(xx, pad)
                return out.pooler_output if hasattr(out, "pooler_output") else out[0]

        t_hf = median_seconds(hf, args.repeat, sync)
        theirs = hf().float().cpu().numpy()[0]
        result = {"device": device_name(args.device), "shape": args.shape, "seconds": shape["seconds"],
                  "frames": len(f), "soft_tokens": n_tokens, "metalkv_s": t_ours, "transformers_s": t_hf,
                  "speed_vs_transformers": t_hf / t_ours, "transformers_dtype": str(dtype).removeprefix("torch."),
                  "weights_bytes": tower.weights_nbytes, "date": time.strftime("%Y-%m-%d")}
        if not args.no_check:
            ref = model.float()
            want = hf(ref, x.float()).float().cpu().numpy()[0]
            scale = float(np.abs(want).max())
            result["metalkv_max_err_vs_f32"] = float(np.abs(ours - want).max() / scale)
            result["transformers_max_err_vs_f32"] = float(np.abs(theirs - want).max() / scale)
    print(table(["", "encode s", "clip s / s"],
                [["metalkv", f"{t_ours:.4f}", f"{shape['seconds'] / t_ours:.0f}"],
                 [f"transformers ({result['transformers_dtype']})", f"{t_hf:.4f}", f"{shape['seconds'] / t_hf:.0f}"]]))
    report(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
