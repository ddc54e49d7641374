"""llama.cpp's mmproj files (GGUF) for Gemma 3's vision tower, as convert_hf_to_gguf.py
writes them, read into metalkv's Siglip (models/vision.py, cpp/towers/siglip.h).

    vision, image_config, tokens = load_mmproj(device, "mmproj-model-f16.gguf")

What the converter changed, and how the loader reads it:
- mm.soft_emb_norm holds Gemma's 1 + w: the tower reads the stored value (mm_norm_offset 0);
- mm.input_projection is stored (vision hidden, text hidden): transposed to (out, in);
- q, k and v come apart: stacked, each head padded as the safetensors loader pads them;
- the patch embedding is the convolution's (hidden, 3, p, p): flattened and padded.
Matrices f32, f16 or bf16 (the converter's default, f16, included); a quantized mmproj is
refused by name.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from .. import _core
from ..media import ImageConfig
from .errors import ModelLoadError
from .gguf_file import read_gguf
from .towers import core_weights
from .vision import OPERANDS_16BIT, Gemma3Vision, _f32, _kernel_head_dim, _pad_heads, _padded_patch

_FLOATS = ("f32", "f16", "bf16")
_LAYER = {"ln1.weight": "ln1.weight", "ln1.bias": "ln1.bias", "ln2.weight": "ln2.weight", "ln2.bias": "ln2.bias",
          "attn_out.bias": "attn_out.bias", "ffn_up.weight": "ffn_up.weight", "ffn_up.bias": "ffn_up.bias",
          "ffn_down.weight": "ffn_down.weight", "ffn_down.bias": "ffn_down.bias"}


def _refuse(path: str, why: str) -> ModelLoadError:
    return ModelLoadError(f"[mmproj] {path}: {why}")


def mmproj_spec(meta: dict[str, Any], path: str) -> tuple[dict, int]:
    """(the tower's spec, image size) of an mmproj file's metadata."""
    kind = meta.get("clip.vision.projector_type", meta.get("clip.projector_type"))
    if kind != "gemma3":
        raise _refuse(path, f"projector type {kind!r}: metalkv reads Gemma 3's mmproj files ('gemma3')")
    try:
        get = lambda key: meta[f"clip.vision.{key}"]  # noqa: E731
        hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
        patch, image = int(get("patch_size")), int(get("image_size"))
        grid, pool = image // patch, int(meta.get("clip.vision.projector.scale_factor", 4))
        if grid * patch != image or grid % pool:
            raise ValueError(f"image_size {image}, patch_size {patch}, scale_factor {pool} do not tile")
        head_dim = hidden // heads
        spec = dict(n_layers=int(get("block_count")), hidden=hidden, n_heads=heads,
                    head_dim=_kernel_head_dim(head_dim), ffn=int(get("feed_forward_length")),
                    channels=3, patch=patch, patch_dim=_padded_patch(3 * patch * patch), grid=grid, pool=pool,
                    text_hidden=int(get("projection_dim")), eps=float(get("attention.layer_norm_epsilon")),
                    mm_eps=1e-6, mm_norm_offset=0.0, scale=head_dim ** -0.5)
    except (KeyError, TypeError, ValueError) as e:
        raise _refuse(path, f"the vision metadata cannot be read: {e}") from None
    return spec, image


def load_mmproj(device, path: str | os.PathLike, *,
                operands_16bit: bool = OPERANDS_16BIT) -> tuple[Gemma3Vision, ImageConfig, int]:
    """Gemma 3's tower from an mmproj file, its preprocessing (image size, mean and std from
    the file, Gemma3ImageProcessor's defaults for the rest), and its tokens per image.
    operands_16bit: as Gemma3Vision.load's."""
    path = os.fspath(path)
    f = read_gguf(path)
    spec, image = mmproj_spec(f.metadata, path)
    spec["operands_16bit"] = bool(operands_16bit)
    tensors = {t.name: t for t in f.tensors}
    heads, D, P = spec["n_heads"], spec["hidden"] // spec["n_heads"], spec["head_dim"]

    def take(name: str) -> tuple[str, np.ndarray]:
        t = tensors.get(name)
        if t is None:
            raise _refuse(path, f"missing tensor {name}")
        if t.ggml_type not in _FLOATS:
            raise _refuse(path, f"tensor {name} is {t.ggml_type}; metalkv reads an mmproj of f32, f16 or bf16 "
                                "(llama.cpp's convert_hf_to_gguf.py writes f16 by default)")
        a = f.tensor_array(t)
        return ("f32", a) if t.ggml_type == "f32" else (t.ggml_type, a)

    def f32(name: str) -> tuple[str, np.ndarray]:
        return "f32", _f32(*take(name))

    out: dict[str, tuple[str, np.ndarray]] = {}
    dt, w = take("v.patch_embd.weight")
    w = w.reshape(w.shape[0], -1)
    out["v.patch_embd.weight"] = (dt, np.pad(w, ((0, 0), (0, spec["patch_dim"] - w.shape[1]))))
    out["v.patch_embd.bias"] = f32("v.patch_embd.bias")
    out["v.position_embd.weight"] = f32("v.position_embd.weight")
    for i in range(spec["n_layers"]):
        p = f"v.blk.{i}."
        for src, canon in _LAYER.items():
            out[p + canon] = f32(p + src) if src.endswith("bias") or src.startswith("ln") else take(p + src)
        dt, o = take(p + "attn_out.weight")
        out[p + "attn_out.weight"] = (dt, _pad_heads(o, heads, D, P, axis=1))
        parts = [take(p + f"attn_{x}.weight") for x in "qkv"]
        if len({d for d, _ in parts}) != 1:
            raise _refuse(path, f"{p}attn_q/k/v have different types")
        out[p + "attn_qkv.weight"] = (parts[0][0], np.concatenate([_pad_heads(a, heads, D, P, axis=0)
                                                                   for _, a in parts]))
        out[p + "attn_qkv.bias"] = ("f32", np.concatenate([_pad_heads(f32(p + f"attn_{x}.bias")[1], heads, D, P, 0)
                                                           for x in "qkv"]))
    out["v.post_ln.weight"] = f32("v.post_ln.weight")
    out["v.post_ln.bias"] = f32("v.post_ln.bias")
    out["mm.soft_emb_norm.weight"] = f32("mm.soft_emb_norm.weight")
    dt, proj = take("mm.input_projection.weight")
    out["mm.input_projection.weight"] = (dt, np.ascontiguousarray(proj.T))
    try:
        core = _core.Siglip(device, spec, core_weights(device, out))
    except _core.GpuError as e:
        raise _refuse(path, str(e)) from None
    mean = f.metadata.get("clip.vision.image_mean", [0.5] * 3)
    std = f.metadata.get("clip.vision.image_std", [0.5] * 3)
    config = ImageConfig.from_preprocessor_config({"size": {"height": image, "width": image},
                                                   "image_mean": list(mean), "image_std": list(std)}, "gemma3")
    vision = Gemma3Vision(core, image)
    return vision, config, vision.tokens_per_image
