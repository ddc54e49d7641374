"""Gemma 3's vision tower (SigLIP) and multimodal projector: read from a
Gemma3ForConditionalGeneration checkpoint's safetensors, put on the device as
metalkv._core.Siglip (cpp/towers/siglip.h), and run on prepared images.

    tower = Gemma3Vision.load(device, model_dir, config)     # None: a text-only checkpoint
    tower.encode(pixel_values)    # (n, 3, S, S) float32 -> (n, tokens_per_image, text_hidden)

The loader writes the tower's canonical names (siglip.h) and fits two things to the
kernels: a head_dim they lack (SigLIP-so400m's 72) is padded to the next they take with
zero rows of q/k/v and zero columns of the output projection, which changes no product;
mm_input_projection_weight, stored (vision hidden, text hidden), is transposed to the
(out, in) every matmul reads.
"""
from __future__ import annotations

import pathlib
import re
from typing import Any, Mapping

import numpy as np

from .. import _core
from .errors import ModelLoadError
from .safetensors_loader import read_safetensors
from .towers import ImageTower, core_weights

# Released checkpoints name the tower vision_tower.vision_model.*, transformers 5 saves
# vision_tower.*, and either may sit under model.: all read as vision_tower.*.
_PREFIX = re.compile(r"^(?:model\.)?(vision_tower\.)(?:vision_model\.)?")
_EMB = "vision_tower.embeddings."
# per layer: HF suffix -> canonical suffix (q/k/v are stacked into attn_qkv apart)
_LAYER_NAMES = {"layer_norm1.weight": "ln1.weight", "layer_norm1.bias": "ln1.bias",
                "layer_norm2.weight": "ln2.weight", "layer_norm2.bias": "ln2.bias",
                "self_attn.out_proj.weight": "attn_out.weight", "self_attn.out_proj.bias": "attn_out.bias",
                "mlp.fc1.weight": "ffn_up.weight", "mlp.fc1.bias": "ffn_up.bias",
                "mlp.fc2.weight": "ffn_down.weight", "mlp.fc2.bias": "ffn_down.bias"}


def _f32(dtype: str, a: np.ndarray) -> np.ndarray:
    """A tensor's values as float32 (bf16 arrives as its uint16 bit patterns)."""
    if dtype == "bf16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return np.asarray(a, np.float32)


def _kernel_head_dim(head_dim: int) -> int:
    """The smallest head_dim the attention kernels take that holds head_dim."""
    fits = [d for d in _core.ops.attention_head_dims() if d >= head_dim]
    if not fits:
        raise ModelLoadError(f"[vision] head_dim {head_dim} is larger than any the attention kernels take")
    return min(fits)


def _pad_heads(a: np.ndarray, heads: int, head_dim: int, padded: int, axis: int) -> np.ndarray:
    """a with its `axis` of heads * head_dim widened to heads * padded, the new entries zero."""
    shape = list(a.shape)
    split = shape[:axis] + [heads, head_dim] + shape[axis + 1:]
    widths = [(0, 0)] * len(split)
    widths[axis + 1] = (0, padded - head_dim)
    out = np.pad(a.reshape(split), widths)
    return out.reshape(shape[:axis] + [heads * padded] + shape[axis + 1:])


def _padded_patch(n: int) -> int:
    """A patch's values rounded up to the 4 a matmul row reads at a time (zeros added)."""
    return -(-n // 4) * 4


# Gemma 3's tower's products on matrix units: 16-bit operands (the gemms' activations in the
# weights' 16-bit type, attention's Q and P in half; SiglipSpec::operands_16bit). On an H200
# this runs SigLIP-so400m's tower 2.35x faster than float operands, and its output is 5x
# closer to float32 transformers than transformers' own bf16 run (docs/MULTIMODAL.md).
# Devices without matrix units (the host) compute in float either way.
OPERANDS_16BIT = True


def siglip_spec(config: Mapping[str, Any]) -> dict:
    """The tower's sizes (_core.Siglip's spec) from a Gemma 3 config.json."""
    v, text = config.get("vision_config") or {}, config.get("text_config") or {}
    try:
        hidden, heads = int(v["hidden_size"]), int(v["num_attention_heads"])
        patch, image, channels = int(v["patch_size"]), int(v["image_size"]), int(v.get("num_channels", 3))
        grid = image // patch
        tokens = int(config.get("mm_tokens_per_image", 256))
        side = int(round(tokens ** 0.5))
        if side * side != tokens or grid % side:
            raise ValueError(f"mm_tokens_per_image {tokens} is not a square whose side divides the grid {grid}")
        head_dim = hidden // heads
        return dict(n_layers=int(v["num_hidden_layers"]), hidden=hidden, n_heads=heads,
                    head_dim=_kernel_head_dim(head_dim), ffn=int(v["intermediate_size"]),
                    channels=channels, patch=patch, patch_dim=_padded_patch(channels * patch * patch), grid=grid,
                    pool=grid // side,
                    text_hidden=int(text["hidden_size"]), eps=float(v.get("layer_norm_eps", 1e-6)),
                    mm_eps=float(v.get("layer_norm_eps", 1e-6)), scale=head_dim ** -0.5)
    except (KeyError, TypeError, ValueError) as e:
        raise ModelLoadError(f"[vision] the checkpoint's vision_config cannot be read: {e}") from None


def siglip_tensors(files, spec: dict, true_head_dim: int) -> dict[str, tuple[str, np.ndarray]]:
    """{canonical name: (dtype, array)} of the tower and projector in `files` (safetensors paths)."""
    raw: dict[str, tuple[str, np.ndarray]] = {}
    for f in files:
        for name, t in read_safetensors(f).items():
            name = _PREFIX.sub(r"\1", name).removeprefix("model.")
            if name.startswith(("vision_tower.", "multi_modal_projector.")):
                raw[name] = t
    if not raw:
        raise ModelLoadError("[vision] the checkpoint has no vision_tower tensors")
    heads, D, P = spec["n_heads"], true_head_dim, spec["head_dim"]

    def take(name: str) -> tuple[str, np.ndarray]:
        if name not in raw:
            raise ModelLoadError(f"[vision] missing tensor {name}")
        return raw[name]

    def f32(name: str) -> tuple[str, np.ndarray]:
        return "f32", _f32(*take(name))

    out: dict[str, tuple[str, np.ndarray]] = {}
    dt, w = take(_EMB + "patch_embedding.weight")
    w = w.reshape(w.shape[0], -1)
    out["v.patch_embd.weight"] = (dt, np.pad(w, ((0, 0), (0, spec["patch_dim"] - w.shape[1]))))
    out["v.patch_embd.bias"] = f32(_EMB + "patch_embedding.bias")
    out["v.position_embd.weight"] = f32(_EMB + "position_embedding.weight")
    for i in range(spec["n_layers"]):
        hf = f"vision_tower.encoder.layers.{i}."
        for suffix, canon in _LAYER_NAMES.items():
            dt, a = take(hf + suffix)
            if suffix.endswith("bias") or "layer_norm" in suffix:
                dt, a = "f32", _f32(dt, a)
            if suffix == "self_attn.out_proj.weight":
                a = _pad_heads(a, heads, D, P, axis=1)
            out[f"v.blk.{i}.{canon}"] = (dt, a)
        parts = [take(hf + f"self_attn.{x}_proj.weight") for x in "qkv"]
        if len({dt for dt, _ in parts}) != 1:
            raise ModelLoadError(f"[vision] {hf}self_attn q/k/v_proj have different dtypes")
        out[f"v.blk.{i}.attn_qkv.weight"] = (parts[0][0], np.concatenate(
            [_pad_heads(a, heads, D, P, axis=0) for _, a in parts]))
        out[f"v.blk.{i}.attn_qkv.bias"] = ("f32", np.concatenate(
            [_pad_heads(f32(hf + f"self_attn.{x}_proj.bias")[1], heads, D, P, axis=0) for x in "qkv"]))
    out["v.post_ln.weight"] = f32("vision_tower.post_layernorm.weight")
    out["v.post_ln.bias"] = f32("vision_tower.post_layernorm.bias")
    out["mm.soft_emb_norm.weight"] = f32("multi_modal_projector.mm_soft_emb_norm.weight")
    dt, proj = take("multi_modal_projector.mm_input_projection_weight")
    out["mm.input_projection.weight"] = (dt, np.ascontiguousarray(proj.T))
    return out


class Gemma3Vision(ImageTower):
    """Gemma 3's SigLIP tower and projector on a device."""

    bidirectional = True  # an image's tokens attend to each other both ways (Gemma 3's mask)

    def __init__(self, core: "_core.Siglip", image_size: int):
        self._core = core  # it cuts the patches itself (SiglipSpec's patch)
        self.image_size = image_size

    @classmethod
    def load(cls, device, path: str | pathlib.Path, config: Mapping[str, Any], *,
             operands_16bit: bool = OPERANDS_16BIT) -> "Gemma3Vision | None":
        """The tower of the checkpoint at `path` (a directory of safetensors) whose config.json
        is `config`; None when the config has no vision_config (a text-only Gemma 3).
        operands_16bit: on matrix units, the layers' gemms take their activations in the
        weights' 16-bit type and attention its Q and P in half (SiglipSpec::operands_16bit);
        elsewhere no change."""
        if config.get("model_type") != "gemma3" or not config.get("vision_config"):
            return None
        spec = siglip_spec(config) | {"operands_16bit": bool(operands_16bit)}
        v = config["vision_config"]
        true_head_dim = int(v["hidden_size"]) // int(v["num_attention_heads"])
        files = sorted(pathlib.Path(path).glob("*.safetensors"))
        try:
            core = _core.Siglip(device, spec, core_weights(device, siglip_tensors(files, spec, true_head_dim)))
        except _core.GpuError as e:
            raise ModelLoadError(f"{path}: {e}") from None
        return cls(core, int(v["image_size"]))

    def encode(self, pixel_values: np.ndarray) -> np.ndarray:
        """pixel_values (n, 3, S, S) float32, as preprocess_image makes them -> the images'
        soft tokens (n, tokens_per_image, text_hidden) float32."""
        pv = np.asarray(pixel_values, np.float32)
        if pv.ndim != 4 or pv.shape[2:] != (self.image_size, self.image_size):
            raise ValueError(f"[vision] pixel_values must be (n, 3, {self.image_size}, {self.image_size}), "
                             f"got {pv.shape}")
        return self._core.encode(np.ascontiguousarray(pv))
