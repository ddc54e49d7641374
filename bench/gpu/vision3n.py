#!/usr/bin/env python3
"""Gemma 3n's vision tower (MobileNet-V5-300M at 768 x 768, random weights) on metalkv beside
transformers, in one run: the encode time of one image (pixels to the 256 soft tokens, the
embedder included) and how close the two outputs are (issue 38's target: at least 0.5x
transformers).

    python bench/gpu/vision3n.py --json FILE          # the GPU run (tools/cuda_run.sh bench-vision3n)
    python bench/gpu/vision3n.py --shape tiny --device host

1. transformers' own pieces of Gemma3nModel.get_image_features: the vision tower as
   AutoModel.from_config(Gemma3nVisionConfig()) builds it (TimmWrapperModel over timm's
   mobilenetv5_300m_enc; timm imported as tests/models/tiny_vision3n.timm_tower does) and a
   Gemma3nMultimodalEmbedder to a text hidden of 2048; random bf16 weights, layer scales
   drawn near 0.2 (timm's 1e-5 would leave every residual block a near-identity).
2. metalkv: Gemma3nVision (cpp/towers/mobilenet.h) over the same bf16 weights, activations
   float32; transformers: the same modules in bfloat16 on the same device, with SDPA.
   Each: a warm-up, then the median of --repeat encodes of one image.
3. Agreement: the relative error of metalkv's soft tokens against transformers computing in
   float32, and the bf16 run's own error against the same reference.
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "gpu"))
sys.path.insert(0, str(ROOT / "tests"))
from common import device_name, log, median_seconds, report, table, tower_args  # noqa: E402

SHAPES = {
    "e4b": dict(image=768, model_args={}, text_hidden=2048),
    "tiny": dict(image=96, model_args={"channel_multiplier": 0.0625, "msfa_output_resolution": 3}, text_hidden=64),
}


def parse_args(argv=None):
    return tower_args(__doc__.split("\n\n")[0], SHAPES, argv)


def build(shape: dict):
    """(tower, embedder, the vision config as config.json holds it): transformers' modules, float32."""
    import torch
    from models.tiny_vision3n import timm_tower
    from transformers import AutoModel, Gemma3nTextConfig, Gemma3nVisionConfig
    from transformers.models.gemma3n.modeling_gemma3n import Gemma3nMultimodalEmbedder
    torch.manual_seed(0)
    vcfg = Gemma3nVisionConfig(model_args=shape["model_args"] or None)
    with timm_tower():
        tower = AutoModel.from_config(vcfg).eval()
    embedder = Gemma3nMultimodalEmbedder(vcfg, Gemma3nTextConfig(hidden_size=shape["text_hidden"])).eval()
    with torch.no_grad():
        for name, p in [*tower.named_parameters(), *embedder.named_parameters()]:
            if name.endswith("gamma"):
                p.copy_(0.1 + 0.2 * torch.rand_like(p))
            elif p.ndim == 1 and name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            elif p.ndim == 1:
                p.copy_(1.0 + 0.05 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p[0].numel() ** 0.5)
            p.copy_(p.bfloat16().float())  # the values the bf16 checkpoint holds, for the float32 reference
    return tower, embedder, vcfg.to_dict()


def save(tower, embedder, vision_config: dict, shape: dict, out: Path) -> Path:
    """A checkpoint directory Gemma3nVision.load reads: bf16 safetensors under Gemma3nModel's names."""
    import torch
    from safetensors.torch import save_file
    tensors = {f"model.vision_tower.{k}": v for k, v in tower.state_dict().items()}
    tensors.update({f"model.embed_vision.{k}": v for k, v in embedder.state_dict().items()})
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    r = shape["model_args"].get("msfa_output_resolution", 16)
    (out / "config.json").write_text(json.dumps({
        "model_type": "gemma3n", "vision_config": vision_config, "vision_soft_tokens_per_image": r * r,
        "text_config": {"hidden_size": shape["text_hidden"]}}))
    (out / "preprocessor_config.json").write_text(json.dumps({"size": {"height": shape["image"],
                                                                       "width": shape["image"]}}))
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    import metalkv
    from metalkv.models.vision3n import Gemma3nVision

    shape = SHAPES[args.shape]
    torch_dev = "cuda" if args.device == "cuda" else "cpu"
    s = shape["image"]
    pixels = np.random.default_rng(0).random((1, 3, s, s), dtype=np.float32)  # Gemma 3n's [0, 1]
    tower, embedder, vision_config = build(shape)
    with tempfile.TemporaryDirectory() as tmp:
        path = save(tower, embedder, vision_config, shape, Path(tmp))
        config = json.loads((path / "config.json").read_text())
        log(f"loading metalkv's tower on {args.device}")
        ours_tower = Gemma3nVision.load(metalkv.Device(args.device), path, config)
    ours = ours_tower.encode(pixels)[0]
    t_ours = median_seconds(lambda: ours_tower.encode(pixels), args.repeat, lambda: None)

    sync = torch.cuda.synchronize if torch_dev == "cuda" else (lambda: None)
    hidden = vision_config["hidden_size"]

    def hf(dtype, t=tower, e=embedder):  # Gemma3nModel.get_image_features, step by step
        x = torch.from_numpy(pixels).to(torch_dev, dtype)
        with torch.no_grad():
            h = t(pixel_values=x, do_pooling=False).last_hidden_state
            h = h.reshape(1, hidden, -1).permute(0, 2, 1) * hidden ** 0.5
            return e(inputs_embeds=h)

    want = None
    if not args.no_check:
        tower.to(torch_dev, torch.float32)
        embedder.to(torch_dev, torch.float32)
        want = hf(torch.float32).float().cpu().numpy()[0]
    tower.to(torch_dev, torch.bfloat16)
    embedder.to(torch_dev, torch.bfloat16)
    t_hf = median_seconds(lambda: hf(torch.bfloat16), args.repeat, sync)
    theirs = hf(torch.bfloat16).float().cpu().numpy()[0]
    result = {"device": device_name(args.device), "shape": args.shape, "image": s,
              "soft_tokens": ours_tower.tokens_per_image, "metalkv_s": t_ours, "transformers_s": t_hf,
              "speed_vs_transformers": t_hf / t_ours, "transformers_dtype": "bfloat16",
              "weights_bytes": ours_tower.weights_nbytes, "date": time.strftime("%Y-%m-%d")}
    if want is not None:
        scale = float(np.abs(want).max())
        result["metalkv_max_err_vs_f32"] = float(np.abs(ours - want).max() / scale)
        result["transformers_max_err_vs_f32"] = float(np.abs(theirs - want).max() / scale)
    print(table(["", "encode s", "images / s"],
                [["metalkv", f"{t_ours:.4f}", f"{1 / t_ours:.1f}"],
                 ["transformers (bfloat16)", f"{t_hf:.4f}", f"{1 / t_hf:.1f}"]]))
    report(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
