"""GGUF files through the PyPI `gguf` package: metadata -> ModelConfig, tensors ->
canonical Tensors holding the file's own bytes (quantized blocks stay quantized).
"""
from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from .config import ModelConfig, eog_ids, normalize_arch, sliding_pattern_types
from .progress import progress_bar
from .tensor import ModelLoadError, Tensor, check_tensors

_REQUIRED = object()


def open_gguf(path: str | os.PathLike):
    """A GGUFReader on `path` (memory-mapped, read-only), or a ModelLoadError that
    says the file is not a readable GGUF file."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(os.fspath(path), "r")
    except FileNotFoundError:
        raise ModelLoadError(f"[gguf] {path}: no such file") from None
    except Exception as e:  # the reader raises ValueError/IndexError/... on bad bytes
        raise ModelLoadError(f"[gguf] {path}: not a readable GGUF file, truncated or corrupt "
                             f"({type(e).__name__}: {e})") from e
    size = os.path.getsize(path)
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size:
            raise ModelLoadError(f"[gguf] {path}: tensor {t.name} ends at byte {end} but the file "
                                 f"has {size} bytes: the file is truncated")
    return reader


def read_metadata(reader) -> dict[str, Any]:
    """All key/value fields as Python values (str, int, float, bool, list)."""
    md: dict[str, Any] = {}
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        v = f.contents()
        md[key] = v.item() if isinstance(v, np.generic) else v
    return md


def config_from_gguf(md: dict[str, Any], tensor_names: set[str], source: str) -> ModelConfig:
    src_arch = md.get("general.architecture")
    arch = normalize_arch(src_arch, source)

    def get(key: str, default: Any = _REQUIRED) -> Any:
        v = md.get(f"{src_arch}.{key}", default)
        if v is _REQUIRED:
            raise ModelLoadError(f"[config] {source}: GGUF metadata lacks {src_arch}.{key}")
        return v

    n_heads = get("attention.head_count")
    if isinstance(n_heads, list):  # some converters write one count per layer
        if len(set(n_heads)) != 1:
            raise ModelLoadError(f"[config] {source}: per-layer head counts are not supported")
        n_heads = n_heads[0]
    hidden = int(get("embedding_length"))
    head_dim = int(get("attention.key_length", hidden // int(n_heads)))
    if int(get("rope.dimension_count", head_dim)) != head_dim:
        raise ModelLoadError(f"[config] {source}: partial rope (rope.dimension_count "
                             f"{get('rope.dimension_count')} != head_dim {head_dim}) is not supported")
    tokens = md.get("tokenizer.ggml.tokens") or []
    n_layers = int(get("block_count"))
    kw: dict[str, Any] = dict(
        arch=arch, n_layers=n_layers, hidden=hidden, n_heads=int(n_heads),
        n_kv_heads=int(get("attention.head_count_kv", n_heads)), head_dim=head_dim,
        ffn_hidden=int(get("feed_forward_length")), vocab=int(get("vocab_size", len(tokens))),
        rms_eps=float(get("attention.layer_norm_rms_epsilon")),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        # convert_hf_to_gguf permutes llama's q/k rows for llama.cpp's NORM rope; other archs keep NEOX
        rope_style="interleaved" if src_arch == "llama" else "neox",
        context_length=int(get("context_length")),
        tie_embeddings="output.weight" not in tensor_names,
        attn_bias="blk.0.attn_q.bias" in tensor_names,
        rope_scaling=_gguf_rope_scaling(get, tensor_names, source),
        final_logit_softcap=get("final_logit_softcapping", None) or None,
        attn_logit_softcap=get("attn_logit_softcapping", None) or None,
        bos_id=md.get("tokenizer.ggml.bos_token_id"),
        eos_ids=eog_ids({t: i for i, t in enumerate(tokens)}, md.get("tokenizer.ggml.eos_token_id"),
                        *(md.get(f"tokenizer.ggml.{k}_token_id") for k in ("eot", "eom", "fim_pad", "fim_rep", "fim_sep"))),
        source_arch=src_arch, source_format="gguf",
    )
    if arch == "gemma3":
        window = get("attention.sliding_window", 0)
        pattern = get("attention.sliding_window_pattern", 6)  # llama.cpp's default for gemma3
        if isinstance(pattern, list):
            types = tuple("sliding" if p else "full" for p in pattern[:n_layers])
        else:
            types = sliding_pattern_types(n_layers, int(pattern))
        kw.update(
            hidden_act="gelu_tanh",
            sliding_window=int(window) or None,
            layer_types=types if window else ("full",) * n_layers,
            rope_local_base_freq=float(get("rope.freq_base_swa", 10000.0)),
            # llama.cpp: 27B (62 layers) scales by hidden/heads, the others by head_dim
            query_pre_attn_scalar=float(hidden // kw["n_heads"] if n_layers == 62 else head_dim),
            embedding_scale=math.sqrt(hidden),
            norm_weight_offset=0.0,  # the GGUF converter already added gemma's 1 to every norm
        )
    return ModelConfig(**kw).validate(source)


def _gguf_rope_scaling(get, tensor_names: set[str], source: str) -> dict | None:
    if "rope_freqs.weight" in tensor_names:
        return {"type": "freq_factors"}
    kind = get("rope.scaling.type", None)
    factor = get("rope.scaling.factor", None) or get("rope.scale_linear", None)
    if kind in (None, "none") and not factor:
        return None
    if kind in (None, "linear"):
        return None if float(factor) == 1.0 else {"type": "linear", "factor": float(factor)}
    raise ModelLoadError(f"[config] {source}: rope scaling type {kind!r} is not supported "
                         f"(supported: linear, rope_freqs factors)")


def load_gguf_tensors(reader, cfg: ModelConfig, source: str,
                      progress: bool | None = None) -> dict[str, Tensor]:
    tensors: dict[str, Tensor] = {}
    for t in progress_bar(reader.tensors, desc="tensors", progress=progress):
        shape = tuple(int(x) for x in reversed(list(t.shape)))
        data = t.data
        tensors[t.name] = Tensor(t.name, shape, t.tensor_type.name.lower(), data)
    check_tensors(tensors, cfg, source)
    return tensors


def load_gguf(path: str | os.PathLike, *, progress: bool | None = None):
    """(config, tensors, metadata) of a GGUF file."""
    reader = open_gguf(path)
    md = read_metadata(reader)
    names = {t.name for t in reader.tensors}
    cfg = config_from_gguf(md, names, str(path))
    return cfg, load_gguf_tensors(reader, cfg, str(path), progress), md
