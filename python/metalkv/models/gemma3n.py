"""Gemma 3n's text decoder in the loaders (architectures: altup): its config.json keys and
GGUF metadata as ModelConfig fields, with transformers 5.24's defaults for absent keys, and
the tensors its files hold beside the canonical ones (stacked, or carried by readers).

    from_hf(keys, ...)      Gemma3nTextConfig (model_type gemma3n_text, or gemma3n's text_config)
    from_gguf(keys, ...)    llama.cpp's convert_hf_to_gguf gemma3n keys, the laurel rank and the
                            per-layer table's rows from tensor shapes
    unstack(tensors, ...)   GGUF altup_proj / altup_unembd_proj {D, D, N-1} -> one (D, D) each

(The readers' k/v weights Google's files carry: tensor.drop_reader_kv.)

The forward these fields drive: docs/research/issue37-gemma3n-gguf.md §1; docs/MODELS.md "Gemma 3n".
"""
from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any, Mapping

import numpy as np

from .config import ModelConfig, sliding_pattern_types
from .errors import ModelLoadError
from .tensor import Tensor
from .values import as_int, as_list, describe

FULL_EVERY = 5            # transformers' and llama.cpp's default: layers 4, 9, ... attend fully
SPARSE_LAYERS, SPARSITY = 10, 0.95  # transformers' default activation_sparsity_pattern (models of > 10 layers)
STACKED = ("altup_proj", "altup_unembd_proj")  # GGUF's 3-D tensors, torch.stack of HF's ModuleLists


def sparse_std(p: float) -> float | None:
    """A target activation sparsity p as the gate's std multiplier: Normal(0, 1).icdf(p)
    rounded to float32 (0.95 -> 1.6448536, as torch computes it there); None for p = 0 (dense).
    torch's float32 icdf is 1-3 ulps off this for most other p (0.9: 1.2815515 vs 1.2815514)."""
    return None if p == 0.0 else float(np.float32(NormalDist().inv_cdf(p)))


def _common(hidden: int) -> dict[str, Any]:
    """What both sources say alike: Gemma's embedding scale, norms x * w (no 1 + w: llama.cpp's
    converter adds no 1 either), and unscaled scores: transformers' scaling = 1.0 (a
    config.json's query_pre_attn_scalar is unused), which attn_scale gives for a scalar of 1."""
    return dict(embedding_scale=math.sqrt(hidden), norm_weight_offset=0.0, query_pre_attn_scalar=1.0)


def from_hf(k, n_layers: int, hidden: int, local_theta: float | None,
            types: tuple[str, ...]) -> dict[str, Any]:
    """ModelConfig fields from config.json (hf_config._Keys k)."""
    src = k.source
    if not k.bool("altup_correct_scale", True):
        raise ModelLoadError(f"[config] {src}: altup_correct_scale is false; metalkv always scales AltUp's "
                             f"corrected active stream by correct_output_scale (as every Gemma 3n checkpoint "
                             f"does), so this model cannot be run")
    if k.bool("attention_bias", False):
        raise ModelLoadError(f"[config] {src}: attention_bias is true; Gemma 3n is supported without "
                             f"attention biases only (its checkpoints have none)")
    n = k.count("altup_num_inputs", "altup_inputs", 4)
    active = k.get("altup_active_idx")
    return dict(
        _common(hidden),
        sliding_window=k.count("sliding_window", "sliding_window", 512),
        layer_types=types or sliding_pattern_types(n_layers, FULL_EVERY),
        rope_local_base_freq=local_theta,
        final_logit_softcap=_hf_softcap(k),
        altup_inputs=n,
        altup_active=as_int(0 if active is None else active, "altup_active_idx", src, 0, n - 1),
        per_layer_dim=k.count("hidden_size_per_layer_input", "per_layer_dim", 256),
        per_layer_vocab=k.count("vocab_size_per_layer_input", "per_layer_vocab", 262144),
        laurel_rank=k.count("laurel_rank", "laurel_rank", 64),
        ffn_sparse_std=_hf_sparsity(k, n_layers),
        kv_shared_layers=k.count("num_kv_shared_layers", "kv_shared_layers", 15),
    )


def _hf_softcap(k) -> float | None:
    """transformers' default 30 for an absent key; null (or 0) is none."""
    key = "final_logit_softcapping"
    if key not in k.c:
        return 30.0
    return None if k.get(key) is None else (k.float(key, 0.0, lo=0.0) or None)


def _default_sparsity(n_layers: int) -> list[float]:
    """transformers' activation_sparsity_pattern when none is given."""
    n_sparse = SPARSE_LAYERS if n_layers > SPARSE_LAYERS else 0
    return [SPARSITY] * n_sparse + [0.0] * (n_layers - n_sparse)


def _stds(ps: list[float]) -> tuple[float | None, ...]:
    return tuple(sparse_std(float(p)) for p in ps) if any(ps) else ()


def _hf_sparsity(k, n_layers: int) -> tuple[float | None, ...]:
    key = "activation_sparsity_pattern"
    v = k.get(key)
    if v is None:
        ps = _default_sparsity(n_layers)
    else:
        ps = as_list(v, key, k.source, "float")
        if len(ps) != n_layers:
            raise ModelLoadError(f"[config] {k.source}: {key} has {len(ps)} values for num_hidden_layers="
                                 f"{n_layers}; expected one per layer")
    for i, p in enumerate(ps):
        if not 0.0 <= p < 1.0:
            raise ModelLoadError(f"[config] {k.source}: {key}[{i}] is {describe(p)}; expected a target "
                                 f"sparsity in [0, 1) (0: a dense layer)")
    return _stds(ps)


def from_gguf(k, n_layers: int, hidden: int, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    """ModelConfig fields from a gemma3n GGUF (gguf_loader._ArchKeys k). llama.cpp hard-codes
    several of these (4 streams, rank 64, 20 layers with K/V, 10 sparse layers); metalkv reads
    what the converter writes, and takes the laurel rank and the per-layer table's rows from
    the tensors. The converter pads per_layer_token_embd with zero rows to the vocabulary, so
    ids past Google's table read zeros, as in llama.cpp (transformers reads row 0 for them)."""
    src = k.source
    n = k.count("altup.num_inputs", "altup_inputs", 4)
    return dict(
        _common(hidden),
        hidden_act="gelu_tanh",  # no key says it; llama.cpp's gemma3n runs GeGLU
        sliding_window=k.count("attention.sliding_window", "sliding_window"),
        layer_types=_gguf_layer_types(k, n_layers),
        rope_local_base_freq=k.float("rope.freq_base_swa", 10000.0, gt=1.0),
        altup_inputs=n,
        altup_active=as_int(k.raw("altup.active_idx", 0), f"{k.arch}.altup.active_idx", src, 0, n - 1),
        per_layer_dim=k.count("embedding_length_per_layer_input", "per_layer_dim", 256),
        per_layer_vocab=_rows(shapes, "per_layer_token_embd.weight", src),
        laurel_rank=_rows(shapes, "blk.0.laurel_l.weight", src),
        ffn_sparse_std=_gguf_sparsity(k, n_layers),
        # absent: llama.cpp's fixed 20 layers with K/V
        kv_shared_layers=k.count("attention.shared_kv_layers", "kv_shared_layers", max(0, n_layers - 20)),
    )


def _rows(shapes: Mapping[str, tuple[int, ...]], name: str, source: str) -> int:
    shape = shapes.get(name)
    if shape is None or len(shape) != 2:
        raise ModelLoadError(f"[config] {source}: a gemma3n GGUF needs the 2-D tensor {name}, whose rows "
                             f"give a size no metadata key states; the file has "
                             f"{'none' if shape is None else f'one of shape {shape}'}")
    return shape[0]


def _gguf_layer_types(k, n_layers: int) -> tuple[str, ...]:
    key = f"{k.arch}.attention.sliding_window_pattern"
    pattern = k.raw("attention.sliding_window_pattern", None)
    if pattern is None:  # llama.cpp's load_swa_pattern default
        return sliding_pattern_types(n_layers, FULL_EVERY)
    as_list(pattern, key, k.source, "bool")
    if len(pattern) != n_layers:
        raise ModelLoadError(f"[config] {k.source}: {key} has {len(pattern)} values for {n_layers} layers; "
                             f"expected one bool per layer (true: sliding)")
    return tuple("sliding" if p else "full" for p in pattern)


def _gguf_sparsity(k, n_layers: int) -> tuple[float | None, ...]:
    """activation_sparsity_scale holds icdf(p) per layer, -inf for a dense layer."""
    key = f"{k.arch}.activation_sparsity_scale"
    v = k.raw("activation_sparsity_scale", None)
    if v is None:  # the converter always writes it; else transformers' default
        return _stds(_default_sparsity(n_layers))
    ok = isinstance(v, list) and all(isinstance(x, float) and not math.isnan(x) and x != math.inf for x in v)
    if not ok or len(v) != n_layers:
        raise ModelLoadError(f"[config] {k.source}: {key} is {describe(v)}; expected {n_layers} floats, "
                             f"finite or -inf (a dense layer)")
    out = tuple(None if x == -math.inf else float(np.float32(x)) for x in v)
    return out if any(x is not None for x in out) else ()


def unstack(tensors: dict[str, Tensor], cfg: ModelConfig, source: str) -> None:
    """GGUF's altup_proj.weight / altup_unembd_proj.weight, shape (N-1, D, D), become
    altup_proj.{k}.weight (D, D) in place: views of the same data, whatever the type."""
    for base in STACKED:
        t = tensors.pop(f"{base}.weight", None)
        if t is None:
            continue  # check_tensors names the missing parts
        want = (cfg.altup_inputs - 1, cfg.hidden, cfg.hidden)
        if tuple(t.shape) != want:
            raise ModelLoadError(f"[load] {source}: tensor {base}.weight has shape {tuple(t.shape)}, expected "
                                 f"{want} (altup_inputs - 1 stacked (hidden, hidden) projections)")
        rows = t.data.reshape(want[0], cfg.hidden, -1)  # a quantized type's data: (rows, bytes per row)
        for i in range(want[0]):
            name = f"{base}.{i}.weight"
            tensors[name] = Tensor(name, want[1:], t.dtype, rows[i])
