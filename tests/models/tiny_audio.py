"""Tiny random Gemma3nForConditionalGeneration checkpoints with an audio tower, built
offline by transformers: the conformer, its embedder and a small Gemma 3n text model,
saved as safetensors with the config.json the loaders read.

The vision tower is an empty module unless `vision` gives its config (tiny_vision3n builds
the real MobileNet-V5 that way, with timm imported through timm_import); the calls here
pass no pixels, so transformers' own code runs everything else.

Weights are drawn with a seed at scales that keep every layer's output O(1) and rounded
to values exact in float16. Ids: text below 224 (the per-layer table holds 200), the
vision vocabulary 224..239, the audio vocabulary 240..255 (<end_of_audio> 240, the audio
soft token 241, the padding token 255).
"""
from __future__ import annotations

import pathlib
from unittest import mock

import numpy as np

from .tiny_vlm import save  # noqa: F401  (the same save_pretrained)

AUDIO = {
    # head_dim 16, a window of 4 keys back: the conformer's shape at a small width
    "tiny": dict(hidden_size=64, input_feat_size=16, conf_num_hidden_layers=2, conf_num_attention_heads=4,
                 conf_attention_chunk_size=4, conf_attention_context_left=5, conf_attention_context_right=0,
                 sscp_conv_channel_size=[8, 4], conf_conv_kernel_size=5, conf_reduction_factor=4),
    # keys ahead of the query too, 3 layers, head_dim 48 (two values a lane)
    "ahead": dict(hidden_size=96, input_feat_size=20, conf_num_hidden_layers=3, conf_num_attention_heads=2,
                  conf_attention_chunk_size=6, conf_attention_context_left=4, conf_attention_context_right=2,
                  sscp_conv_channel_size=[6, 8], conf_conv_kernel_size=3, conf_reduction_factor=2),
}
VOCAB, VISION_OFFSET, AUDIO_OFFSET, MM_VOCAB = 256, 224, 240, 16
EOA, AUDIO_TOKEN, BOA = 240, 241, 198
# where the ids are: the text model's vocabulary ends with the vision then the audio embedder's
LAYOUT = dict(vocab=VOCAB, vision_offset=VISION_OFFSET, audio_offset=AUDIO_OFFSET, boi=197, eoi=VISION_OFFSET,
              image=VISION_OFFSET + 1, boa=BOA, eoa=EOA, audio=AUDIO_TOKEN)
TOKENS_PER_CLIP = 12
LAYER_SCALE = (0.5, 0.15)  # (mean, std) of a vision block's layer-scale gammas
_S, _F = "sliding_attention", "full_attention"
TEXT = dict(vocab_size=VOCAB, vocab_size_per_layer_input=200, hidden_size=64, intermediate_size=128,
            num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
            layer_types=[_S, _F] * 2, num_kv_shared_layers=2, activation_sparsity_pattern=[0.95] + [0.0] * 3,
            rms_norm_eps=1e-6, sliding_window=8, altup_num_inputs=4, hidden_size_per_layer_input=16,
            laurel_rank=8, max_position_embeddings=512,
            rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})


def config(audio: str = "tiny", layout: dict = LAYOUT, vision: dict | None = None, vision_tokens: int = 16):
    """`vision`: Gemma3nVisionConfig fields of a real tower, `vision_tokens` its soft tokens an image."""
    from transformers import Gemma3nConfig
    ids = layout
    return Gemma3nConfig(
        text_config=dict(TEXT, vocab_size=ids["vocab"], vocab_size_per_layer_input=min(200, ids["vision_offset"])),
        audio_config=dict(AUDIO[audio], vocab_size=MM_VOCAB, vocab_offset=ids["audio_offset"]),
        vision_config=dict(vision or dict(hidden_size=16), vocab_size=MM_VOCAB, vocab_offset=ids["vision_offset"]),
        audio_soft_tokens_per_image=TOKENS_PER_CLIP, vision_soft_tokens_per_image=vision_tokens,
        boi_token_id=ids["boi"], eoi_token_id=ids["eoi"], image_token_id=ids["image"], boa_token_id=ids["boa"],
        eoa_token_id=ids["eoa"], audio_token_id=ids["audio"])


def build(audio: str = "tiny", seed: int = 0, layout: dict = LAYOUT, vision: dict | None = None,
          vision_tokens: int = 16):
    """The model in float32, eager attention, weights at test scales, f16-exact. With `vision`
    (see config) transformers builds the vision tower itself: timm must be importable by then."""
    import torch
    from transformers import AutoModel, Gemma3nForConditionalGeneration
    from engine.tiny_hf import _gemma3n_std  # tests/ is on sys.path

    real = AutoModel.from_config

    def no_vision(*args, **kwargs):  # (transformers 5.17 passes config=, 5.24 the config first)
        cfg = args[0] if args else kwargs["config"]
        stub = vision is None and cfg.model_type in ("gemma3n_vision", "timm_wrapper")
        return torch.nn.Identity() if stub else real(*args, **kwargs)

    torch.manual_seed(seed)
    with mock.patch.object(AutoModel, "from_config", side_effect=no_vision):
        model = Gemma3nForConditionalGeneration(config(audio, layout, vision, vision_tokens)).eval().float()
    model.config._attn_implementation = "eager"
    text_cfg = model.config.text_config
    with torch.no_grad():
        for name, p in model.named_parameters():
            special = _gemma3n_std(name, text_cfg) if "language_model" in name else None
            if special is not None:
                p.copy_(special[0] + special[1] * torch.randn_like(p))
            elif name.endswith("per_dim_scale"):
                p.copy_(0.1 * torch.randn_like(p))
            elif name.endswith("layer_scale.gamma"):  # MobileNet-V5's (tiny_vision3n says why not timm's 1e-5)
                p.copy_(LAYER_SCALE[0] + LAYER_SCALE[1] * torch.randn_like(p))
            elif name.endswith(".bias"):  # (MobileNet-V5's stem; the audio and text models have none)
                p.copy_(0.1 * torch.randn_like(p))
            elif p.ndim == 1:  # Gemma 3n's norms take x * w
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif "embedding.weight" in name or "embed_tokens" in name:
                p.copy_(torch.randn_like(p) * (0.1 if "language_model" in name else 1.0))
            else:
                p.copy_(torch.randn_like(p) / p[0].numel() ** 0.5)
            p.copy_(p.half().float())
    return model


def features(n_frames: int, n_mels: int, seed: int = 0) -> np.ndarray:
    """Log-mel-like frames: O(1) values with a slow drift over time."""
    rng = np.random.default_rng(seed)
    drift = np.linspace(-1, 1, n_frames)[:, None]
    return (rng.normal(size=(n_frames, n_mels)) + drift).astype(np.float32)


def audio_features(model, feats: np.ndarray, n_valid: int) -> np.ndarray:
    """transformers' soft tokens of one clip, padded to its run as Gemma3nModel pads them:
    (TOKENS_PER_CLIP, text hidden) float32."""
    import torch
    mask = torch.arange(len(feats))[None] < n_valid
    with torch.no_grad():
        out = model.model.get_audio_features(torch.from_numpy(feats)[None], ~mask)
        rows, pad_mask = (out.pooler_output, out.audio_mel_mask) if hasattr(out, "pooler_output") else out
        pad = model.model.embed_audio(input_ids=torch.tensor([[model.config.text_config.vocab_size - 1]]))
        rows = torch.where(pad_mask.unsqueeze(-1), pad, rows)
        rows = torch.cat([rows, pad.expand(1, TOKENS_PER_CLIP - rows.shape[1], -1)], dim=1)
    return rows[0].float().numpy()


def logits(model, ids: list[int], feats: np.ndarray | None = None, n_valid: int = 0) -> np.ndarray:
    """transformers' logits at every position of ids (with one clip's features where the ids
    hold its run)."""
    import torch
    kw = {}
    if feats is not None:
        kw = dict(input_features=torch.from_numpy(feats)[None],
                  input_features_mask=torch.arange(len(feats))[None] < n_valid)
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), **kw).logits[0].float().numpy()


def save_chat(d: pathlib.Path, audio: str = "tiny", seed: int = 0, vision: dict | None = None,
              vision_tokens: int = 16):
    """A checkpoint Engine.chat takes: the model with a tiny Gemma-style tokenizer (tests/media/
    test_prompt.py's) whose ids end, as Gemma 3n's do, with the vision embedder's 16 tokens
    (<end_of_image>, <image_soft_token>, unused) then the audio embedder's (<end_of_audio>,
    <audio_soft_token>, unused), its chat template, and a preprocessor config of the tower's
    mel bins (`vision`, `vision_tokens`: build's). Returns (model, d, layout)."""
    import json
    from tokenizers import AddedToken
    from media.test_prompt import SPECIALS, gemma_template  # tests/ is on sys.path
    from models.chat_checkpoints import Family, build_tokenizer
    d.mkdir(parents=True, exist_ok=True)
    late = ("<end_of_image>", "<image_soft_token>", "<end_of_audio>", "<audio_soft_token>")
    template = gemma_template("<image_soft_token>", "<audio_soft_token>")
    tok = build_tokenizer(Family("gemma3n", {}, "gemma", tuple(t for t in SPECIALS if t not in late), "<bos>",
                                 "<eos>", template, "GemmaTokenizer"))
    n = tok.get_vocab_size(with_added_tokens=True)
    tail = [*late[:2], *(f"<vision_unused_{k}>" for k in range(MM_VOCAB - 2)),
            *late[2:], *(f"<audio_unused_{k}>" for k in range(MM_VOCAB - 2))]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in tail])
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GemmaTokenizer", "bos_token": "<bos>", "eos_token": "<eos>", "chat_template": template}))
    v = tok.get_vocab(with_added_tokens=True)
    assert v["<end_of_image>"] == n and v["<audio_unused_13>"] == n + 2 * MM_VOCAB - 1
    layout = dict(vocab=n + 2 * MM_VOCAB, vision_offset=n, audio_offset=n + MM_VOCAB, boi=v["<start_of_image>"],
                  eoi=v["<end_of_image>"], image=v["<image_soft_token>"], boa=v["<start_of_audio>"],
                  eoa=v["<end_of_audio>"], audio=v["<audio_soft_token>"])
    model = build(audio, seed, layout, vision, vision_tokens)
    save(model, d)
    (d / "preprocessor_config.json").write_text(json.dumps({
        "feature_extractor_type": "Gemma3nAudioFeatureExtractor", "feature_size": AUDIO[audio]["input_feat_size"],
        "sampling_rate": 16_000}))
    return model, d, layout


def tone(seconds: float, hz: float = 440.0, rate: int = 16_000) -> np.ndarray:
    """A clip: a tone with a slow vibrato and a little noise, float32 in [-1, 1)."""
    t = np.arange(int(seconds * rate)) / rate
    x = 0.5 * np.sin(2 * np.pi * hz * t + 3 * np.sin(2 * np.pi * 3 * t))
    return (x + 0.01 * np.random.default_rng(0).normal(size=len(t))).astype(np.float32)


def wav_bytes(samples: np.ndarray, rate: int = 16_000) -> bytes:
    """16-bit PCM mono wav."""
    import io
    import wave
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(samples, -1, 1 - 2 ** -15) * 32768).astype("<i2").tobytes())
    return buf.getvalue()
