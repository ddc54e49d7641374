"""The loaders' common currency: a named tensor in canonical (GGUF) naming and
the shape check both sources go through.

Canonical names are llama.cpp's GGUF names, whatever the source file was:

    token_embd.weight                 (vocab, hidden)
    output_norm.weight                (hidden,)
    output.weight                     (vocab, hidden)       absent when tied
    rope_freqs.weight                 (rope_dim / 2,)       optional (llama3 GGUF)
    rope_factors_{short,long}.weight  (rope_dim / 2,)       optional (LongRoPE GGUF, Phi-3)
    blk.{i}.attn_norm.weight          (hidden,)
    blk.{i}.attn_q.weight             (n_heads * head_dim, hidden)
    blk.{i}.attn_k.weight             (n_kv_heads * head_dim, hidden)
    blk.{i}.attn_v.weight             (n_kv_heads * head_dim, hidden)
    blk.{i}.attn_{q,k,v}.bias         (rows of the weight,)  when config.attn_bias
    blk.{i}.attn_output.weight        (hidden, n_heads * head_dim)
    blk.{i}.ffn_norm.weight           (hidden,)
    blk.{i}.ffn_gate.weight           (ffn_hidden, hidden)
    blk.{i}.ffn_up.weight             (ffn_hidden, hidden)
    blk.{i}.ffn_down.weight           (hidden, ffn_hidden)
  with qk_norm (qwen3, gemma3):
    blk.{i}.attn_q_norm.weight        (head_dim,)
    blk.{i}.attn_k_norm.weight        (head_dim,)
  with sandwich_norms (gemma2, gemma3):
    blk.{i}.post_attention_norm.weight (hidden,)
    blk.{i}.post_ffw_norm.weight      (hidden,)

  with traits.altup (Gemma 3n; N altup_inputs, P per_layer_dim, L layers), beside the above:
    per_layer_token_embd.weight       (per_layer_vocab, L * P)   row layout layer-major: column l*P + j
    per_layer_model_proj.weight       (L * P, hidden)
    per_layer_proj_norm.weight        (P,)
    altup_proj.{k}.weight             (hidden, hidden)      k = 0..N-2 (GGUF: one (N-1, D, D) tensor)
    altup_unembd_proj.{k}.weight      (hidden, hidden)      k = 0..N-2
    blk.{i}.altup_router_norm.weight  (hidden,)
    blk.{i}.altup_router.weight       (N, hidden)           f32 on the device, never quantized
    blk.{i}.altup_predict_coef.weight (N * N, N)            f32, never quantized
    blk.{i}.altup_correct_coef.weight (N, N)                f32, never quantized
    blk.{i}.altup_correct_scale.weight (hidden,)
    blk.{i}.laurel_l.weight           (laurel_rank, hidden)
    blk.{i}.laurel_r.weight           (hidden, laurel_rank)
    blk.{i}.laurel_post_norm.weight   (hidden,)
    blk.{i}.inp_gate.weight           (P, hidden)
    blk.{i}.proj.weight               (hidden, P)
    blk.{i}.post_norm.weight          (hidden,)
  and no attn_k, attn_v, attn_k_norm on the layers that read another's K and V
  (ModelConfig.kv_share_sources; drop_reader_kv removes any a file carries).

Fused source tensors are split at load into the names above (split_fused), as
row views, whatever their type (a quantized row is a whole number of blocks):

    blk.{i}.attn_qkv.weight           (q_rows + 2 kv_rows, hidden)   Phi-3 (HF qkv_proj, GGUF)
    blk.{i}.ffn_gate_up.weight        (2 ffn_hidden, hidden)         Phi-3 (HF gate_up_proj; GGUF
                                                                     ffn_up), gate rows first

Shapes are logical and row-major: (out, in) for a matrix, so row r of
attn_q.weight produces output feature r. GGUF lists dimensions the other way
round (ne[0] is the contiguous one); the loaders reverse them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

from .errors import ModelLoadError

if TYPE_CHECKING:
    from .config import ModelConfig


@dataclass(frozen=True)
class Tensor:
    """One weight tensor.

    dtype is "f32", "f16", "bf16" or a GGML quantization name in lower case
    ("q8_0", "q4_0", "q4_1", "q4_k", ...). For f32/f16 `data` is a float array
    of `shape`, for bf16 its uint16 bit patterns. For quantized types `data` is the raw GGUF bytes, uint8 of
    shape (rows, bytes_per_row) where rows = prod(shape[:-1]): blocks are not
    dequantized, the engine reads them as they are. Arrays from a GGUF file are
    read-only views of a memory map (nothing is copied at load time).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    data: np.ndarray

    def __repr__(self) -> str:  # the data itself would flood a REPL or a test report
        return f"Tensor({self.name!r}, shape={self.shape}, dtype={self.dtype!r}, nbytes={self.nbytes})"

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    @property
    def quantized(self) -> bool:
        return self.dtype not in ("f32", "f16", "bf16")


# Engine.load(quantize=...): the GGUF types float matrices may become at load
# (cpp/ops/quantize.h) and the row length their blocks need.
QUANTIZE_TYPES = ("q8_0", "q4_0")
QUANTIZE_BLOCK = 32


# Matrices the engine reads as float32, whatever the file holds (AltUp's router and
# coefficients: a few values that weigh every stream of every row).
F32_MATRICES = ("altup_router.weight", "altup_predict_coef.weight", "altup_correct_coef.weight")


def kept_f32(t: Tensor) -> bool:
    """Tensors the device holds as float32: vectors, and F32_MATRICES."""
    return len(t.shape) == 1 or t.name.split(".", 2)[-1] in F32_MATRICES


def quantizable(t: Tensor) -> bool:
    """A float matrix whose rows are whole blocks: what quantize= converts."""
    return len(t.shape) == 2 and not t.quantized and t.shape[-1] % QUANTIZE_BLOCK == 0 and not kept_f32(t)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 values stored as their 16-bit patterns -> float32, exactly (bf16 is
    the top half of a float32)."""
    return (np.asarray(bits).view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def vector_f32(t: Tensor) -> np.ndarray:
    """A 1-D float tensor (f32, f16 or bf16 bits) as float32, exactly."""
    return (bf16_to_f32(t.data) if t.dtype == "bf16" else np.asarray(t.data, np.float32)).reshape(-1)


READER_KV = ("attn_k.weight", "attn_v.weight", "attn_k_norm.weight", "attn_k.bias", "attn_v.bias")
_ALTUP_LAYER = ("altup_router_norm.weight", "altup_router.weight", "altup_predict_coef.weight",
                "altup_correct_coef.weight", "altup_correct_scale.weight", "laurel_l.weight", "laurel_r.weight",
                "laurel_post_norm.weight", "inp_gate.weight", "proj.weight", "post_norm.weight")


def layer_names(i: int, cfg: ModelConfig, reader: bool | None = None) -> list[str]:
    """Canonical tensor names of layer i, in the order a forward pass uses them. reader: the
    layer reads another's K and V (None: ask cfg.kv_share_sources), so has no k/v weights."""
    if reader is None:
        reader = i in cfg.kv_share_sources()
    p = f"blk.{i}."
    names = [p + "attn_norm.weight", p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"]
    if cfg.attn_bias:
        names += [p + "attn_q.bias", p + "attn_k.bias", p + "attn_v.bias"]
    if cfg.traits.qk_norm:
        names += [p + "attn_q_norm.weight", p + "attn_k_norm.weight"]
    if reader:
        names = [n for n in names if n.split(".", 2)[2] not in READER_KV]
    names.append(p + "attn_output.weight")
    if cfg.traits.sandwich_norms:
        names.append(p + "post_attention_norm.weight")
    names += [p + "ffn_norm.weight", p + "ffn_gate.weight", p + "ffn_up.weight", p + "ffn_down.weight"]
    if cfg.traits.sandwich_norms:
        names.append(p + "post_ffw_norm.weight")
    if cfg.traits.altup:
        names += [p + n for n in _ALTUP_LAYER]
    return names


def drop_reader_kv(tensors: dict[str, Tensor], cfg: ModelConfig) -> None:
    """The layers that read another's K and V by the model's own sharing need no k/v weights;
    Google's Gemma 3n checkpoints carry them anyway (transformers 5 ignores them, llama.cpp
    requires them). Removed in place, so they are neither checked nor uploaded."""
    for layer in cfg.kv_share_sources():
        for kind in READER_KV:
            tensors.pop(f"blk.{layer}.{kind}", None)


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the model needs, with its logical shape, from the config alone."""
    q_rows = cfg.n_heads * cfg.head_dim
    kv_rows = cfg.n_kv_heads * cfg.head_dim
    per_kind = {
        "attn_norm.weight": (cfg.hidden,),
        "attn_q.weight": (q_rows, cfg.hidden),
        "attn_k.weight": (kv_rows, cfg.hidden),
        "attn_v.weight": (kv_rows, cfg.hidden),
        "attn_q.bias": (q_rows,),
        "attn_k.bias": (kv_rows,),
        "attn_v.bias": (kv_rows,),
        "attn_q_norm.weight": (cfg.head_dim,),
        "attn_k_norm.weight": (cfg.head_dim,),
        "attn_output.weight": (cfg.hidden, q_rows),
        "post_attention_norm.weight": (cfg.hidden,),
        "ffn_norm.weight": (cfg.hidden,),
        "ffn_gate.weight": (cfg.ffn_hidden, cfg.hidden),
        "ffn_up.weight": (cfg.ffn_hidden, cfg.hidden),
        "ffn_down.weight": (cfg.hidden, cfg.ffn_hidden),
        "post_ffw_norm.weight": (cfg.hidden,),
        **_altup_layer_shapes(cfg),
    }
    shapes = {"token_embd.weight": (cfg.vocab, cfg.hidden), "output_norm.weight": (cfg.hidden,)}
    if not cfg.tie_embeddings:
        shapes["output.weight"] = (cfg.vocab, cfg.hidden)
    if cfg.traits.altup:
        shapes.update(_altup_global_shapes(cfg))
    readers = cfg.kv_share_sources()
    for i in range(cfg.n_layers):
        for name in layer_names(i, cfg, i in readers):
            shapes[name] = per_kind[name.split(".", 2)[2]]
    return shapes


def _altup_layer_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    d, n, p, r = cfg.hidden, cfg.altup_inputs, cfg.per_layer_dim, cfg.laurel_rank
    return {"altup_router_norm.weight": (d,), "altup_router.weight": (n, d),
            "altup_predict_coef.weight": (n * n, n), "altup_correct_coef.weight": (n, n),
            "altup_correct_scale.weight": (d,), "laurel_l.weight": (r, d), "laurel_r.weight": (d, r),
            "laurel_post_norm.weight": (d,), "inp_gate.weight": (p, d), "proj.weight": (d, p),
            "post_norm.weight": (d,)}


def _altup_global_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    d, lp = cfg.hidden, cfg.n_layers * cfg.per_layer_dim
    shapes = {"per_layer_token_embd.weight": (cfg.per_layer_vocab, lp), "per_layer_model_proj.weight": (lp, d),
              "per_layer_proj_norm.weight": (cfg.per_layer_dim,)}
    for k in range(cfg.altup_inputs - 1):
        shapes[f"altup_proj.{k}.weight"] = shapes[f"altup_unembd_proj.{k}.weight"] = (d, d)
    return shapes


# Tensors a model may carry without the config asking for them.
OPTIONAL_SHAPES = {name: lambda cfg: (cfg.rope_dim // 2,) for name in
                   ("rope_freqs.weight", "rope_factors_short.weight", "rope_factors_long.weight")}
# Tensors folded into the rope tables (model_spec.rope_tables), not uploaded as weights.
ROPE_TENSORS = tuple(OPTIONAL_SHAPES)

# Types a tensor may have, by role. Vectors (norms, biases, rope factors) are read
# as floats; a quantized vector is a type changed in the header, not a format.
# Matrices: the float types and the GGML quantizations gguf-py can dequantize
# (the kernels read q8_0, q4_0 and q4_1 as they are; model_spec dequantizes the rest).
VECTOR_DTYPES = ("f32", "f16", "bf16")
MATRIX_DTYPES = VECTOR_DTYPES + (
    "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k",
    "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m", "iq4_nl", "iq4_xs",
    "tq1_0", "tq2_0", "mxfp4")
_LAYER_NAME = re.compile(r"^blk\.(\d+)\.")


def split_fused(tensors: dict[str, Tensor], cfg: ModelConfig, source: str,
                hint: Callable[[str], str] | None = None) -> dict[str, str]:
    """Replace each fused attn_qkv / ffn_gate_up tensor (module docstring) by its
    parts, in place: row views of the same data, no copy. Returns {part: fused
    name}. A fused tensor of the wrong shape, or one next to the parts it would
    make, is a ModelLoadError."""
    def label(n: str) -> str:
        return n if hint is None else f"{n} ({hint(n)})"

    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    splits = {"attn_qkv.weight": ("attn_q.weight", "attn_k.weight", "attn_v.weight"),
              "attn_qkv.bias": ("attn_q.bias", "attn_k.bias", "attn_v.bias"),
              "ffn_gate_up.weight": ("ffn_gate.weight", "ffn_up.weight")}
    made: dict[str, str] = {}
    for name in [n for n in tensors if n.split(".", 2)[-1] in splits]:
        t = tensors.pop(name)
        prefix, kind = name.rsplit(".", 2)[0] + ".", name.split(".", 2)[2]
        parts = splits[kind]
        rows = (q, kv, kv) if kind.startswith("attn_qkv") else (cfg.ffn_hidden, cfg.ffn_hidden)
        want = (sum(rows),) + (() if kind.endswith("bias") else (cfg.hidden,))
        if tuple(t.shape) != want:
            raise ModelLoadError(
                f"[load] {source}: fused tensor {label(name)} has shape {tuple(t.shape)}, expected {want} "
                f"({' + '.join(map(str, rows))} rows: {', '.join(p.split('.')[0] for p in parts)}) from the "
                f"config (heads={cfg.n_heads}, kv_heads={cfg.n_kv_heads}, head_dim={cfg.head_dim}, "
                f"ffn={cfg.ffn_hidden}, hidden={cfg.hidden})")
        check_tensor_dtype(t, source, label(name))
        clash = [prefix + p for p in parts if prefix + p in tensors]
        if clash:
            raise ModelLoadError(f"[load] {source}: the file has both the fused tensor {label(name)} and "
                                 f"{', '.join(clash)}; expected one or the other")
        start = 0
        for part, n in zip(parts, rows):
            tensors[prefix + part] = Tensor(prefix + part, (n,) + tuple(t.shape[1:]), t.dtype,
                                            t.data[start:start + n])
            made[prefix + part] = name
            start += n
    return made


def check_tensors(tensors: dict[str, Tensor], cfg: ModelConfig, source: str,
                  hint: Callable[[str], str] | None = None) -> None:
    """Raise ModelLoadError naming the first missing, misshapen or mistyped tensor,
    or one of a layer the config does not have; `hint` gives the name a canonical
    tensor has in the source file, for the message."""
    def label(n: str) -> str:
        return n if hint is None else f"{n} ({hint(n)})"

    want = expected_shapes(cfg)
    missing = [label(n) for n in want if n not in tensors]
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise ModelLoadError(
            f"[load] {source}: missing tensor(s) {', '.join(missing[:5])}{more} "
            f"for a {cfg.arch} model with {cfg.n_layers} layers")
    _check_layer_indices(tensors, cfg, source, label)
    for name, t in tensors.items():
        shape = want.get(name) or (OPTIONAL_SHAPES[name](cfg) if name in OPTIONAL_SHAPES else None)
        if shape is not None and tuple(t.shape) != shape:
            raise ModelLoadError(
                f"[load] {source}: tensor {label(name)} has shape {tuple(t.shape)}, expected {shape} "
                f"from the config (hidden={cfg.hidden}, heads={cfg.n_heads}, kv_heads="
                f"{cfg.n_kv_heads}, head_dim={cfg.head_dim}, ffn={cfg.ffn_hidden}, vocab={cfg.vocab})")
        check_tensor_dtype(t, source, label(name))


def _check_layer_indices(tensors: dict[str, Tensor], cfg: ModelConfig, source: str,
                         label: Callable[[str], str]) -> None:
    """A layer tensor beyond n_layers means the layer count in the file is wrong:
    running fewer layers than were trained would compute nonsense without an error."""
    for name in tensors:
        m = _LAYER_NAME.match(name)
        if m and int(m.group(1)) >= cfg.n_layers:
            raise ModelLoadError(
                f"[load] {source}: tensor {label(name)} belongs to layer {m.group(1)}, but the config "
                f"says the model has {cfg.n_layers} layers (0..{cfg.n_layers - 1}): the layer count "
                f"in the file does not match its tensors")


def check_tensor_dtype(t: Tensor, source: str, label: str) -> None:
    """Vectors must be float; matrices float or a GGML quantization we can read."""
    vector = len(t.shape) == 1
    allowed = VECTOR_DTYPES if vector else MATRIX_DTYPES
    if t.dtype not in allowed:
        kind = "a 1-D tensor (norm, bias, rope factors)" if vector else "a matrix"
        raise ModelLoadError(
            f"[load] {source}: tensor {label} of shape {tuple(t.shape)} has type {t.dtype}; "
            f"{kind} must be one of {', '.join(allowed)}: the file's header declares a type the "
            f"tensor cannot have")
