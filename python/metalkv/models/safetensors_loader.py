"""A Hugging Face model directory (config.json + *.safetensors) -> canonical Tensors.

The safetensors format is an 8-byte little-endian header length, a JSON header
{name: {dtype, shape, data_offsets}} and the raw data. We parse it ourselves
rather than through the safetensors package because its numpy view cannot hold
bf16, which is what most checkpoints are; this also lets every inconsistency be
reported with the tensor and file it concerns. bf16 matrices become f16 (the
kernels read f16, f32 and GGUF blocks, not bf16); f32 and f16 matrices stay as
they are; vectors (norms, biases) become f32. With quantize (Engine.load), bf16
matrices that will be quantized stay bf16, quantized from their exact values.
"""
from __future__ import annotations

import json
import math
import os
import pathlib
import re
from typing import Any

import numpy as np

from .architectures import ARCHITECTURES
from .config import ModelConfig
from .errors import ModelLoadError
from .hf_config import config_from_hf
from .finite import check_finite
from .progress import progress_bar
from .tensor import Tensor, bf16_to_f32, check_tensors, drop_reader_kv, kept_f32, quantizable, split_fused
from .values import describe

_DTYPES = {"F32": (np.float32, 4), "F16": (np.float16, 2), "BF16": (np.uint16, 2)}
# What a saved KV cache also holds (metalkv/cache_file.py): quantized rows as bytes.
CACHE_DTYPES = {**_DTYPES, "U8": (np.uint8, 1), "U32": (np.uint32, 4)}  # saved KV caches
_MAX_HEADER = 100 << 20  # the format's own limit

# HF per-layer names -> canonical suffixes; the one name whose meaning depends on
# the architecture is handled in canonical_name.
_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    # Phi-3's fused projections, split at load (tensor.split_fused)
    "self_attn.qkv_proj.weight": "attn_qkv.weight", "mlp.gate_up_proj.weight": "ffn_gate_up.weight",
    # Gemma 3n's AltUp, LAuReL and per-layer input (correct_output_scale is a bare Parameter)
    "altup.router_norm.weight": "altup_router_norm.weight", "altup.modality_router.weight": "altup_router.weight",
    "altup.prediction_coefs.weight": "altup_predict_coef.weight",
    "altup.correction_coefs.weight": "altup_correct_coef.weight",
    "altup.correct_output_scale": "altup_correct_scale.weight",
    "laurel.linear_left.weight": "laurel_l.weight", "laurel.linear_right.weight": "laurel_r.weight",
    "laurel.post_laurel_norm.weight": "laurel_post_norm.weight",
    "per_layer_input_gate.weight": "inp_gate.weight", "per_layer_projection.weight": "proj.weight",
    "post_per_layer_input_norm.weight": "post_norm.weight",
}
# Where a fused architecture keeps the parts (for error messages).
_FUSED_HINT = {"attn_q.weight": "self_attn.qkv_proj.weight", "attn_k.weight": "self_attn.qkv_proj.weight",
               "attn_v.weight": "self_attn.qkv_proj.weight", "ffn_gate.weight": "mlp.gate_up_proj.weight",
               "ffn_up.weight": "mlp.gate_up_proj.weight"}
_GLOBAL = {"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight",
           # Gemma 3n's per-layer inputs
           "embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
           "per_layer_model_projection.weight": "per_layer_model_proj.weight",
           "per_layer_projection_norm.weight": "per_layer_proj_norm.weight"}
# Gemma 3n's AltUp stream projections, one nn.Linear per stream beyond the first
_STREAMS = {"altup_projections": "altup_proj", "altup_unembed_projections": "altup_unembd_proj"}
_STREAM_RE = re.compile(r"^(altup_projections|altup_unembed_projections)\.(\d+)\.weight$")
# Prefixes of the language model inside CausalLM and multimodal (gemma3, gemma3n) checkpoints;
# what is left of a tower's name (vision_tower., audio_tower., embed_vision., ...) maps to nothing.
_PREFIX = re.compile(r"^(?:model\.language_model\.|language_model\.model\.|language_model\.|model\.)")
_LAYER_RE = re.compile(r"^layers\.(\d+)\.(.+)$")


def canonical_name(hf_name: str, arch: str) -> str | None:
    """The GGUF name of an HF tensor, or None for tensors we do not use (vision tower, ...)."""
    name = _PREFIX.sub("", hf_name)
    if name in _GLOBAL:
        return _GLOBAL[name]
    m = _STREAM_RE.match(name)
    if m:
        return f"{_STREAMS[m.group(1)]}.{m.group(2)}.weight"
    m = _LAYER_RE.match(name)
    if not m:
        return None
    i, rest = m.groups()
    if rest == "post_attention_layernorm.weight":
        # llama: the norm before the MLP; gemma: the norm after attention
        rest_c = "post_attention_norm.weight" if ARCHITECTURES[arch].sandwich_norms else "ffn_norm.weight"
    else:
        rest_c = _LAYER.get(rest)
    return f"blk.{i}.{rest_c}" if rest_c else None


def hf_name_hint(canonical: str, arch: str) -> str:
    """The HF name a canonical tensor is read from, for error messages."""
    m = re.match(r"^blk\.(\d+)\.(.+)$", canonical)
    stream = re.match(r"^(altup_proj|altup_unembd_proj)\.(\d+)\.weight$", canonical)
    if stream:
        hf = next(k for k, v in _STREAMS.items() if v == stream.group(1))
        return f"model.{hf}.{stream.group(2)}.weight"
    if not m:
        return next(("model." + k if k != "lm_head.weight" else k)
                    for k, v in _GLOBAL.items() if v == canonical)
    i, rest = m.groups()
    traits = ARCHITECTURES[arch]
    if rest == ("post_attention_norm.weight" if traits.sandwich_norms else "ffn_norm.weight"):
        return f"model.layers.{i}.post_attention_layernorm.weight"
    if traits.fused_projections and rest in _FUSED_HINT:
        return f"model.layers.{i}.{_FUSED_HINT[rest]}"
    return f"model.layers.{i}." + next(k for k, v in _LAYER.items() if v == rest)


def read_safetensors(path: str | os.PathLike, dtypes: dict = _DTYPES) -> dict[str, tuple[str, np.ndarray]]:
    """{name: (dtype, array)} of one file; arrays are read-only views of a memory
    map, BF16 as uint16 bit patterns. Raises ModelLoadError for a truncated or
    malformed file, naming the file and, where it applies, the tensor. As the
    format requires, the tensors must cover the data section exactly: no overlaps,
    no gaps, nothing after the last one. dtypes: the tensor types accepted
    (a model's: F32, F16, BF16; CACHE_DTYPES adds U8 and U32)."""
    path = str(path)
    size = os.path.getsize(path)
    header, start = _read_header(path, size)
    entries = {name: _header_entry(name, info, path, dtypes) for name, info in header.items()
               if name != "__metadata__"}
    for name, (dtype, shape, (b, e)) in entries.items():
        if start + e > size:
            raise ModelLoadError(f"[safetensors] {path}: tensor {name} ends at byte {start + e} but "
                                 f"the file has {size} bytes: the file is truncated")
    _check_tiling(entries, size - start, path)
    blob = np.memmap(path, dtype=np.uint8, mode="r", offset=start) if size > start else \
        np.zeros(0, np.uint8)
    return {name: (dtype.lower(), blob[b:e].view(dtypes[dtype][0]).reshape(shape))
            for name, (dtype, shape, (b, e)) in entries.items()}


def _read_header(path: str, size: int) -> tuple[dict[str, Any], int]:
    """The JSON header (duplicate names refused) and where the data section starts."""
    if size < 8:
        raise ModelLoadError(f"[safetensors] {path}: the file has {size} bytes, fewer than the 8 of its "
                             f"header length: not a safetensors file, or truncated")
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if n < 2 or n > min(size - 8, _MAX_HEADER):
            raise ModelLoadError(f"[safetensors] {path}: header length {n} does not fit a file of "
                                 f"{size} bytes: not a safetensors file, or truncated")
        try:
            header = json.loads(f.read(n), object_pairs_hook=_no_duplicate_keys)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
            raise ModelLoadError(f"[safetensors] {path}: header is not valid JSON ({e}): "
                                 f"corrupt file") from None
        except _DuplicateKey as e:
            raise ModelLoadError(f"[safetensors] {path}: header names {e.args[0]!r} twice: "
                                 f"corrupt file") from None
    if not isinstance(header, dict):
        raise ModelLoadError(f"[safetensors] {path}: header is not a JSON object: corrupt file")
    if not isinstance(header.get("__metadata__", {}), dict):
        raise ModelLoadError(f"[safetensors] {path}: __metadata__ is {describe(header['__metadata__'])}; "
                             f"expected an object of strings")
    return header, 8 + n


class _DuplicateKey(Exception):
    pass


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's object hook: a name given twice would let one entry hide another."""
    d: dict[str, Any] = {}
    for k, v in pairs:
        if k in d:
            raise _DuplicateKey(k)
        d[k] = v
    return d


def _is_uint(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _header_entry(name: str, info: Any, path: str, dtypes: dict = _DTYPES) -> tuple[str, tuple[int, ...], tuple[int, int]]:
    """(dtype, shape, (begin, end)) of one header entry, each field checked for type."""
    where = f"[safetensors] {path}: tensor {name}"
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
        raise ModelLoadError(f"{where}: malformed header entry {describe(info)}; expected "
                             f"{{dtype, shape, data_offsets}}")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(shape, list) or not all(_is_uint(x) for x in shape):
        raise ModelLoadError(f"{where}: shape is {describe(shape)}; expected a list of integers >= 0")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_uint(x) for x in offsets):
        raise ModelLoadError(f"{where}: data_offsets is {describe(offsets)}; expected [begin, end], "
                             f"integers >= 0")
    if dtype not in dtypes:
        raise ModelLoadError(f"{where} has dtype {dtype}; supported: {', '.join(dtypes)}")
    b, e = offsets
    want = math.prod(shape) * dtypes[dtype][1]
    if not b <= e or e - b != want:
        raise ModelLoadError(f"{where} of shape {tuple(shape)} {dtype} needs {want} bytes but its "
                             f"offsets span {e - b}: corrupt header")
    return dtype, tuple(shape), (b, e)


def _check_tiling(entries: dict[str, tuple[str, tuple[int, ...], tuple[int, int]]], data_size: int,
                  path: str) -> None:
    """Sorted by offset, each tensor starts where the previous one ended and the
    last ends at the end of the file (the format's rule; an overlap would let two
    tensors alias the same bytes)."""
    expected, prev = 0, None
    for name, (_, _, (b, e)) in sorted(entries.items(), key=lambda kv: kv[1][2]):
        if b != expected:
            what = (f"overlaps tensor {prev}" if b < expected else
                    f"leaves {b - expected} unused bytes after {prev or 'the header'}")
            raise ModelLoadError(f"[safetensors] {path}: tensor {name} has data_offsets [{b}, {e}] and "
                                 f"{what}; expected it to start at {expected}: corrupt header")
        expected, prev = e, name
    if expected != data_size:
        extra = data_size - expected
        raise ModelLoadError(f"[safetensors] {path}: the file goes on {extra} "
                             f"byte{'s' if extra != 1 else ''} past the last tensor ({prev}); expected "
                             f"the tensors to cover the data exactly: corrupt header or trailing garbage")


def to_engine_dtype(t: Tensor, quantize: str | None = None) -> Tensor:
    """Matrices: bf16 -> f16 (refusing silent overflow), f16 and f32 kept; vectors and the few
    matrices read as float32 (tensor.kept_f32) -> f32. With quantize, bf16 matrices the engine
    will quantize are kept as they are: through f16 they would lose the bits of values below
    f16's normal range (6.1e-5) and overflow above 65504."""
    src = t.data
    if t.dtype in ("f16", "f32") and not kept_f32(t):
        return t  # the kernels read it as it is; stays a view of the file
    if quantize is not None and quantizable(t):
        return t  # bf16 bit patterns, quantized at upload (model_spec.device_tensor)
    f32 = bf16_to_f32(src) if t.dtype == "bf16" else src.astype(np.float32)
    if kept_f32(t):
        return Tensor(t.name, t.shape, "f32", np.ascontiguousarray(f32))
    with np.errstate(over="ignore"):
        f16 = f32.astype(np.float16)
    if t.dtype != "f16" and np.isinf(f16).sum() != np.isinf(f32).sum():
        big = float(np.abs(f32[np.isfinite(f32)]).max())
        raise ModelLoadError(f"[safetensors] tensor {t.name} holds values up to {big:.3g}, beyond "
                             f"f16's 65504: metalkv keeps matrices in f16 and cannot load it")
    return Tensor(t.name, t.shape, "f16", f16)


def _read_json(path: pathlib.Path, required: bool) -> dict[str, Any] | None:
    if not path.is_file():
        if required:
            raise ModelLoadError(f"[safetensors] {path.parent}: no {path.name}")
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ModelLoadError(f"[safetensors] {path}: not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise ModelLoadError(f"[safetensors] {path}: holds {describe(value)}; expected a JSON object")
    return value


def _special_tokens(tok: dict[str, Any], path: pathlib.Path) -> dict[str, int]:
    """text -> id of tokenizer.json's special added tokens."""
    added = tok.get("added_tokens") or []
    ok = isinstance(added, list) and all(
        isinstance(t, dict) and isinstance(t.get("content"), str) and _is_uint(t.get("id"))
        for t in added)
    if not ok:
        raise ModelLoadError(f"[tokenizer] {path}: added_tokens is not a list of "
                             f"{{content: string, id: integer >= 0}} objects")
    return {t["content"]: t["id"] for t in added if t.get("special")}


def load_safetensors_dir(path: str | os.PathLike, *, progress: bool | None = None, quantize: str | None = None
                         ) -> tuple[ModelConfig, dict[str, Tensor], dict[str, Any]]:
    """(config, tensors, config.json) of an HF model directory (quantize: see to_engine_dtype)."""
    d = pathlib.Path(path)
    hf = _read_json(d / "config.json", required=True)
    tok = d / "tokenizer.json"
    special = _special_tokens(_read_json(tok, required=False) or {}, tok)
    cfg = config_from_hf(hf, str(d), generation_config=_read_json(d / "generation_config.json", False),
                         special_tokens=special)
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"[safetensors] {d}: no *.safetensors files next to config.json")
    raw: dict[str, Tensor] = {}
    origin: dict[str, str] = {}
    for f in files:
        for hf_name, (dtype, arr) in read_safetensors(f).items():
            name = canonical_name(hf_name, cfg.arch)
            if name is None:
                continue
            if name in raw:
                raise ModelLoadError(f"[safetensors] {d}: {name} appears twice ({origin[name]} and "
                                     f"{f.name}:{hf_name})")
            raw[name], origin[name] = Tensor(name, arr.shape, dtype, arr), f"{f.name}:{hf_name}"
    if cfg.tie_embeddings:
        raw.pop("output.weight", None)  # some exports save the tied copy too
    drop_reader_kv(raw, cfg)
    for part, fused in split_fused(raw, cfg, str(d), hint=lambda n: origin[n]).items():
        origin[part] = f"{origin[fused]} ({part.split('.')[2]} rows)"
    check_tensors(raw, cfg, str(d), hint=lambda n: hf_name_hint(n, cfg.arch))
    check_finite(raw, str(d), hint=lambda n: origin[n])
    tensors = {n: to_engine_dtype(t, quantize) for n, t in progress_bar(raw.items(), desc="tensors",
                                                               progress=progress, total=len(raw))}
    return cfg, tensors, hf
