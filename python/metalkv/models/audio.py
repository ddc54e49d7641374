"""Gemma 3n's audio tower (a conformer) and its embedder into the text model: read from a
Gemma3nForConditionalGeneration checkpoint's safetensors, put on the device as
metalkv._core.Conformer (cpp/towers/conformer.h), and run on a clip's log-mel features.

    tower = Gemma3nAudio.load(device, model_dir, config)    # None: no audio_config
    tower.encode(features, n_valid)    # (frames, 128) float32 -> (soft tokens, text_hidden)
    tower.hard_row(token_id)           # the embedder's row of a hard token (<end_of_audio>)

The loader writes the tower's canonical names (conformer.h) and fits one thing to the
kernels: the first convolution's 1 x 3 x 3 patch is padded with zero columns to the 4 a
matmul row reads at a time, and the depthwise convolution's (channels, 1, taps) is stored
(taps, channels), rows of a width the weights take.
"""
from __future__ import annotations

import pathlib
import re
from typing import Any, Mapping

import numpy as np

from .. import _core
from .errors import ModelLoadError
from .safetensors_loader import read_safetensors
from .towers import CoreTower, HardRows, core_weights
from .vision import _f32

_PREFIX = re.compile(r"^(?:model\.)?")
_TOWER = "audio_tower."
_SSCP = _TOWER + "subsample_conv_projection."
# per layer: canonical suffix -> HF suffix (q/k/v are stacked into attn.qkv apart)
_LAYER_NAMES = {
    **{f"ffn_{i}.{c}": f"{hf}.{s}" for i, hf in enumerate(("ffw_layer_start", "ffw_layer_end"))
       for c, s in (("norm", "pre_layer_norm.weight"), ("up", "ffw_layer_1.weight"), ("down", "ffw_layer_2.weight"),
                    ("post_norm", "post_layer_norm.weight"))},
    "attn.norm": "attention.pre_attn_norm.weight", "attn.per_dim_scale": "attention.attn.per_dim_scale",
    "attn.pos": "attention.attn.relative_position_embedding.pos_proj.weight", "attn.out": "attention.post.weight",
    "attn.post_norm": "attention.post_norm.weight", "conv.norm": "lconv1d.pre_layer_norm.weight",
    "conv.start": "lconv1d.linear_start.weight", "conv.taps": "lconv1d.depthwise_conv1d.weight",
    "conv.conv_norm": "lconv1d.conv_norm.weight", "conv.end": "lconv1d.linear_end.weight", "norm": "norm.weight",
}
_VECTORS = ("norm", "per_dim_scale", "taps")  # canonical suffixes held as f32
_CLIPPING_BINDS = 1e9  # transformers clamps activations at ±gradient_clipping; metalkv leaves the clamps out


def conformer_spec(config: Mapping[str, Any]) -> dict:
    """The tower's sizes (_core.Conformer's spec) from a Gemma 3n config.json."""
    a, text = config.get("audio_config") or {}, config.get("text_config") or {}
    try:
        hidden, heads = int(a["hidden_size"]), int(a["conf_num_attention_heads"])
        channels = [int(c) for c in a.get("sscp_conv_channel_size", [128, 32])]
        kernels = [[int(k) for k in ks] for ks in a.get("sscp_conv_kernel_size", [[3, 3], [3, 3]])]
        strides = [[int(s) for s in ss] for ss in a.get("sscp_conv_stride_size", [[2, 2], [2, 2]])]
        if len(channels) != 2 or len(kernels) != 2 or len(strides) != 2:
            raise ValueError("the subsampling has two convolutions")
        clipping = float(a.get("gradient_clipping", 1e10))
        if clipping < _CLIPPING_BINDS:
            raise ValueError(f"gradient_clipping {clipping:g} could bind; metalkv runs without the clamps")
        vocab, offset = int(a.get("vocab_size", 128)), int(a.get("vocab_offset", 262_272))
        if offset + vocab != int(text["vocab_size"]):
            raise ValueError(f"the audio vocabulary [{offset}, {offset + vocab}) must end the text model's "
                             f"{text['vocab_size']} ids: transformers pads a clip with the last")
        return dict(n_layers=int(a["conf_num_hidden_layers"]), hidden=hidden, n_heads=heads, ffn=4 * hidden,
                    n_mels=int(a.get("input_feat_size", 128)),
                    conv=[[channels[i], *kernels[i], *strides[i]] for i in range(2)],
                    left=max(0, int(a.get("conf_attention_context_left", 13)) - 1),
                    right=int(a.get("conf_attention_context_right", 0)),
                    taps=int(a.get("conf_conv_kernel_size", 5)), reduction=int(a.get("conf_reduction_factor", 4)),
                    vocab=vocab, text_hidden=int(text["hidden_size"]),
                    softcap=float(a.get("conf_attention_logit_cap", 50.0)),
                    residual_weight=float(a.get("conf_residual_weight", 0.5)),
                    eps=float(a.get("rms_norm_eps", 1e-6)), group_eps=float(a.get("sscp_conv_group_norm_eps", 1e-3)),
                    mm_eps=float(a.get("rms_norm_eps", 1e-6)))
    except (KeyError, TypeError, ValueError) as e:
        raise ModelLoadError(f"[audio] the checkpoint's audio_config cannot be read: {e}") from None


def conformer_tensors(files, spec: dict) -> dict[str, tuple[str, np.ndarray]]:
    """{canonical name: (dtype, array)} of the tower and its embedder in `files` (safetensors paths)."""
    raw: dict[str, tuple[str, np.ndarray]] = {}
    for f in files:
        for name, t in read_safetensors(f).items():
            name = _PREFIX.sub("", name)
            if name.startswith((_TOWER, "embed_audio.")):
                raw[name] = t
    if not raw:
        raise ModelLoadError("[audio] the checkpoint has no audio_tower tensors")

    def take(name: str) -> tuple[str, np.ndarray]:
        if name not in raw:
            raise ModelLoadError(f"[audio] missing tensor {name}")
        return raw[name]

    def f32(name: str) -> tuple[str, np.ndarray]:
        return "f32", _f32(*take(name))

    out: dict[str, tuple[str, np.ndarray]] = {}
    for i in range(2):
        dt, w = take(f"{_SSCP}conv_{i}.conv.weight")
        w = w.reshape(w.shape[0], -1)
        out[f"a.conv.{i}.weight"] = (dt, np.pad(w, ((0, 0), (0, -w.shape[1] % 4))))
        out[f"a.conv.{i}.norm"] = f32(f"{_SSCP}conv_{i}.norm.weight")
    out["a.input_proj.weight"] = take(_SSCP + "input_proj_linear.weight")
    for i in range(spec["n_layers"]):
        hf = f"{_TOWER}conformer.{i}."
        for canon, suffix in _LAYER_NAMES.items():
            dt, a = f32(hf + suffix) if canon.endswith(_VECTORS) else take(hf + suffix)
            out[f"a.blk.{i}.{canon}"] = (dt, np.ascontiguousarray(a.reshape(a.shape[0], -1).T) if canon.endswith("taps") else a)
        parts = [take(hf + f"attention.attn.{x}_proj.weight") for x in "qkv"]
        if len({dt for dt, _ in parts}) != 1:
            raise ModelLoadError(f"[audio] {hf}attention q/k/v_proj have different dtypes")
        out[f"a.blk.{i}.attn.qkv"] = (parts[0][0], np.concatenate([a for _, a in parts]))
    out["mm.embedding"] = take("embed_audio.embedding.weight")
    out["mm.hard_norm"] = f32("embed_audio.hard_embedding_norm.weight")
    out["mm.soft_norm"] = f32("embed_audio.soft_embedding_norm.weight")
    out["mm.projection"] = take("embed_audio.embedding_projection.weight")
    return out


class Gemma3nAudio(CoreTower, HardRows):
    """Gemma 3n's audio tower and embedder on a device."""

    def __init__(self, core: "_core.Conformer", n_mels: int, vocab_offset: int, tokens_per_clip: int):
        self._core = core
        self.n_mels = n_mels
        self.vocab_offset = vocab_offset          # the first id of the embedder's hard tokens
        self.tokens_per_clip = tokens_per_clip    # the placeholder run of a clip in the prompt
        self._hard = core.hard_rows()

    def tokens_for(self, n_frames: int) -> int:
        """Soft tokens the tower makes of n_frames frames (the rest of a run is padding)."""
        return self._core.tokens_for(n_frames)

    @classmethod
    def load(cls, device, path: str | pathlib.Path, config: Mapping[str, Any]) -> "Gemma3nAudio | None":
        """The audio tower of the checkpoint at `path` (a directory of safetensors) whose
        config.json is `config`; None when it has no audio_config."""
        if config.get("model_type") != "gemma3n" or not config.get("audio_config"):
            return None
        spec = conformer_spec(config)
        tensors = conformer_tensors(sorted(pathlib.Path(path).glob("*.safetensors")), spec)
        try:
            core = _core.Conformer(device, spec, core_weights(device, tensors))
        except _core.GpuError as e:
            raise ModelLoadError(f"{path}: {e}") from None
        return cls(core, spec["n_mels"], int(config["audio_config"].get("vocab_offset", 262_272)),
                   int(config.get("audio_soft_tokens_per_image", 188)))

    def encode(self, features: np.ndarray, n_valid: int, n_tokens: int | None = None) -> np.ndarray:
        """features (frames, n_mels) float32 (log_mel_features), the first n_valid the clip's ->
        its run's rows (n_tokens, default tokens_per_clip, text_hidden) float32."""
        f = np.ascontiguousarray(features, np.float32)
        if f.ndim != 2 or f.shape[1] != self.n_mels:
            raise ValueError(f"[audio] features must be (frames, {self.n_mels}), got {f.shape}")
        return self._core.encode(f, int(n_valid), self.tokens_per_clip if n_tokens is None else int(n_tokens))
