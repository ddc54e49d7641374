"""From a loaded model to what the C++ engine takes: the spec dict (switches,
scalars, rope tables) and the weights in dtypes the kernels read.

The C++ forward has no architecture names, and neither has this file: an
architecture becomes features in one table (models/architectures.py:
qk_norm, sandwich_norms, ...), the loaders read the rest from the file into a
ModelConfig (biases, windows, softcaps, rotary dims, norm offset), and
engine_spec maps those features onto the C++ model's switches one to one.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from . import _core
from .errors import MetalkvWarning, argument_error
from .models import LoadedModel, ModelConfig, Tensor
from .models.config import yarn_inv_freq
from .models.progress import progress_bar
from .models.tensor import (QUANTIZE_BLOCK, QUANTIZE_TYPES, ROPE_TENSORS, bf16_to_f32, kept_f32, quantizable,
                            vector_f32)

# Types the kernels read as they are (GGUF blocks stay blocks; metal/quant.h), from
# the C++ table (cpp/ops/weight_type.cpp).
KERNEL_DTYPES = tuple(_core.ops.weight_types())


def _inv_freq(cfg: ModelConfig, tensors: dict[str, Tensor], s: dict | None, long: bool = False) -> np.ndarray:
    """The (rope_dim/2,) float32 inv_freq of full-attention layers under scaling s."""
    d = cfg.rope_dim
    base = np.asarray(_core.ops.rope_inv_freq_default(d, cfg.rope_theta), np.float32)
    if s is None:
        return base
    if s["type"] == "linear":
        return (base / np.float32(s["factor"])).astype(np.float32)
    if s["type"] == "llama3":
        return np.asarray(_core.ops.rope_inv_freq_llama3(
            d, cfg.rope_theta, factor=s["factor"], low_freq_factor=s["low_freq_factor"],
            high_freq_factor=s["high_freq_factor"],
            original_max_position_embeddings=s["original_max_position_embeddings"]), np.float32)
    if s["type"] == "freq_factors":  # GGUF: llama.cpp divides each frequency by rope_freqs.weight
        return (base / vector_f32(tensors["rope_freqs.weight"])).astype(np.float32)
    if s["type"] == "longrope":  # HF: the factors in the config; GGUF: rope_factors_*.weight
        name = "long_factor" if long else "short_factor"
        factors = (np.asarray(s[name], np.float32) if name in s else
                   vector_f32(tensors[f"rope_factors_{name.split('_')[0]}.weight"]))
        return (base / factors).astype(np.float32)
    if s["type"] == "yarn":
        return yarn_inv_freq(d, cfg.rope_theta, s)
    raise ValueError(f"[engine] rope scaling {s['type']!r} is not supported")


def rope_tables(cfg: ModelConfig, tensors: dict[str, Tensor]) -> tuple[list[np.ndarray], list[int]]:
    """inv_freq tables (rope_dim/2 float32 each) and, per layer, which one it uses:
    table 0 (rope_theta and its scaling) for every layer, except that with a
    rope_local_base_freq (Gemma 3) sliding layers use table 1 (that base, unscaled).
    LongRoPE: these are the short factors' tables (long_rope_tables)."""
    tables = [_inv_freq(cfg, tensors, cfg.rope_scaling)]
    which = [0] * cfg.n_layers
    if cfg.rope_local_base_freq is not None and any(cfg.is_sliding(i) for i in range(cfg.n_layers)):
        tables.append(np.asarray(_core.ops.rope_inv_freq_default(cfg.rope_dim, cfg.rope_local_base_freq),
                                 np.float32))
        which = [1 if cfg.is_sliding(i) else 0 for i in range(cfg.n_layers)]
    return tables, which


def long_rope_tables(cfg: ModelConfig, tensors: dict[str, Tensor]) -> tuple[list[np.ndarray], int]:
    """LongRoPE's tables (one per rope_tables table: the long factors' instead of table 0,
    a sliding-layer base table as it is) and the cache size above which they replace
    rope_tables (llama.cpp's rule: the context, not the sequence, decides); ([], 0)
    without LongRoPE."""
    s = cfg.rope_scaling
    if s is None or s["type"] != "longrope":
        return [], 0
    return [_inv_freq(cfg, tensors, s, long=True)] + rope_tables(cfg, tensors)[0][1:], \
        s["original_max_position_embeddings"]


def attn_scale(cfg: ModelConfig) -> float:
    """Scores' scale. LongRoPE and YaRN multiply cos and sin by their attention factor,
    so q.k by its square (whole-head rotary only: ModelConfig.validate)."""
    s = cfg.rope_scaling
    factor = s.get("attention_factor", 1.0) if s is not None else 1.0
    return cfg.attn_scale * factor * factor


def kv_layers(cfg: ModelConfig, kv_share) -> list[int] | None:
    """The model's own KV sharing (ModelConfig.kv_share_sources: Gemma 3n's last layers) plus
    Engine.load's kv_share ({reader layer: source layer}; negative indices from the last) as the
    C++ spec's kv_layer: per layer, the cache layer it attends over, cache layers numbered in the
    order of the layers that write them. A reader stores no K and V and attends over its
    source's (a source that is itself a reader: that one's), with its own queries. None: no
    sharing."""
    share = dict(cfg.kv_share_sources())
    if kv_share is not None and kv_share != {}:
        share.update(_user_share(cfg, kv_share, share))
    if not share:
        return None
    writer_index: dict[int, int] = {}
    out = []
    for layer in range(cfg.n_layers):
        source = layer
        while source in share:
            source = share[source]
        if source == layer:
            writer_index[layer] = len(writer_index)
        out.append(writer_index[source])
    return out


def _user_share(cfg: ModelConfig, kv_share, own: dict[int, int]) -> dict[int, int]:
    """kv_share checked: layer indices, each source before its reader with the same window,
    and no reader the model already shares."""
    n = cfg.n_layers
    expected = (f"a dict {{reader: source}} of layer indices (-{n}..{n - 1}), each source before its "
                f"reader and with the same attention window")
    if not isinstance(kv_share, dict):
        raise argument_error("engine", "kv_share", kv_share, expected)
    share = {}
    for reader, source in kv_share.items():
        if not all(isinstance(x, int) and not isinstance(x, bool) and -n <= x < n for x in (reader, source)):
            raise argument_error("engine", "kv_share", kv_share, expected)
        reader, source = reader % n, source % n
        if source >= reader or cfg.is_sliding(reader) != cfg.is_sliding(source):
            raise argument_error("engine", "kv_share", kv_share, expected)
        if reader in own:
            raise argument_error("engine", "kv_share", kv_share,
                                 f"readers outside the layers the model shares itself: layers "
                                 f"{min(own)}..{max(own)} already read earlier layers' K and V "
                                 f"(layer {reader} reads layer {own[reader]}'s)")
        share[reader] = source
    return share


def altup_spec(cfg: ModelConfig) -> dict:
    """Gemma 3n's keys (ModelConfig.altup_inputs > 0; none for other models): AltUp's streams,
    the per-layer inputs, LAuReL, v's norm and, per layer, whether the ffn gate is sparse and
    its std multiplier (0.0 where dense)."""
    if not cfg.altup_inputs:
        return {}
    stds = cfg.ffn_sparse_std or (None,) * cfg.n_layers
    return dict(altup_inputs=cfg.altup_inputs, altup_active=cfg.altup_active, per_layer_dim=cfg.per_layer_dim,
                per_layer_vocab=cfg.per_layer_vocab, laurel_rank=cfg.laurel_rank, v_norm=cfg.traits.v_norm,
                ffn_sparse=[s is not None for s in stds], ffn_sparse_std=[0.0 if s is None else s for s in stds])


def engine_spec(cfg: ModelConfig, tensors: dict[str, Tensor], kv_layer: list[int] | None = None) -> dict:
    """kv_layer: kv_layers(cfg, kv_share); None: the model's own sharing (kv_layers(cfg, None))."""
    kv_layer = kv_layer if kv_layer is not None else kv_layers(cfg, None)
    tables, which = rope_tables(cfg, tensors)
    long_tables, long_above = long_rope_tables(cfg, tensors)
    return dict(**({"kv_layer": kv_layer} if kv_layer else {}), **altup_spec(cfg),
        n_layers=cfg.n_layers, hidden=cfg.hidden, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads,
        head_dim=cfg.head_dim, ffn_hidden=cfg.ffn_hidden, vocab=cfg.vocab, rms_eps=cfg.rms_eps,
        norm_offset=cfg.norm_weight_offset, embedding_scale=cfg.embedding_scale,
        attn_scale=attn_scale(cfg), attn_softcap=cfg.attn_logit_softcap or 0.0,
        final_softcap=cfg.final_logit_softcap or 0.0,
        activation="gelu_tanh" if cfg.hidden_act.startswith("gelu") else "silu",
        attn_bias=cfg.attn_bias, qk_norm=cfg.traits.qk_norm, sandwich_norms=cfg.traits.sandwich_norms,
        tied_embeddings=cfg.tie_embeddings, rope_style=cfg.rope_style, rotary_dim=cfg.rope_dim,
        rope_tables=[t.tolist() for t in tables], layer_rope_table=which,
        rope_tables_long=[t.tolist() for t in long_tables], rope_long_above=long_above,
        layer_window=[cfg.sliding_window if cfg.is_sliding(i) else 0 for i in range(cfg.n_layers)],
    )


def _dequantized(t: Tensor) -> np.ndarray:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    qtype = GGMLQuantizationType[t.dtype.upper()]
    return dequantize(t.data, qtype).reshape(t.shape)


def check_quantize(quantize) -> None:
    if quantize is not None and (not isinstance(quantize, str) or quantize not in QUANTIZE_TYPES):
        raise argument_error("engine", "quantize", quantize,
                             "None, 'q8_0' or 'q4_0' (the GGUF type float matrices are quantized to at load)")


def device_tensor(t: Tensor, quantize: str | None = None) -> tuple[str, np.ndarray]:
    """(dtype, C-contiguous data) as the kernels read it. Vectors (norms, biases;
    f32, f16 or bf16) and tensor.F32_MATRICES (AltUp's router and coefficients) become f32,
    exactly; with quantize ('q8_0' | 'q4_0'), quantizable float
    matrices become those GGUF blocks (ops.quantize: ggml's reference quantizers on their float32
    values); other matrices in a type the kernels read stay as they are (bf16 as its uint16 bit
    patterns, GGUF blocks as their bytes); other GGUF quantizations are dequantized to f16 (see
    load_weights' warning)."""
    if kept_f32(t):  # vectors (the loaders refuse quantized ones) and tensor.F32_MATRICES
        data = (bf16_to_f32(t.data) if t.dtype == "bf16" else
                _dequantized(t) if t.quantized else t.data).astype(np.float32)
        return "f32", np.ascontiguousarray(data)
    if quantize is not None and quantizable(t):
        return quantize, _core.ops.quantize(np.asarray(t.data).reshape(t.shape), quantize)
    if t.dtype in KERNEL_DTYPES:
        return t.dtype, np.ascontiguousarray(t.data)
    return "f16", np.ascontiguousarray(_dequantized(t).astype(np.float16))


def _warn_unquantized(m: LoadedModel, quantize: str) -> None:
    """Says once which matrices quantize= leaves as they are, and why."""
    matrices = [t for n, t in m.tensors.items() if len(t.shape) == 2 and n not in ROPE_TENSORS and not kept_f32(t)]
    already = [t for t in matrices if t.quantized]
    ragged = [t for t in matrices if not t.quantized and not quantizable(t)]
    if not already and not ragged:
        return
    parts = []
    if already:
        parts.append(f"{len(already)} already quantized ({', '.join(sorted({t.dtype for t in already}))}) "
                     f"stay in their own type")
    if ragged:
        kinds = sorted({t.name.split(".", 2)[-1] if t.name.startswith("blk.") else t.name for t in ragged})
        cols = sorted({t.shape[-1] for t in ragged})
        parts.append(f"{len(ragged)} whose rows are not a multiple of {QUANTIZE_BLOCK} values "
                     f"({', '.join(kinds)}: {', '.join(map(str, cols))} columns) stay "
                     f"{', '.join(sorted({t.dtype for t in ragged}))}")
    warnings.warn(f"quantize={quantize!r}: {len(already) + len(ragged)} of the {len(matrices)} matrices of "
                  f"{m.path.name} are not quantized to {quantize}: {'; '.join(parts)}", MetalkvWarning, stacklevel=4)


@dataclass(frozen=True)
class DeviceTensor:
    """A tensor as the device holds it (Engine.weight_tensors)."""
    dtype: str                # a kernel type: "f32", "f16", "bf16", "q8_0", "q4_0", ...
    shape: tuple[int, ...]
    nbytes: int


def load_weights(device, m: LoadedModel, *, progress: bool | None,
                 quantize: str | None = None) -> tuple["_core.Weights", dict[str, DeviceTensor]]:
    """The tensors on the device, as device_tensor makes them (quantize: see there), and
    what each became."""
    check_quantize(quantize)
    weights = _core.Weights(device)
    if quantize is not None:
        _warn_unquantized(m, quantize)
    other = [t for t in m.tensors.values() if len(t.shape) > 1 and t.dtype not in KERNEL_DTYPES]
    if other:
        stored, f16 = sum(t.nbytes for t in other), sum(2 * int(np.prod(t.shape)) for t in other)
        warnings.warn(f"metalkv reads {', '.join(KERNEL_DTYPES)} weights in-kernel; the "
                      f"{', '.join(sorted({t.dtype for t in other}))} matrices of {m.path.name} "
                      f"are dequantized to f16 at load: {stored / 2**20:.2f} MiB in "
                      f"the file take {f16 / 2**20:.2f} MiB on the device ({f16 / stored:.1f}x), values "
                      f"rounded to f16", MetalkvWarning, stacklevel=3)
    table: dict[str, DeviceTensor] = {}
    desc = "uploading weights" if quantize is None else f"quantizing to {quantize} and uploading weights"
    for name in progress_bar(list(m.tensors), desc=desc, progress=progress):
        t = m.tensors[name]
        if name in ROPE_TENSORS:
            continue  # folded into the rope tables
        dtype, data = device_tensor(t, quantize)
        nbytes = weights.add(name, dtype, list(t.shape), data.reshape(-1).view(np.uint8))
        table[name] = DeviceTensor(dtype, tuple(t.shape), int(nbytes))
    return weights, table


DEFAULT_CONTEXT = 4096  # tokens a cache holds unless asked: the model's context length, at most this


def check_context(context: int | None) -> None:
    if context is not None and (not isinstance(context, int) or isinstance(context, bool)
                                or not 0 < context < 2**32):
        raise argument_error("engine", "context", context, "a positive int (tokens a cache holds)")


_FINGERPRINT_SAMPLE = 1 << 16  # bytes hashed at the start, middle and end of a large tensor


def model_fingerprint(loaded: LoadedModel, quantize: str | None, kv_layer: list[int] | None = None) -> str:
    """What a saved cache is checked against (metalkv.cache_file): SHA-256 over the
    config, the quantize option, KV sharing, and every tensor's name, type and shape plus its
    bytes (all of them up to 3 x 64 KiB, else 64 KiB at its start, middle and end).
    Another model, quantization or checkpoint changes it; two files with the same
    tensors and config give the same one. Not a guard against deliberate edits:
    hashing every byte of an 8B model would add seconds to each load."""
    import hashlib

    h = hashlib.sha256(repr(loaded.config).encode())
    h.update(repr(quantize).encode())
    if kv_layer:  # which layers share K and V: another model as far as a saved cache goes
        h.update(repr(kv_layer).encode())
    for name in sorted(loaded.tensors):
        t = loaded.tensors[name]
        h.update(f"{name}|{t.dtype}|{t.shape}|".encode())
        raw = np.ascontiguousarray(t.data).reshape(-1).view(np.uint8)
        n = _FINGERPRINT_SAMPLE
        if raw.size <= 3 * n:
            h.update(raw.tobytes())
        else:
            mid = raw.size // 2
            for part in (raw[:n], raw[mid:mid + n], raw[-n:]):
                h.update(part.tobytes())
    return h.hexdigest()[:32]


def default_capacity(cfg: ModelConfig, context: int | None) -> int:
    check_context(context)
    if context is not None:
        return context
    return max(1, min(DEFAULT_CONTEXT, cfg.context_length or DEFAULT_CONTEXT))
