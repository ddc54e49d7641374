"""GGUF files -> ModelConfig + canonical Tensors holding the file's own bytes
(quantized blocks stay quantized).

Checked in this order, each by one owner, before a tensor byte is used:
  gguf_file.read_gguf      the structure: counts, value types, tensor types, sizes, offsets
  config_from_gguf         each metadata key the model needs: type and range (values.py),
                           special token ids inside the vocabulary, no division by zero
  check_vocab_metadata     the keys the tokenizer reads: types, lengths, merges in the vocabulary
  check_tensors            names, shapes and types against the config (tensor.py)
  check_finite             NaN / Inf in float tensors and in quantized block scales (finite.py)
"""
from __future__ import annotations

import math
import os
import re
from typing import Any, Mapping

import numpy as np

from . import gemma3n
from .architectures import ARCHITECTURES, normalize_arch
from .config import ModelConfig, eog_ids, sliding_pattern_types, yarn_mscale
from .errors import ModelLoadError
from .finite import check_finite
from .gguf_file import GGUFFile, read_gguf
from .progress import progress_bar
from .tensor import ROPE_TENSORS, Tensor, check_tensors, drop_reader_kv, split_fused, vector_f32
from .values import (INT_RANGES, as_bool, as_count, as_float, as_int, as_list, as_str, as_token_id,
                     describe)

_REQUIRED = object()
_SPECIAL_ID = re.compile(r"^tokenizer\.ggml\.\w+_token_id$")
_EOG_KEYS = ("eot", "eom", "fim_pad", "fim_rep", "fim_sep")
_TOKEN_TYPES = range(0, 7)  # gguf.TokenType: 1 normal .. 6 byte (0: undefined)


class _ArchKeys:
    """Typed access to the `{arch}.*` metadata keys, naming the key in every error."""

    def __init__(self, md: dict[str, Any], arch: str, source: str):
        self.md, self.arch, self.source = md, arch, source

    def raw(self, key: str, default: Any = _REQUIRED) -> Any:
        full = f"{self.arch}.{key}"
        if full not in self.md:
            if default is _REQUIRED:
                raise ModelLoadError(f"[config] {self.source}: GGUF metadata lacks {full}")
            return default
        return self.md[full]

    def count(self, key: str, field: str, default: Any = _REQUIRED) -> int:
        v = self.raw(key, default)
        return as_count(v, f"{self.arch}.{key}", self.source, field)

    def per_layer_count(self, key: str, field: str, n_layers: int, default: Any = _REQUIRED) -> int:
        """A count some converters write once per layer; metalkv needs them all equal."""
        v = self.raw(key, default)
        full = f"{self.arch}.{key}"
        if not isinstance(v, list):
            return as_count(v, full, self.source, field)
        as_list(v, full, self.source, "int")
        if len(v) != n_layers or len(set(v)) != 1:
            raise ModelLoadError(f"[config] {self.source}: {full} is a per-layer list {v[:8]}"
                                 f"{'...' if len(v) > 8 else ''} of {len(v)} values; metalkv needs one "
                                 f"value for all {n_layers} layers")
        return as_count(v[0], full, self.source, field)

    def float(self, key: str, default: Any = _REQUIRED, **bounds) -> float:
        """GGUF types its values: a float key holding an int is a corrupt type field
        (10000.0's bits read as uint32 are 1176256512), not a number to accept."""
        v = self.raw(key, default)
        if isinstance(v, int):
            raise ModelLoadError(f"[config] {self.source}: {self.arch}.{key} is {describe(v)}; expected "
                                 f"a float32 or float64 value")
        return as_float(v, f"{self.arch}.{key}", self.source, **bounds)


def config_from_gguf(md: dict[str, Any], tensor_names: set[str], source: str,
                     shapes: Mapping[str, tuple[int, ...]] | None = None) -> ModelConfig:
    """shapes: {tensor name: logical shape}, where Gemma 3n reads sizes no key states."""
    src_arch = md.get("general.architecture")
    if src_arch is not None:
        as_str(src_arch, "general.architecture", source)
    arch = normalize_arch(src_arch, source)
    k = _ArchKeys(md, src_arch, source)
    n_layers = k.count("block_count", "n_layers")
    hidden = k.count("embedding_length", "hidden")
    n_heads = k.per_layer_count("attention.head_count", "n_heads", n_layers)
    head_dim, rotary_dim = _head_dim(k, arch, hidden, n_heads)
    vocab = _vocab(md, k, source)
    kw: dict[str, Any] = dict(
        arch=arch, n_layers=n_layers, hidden=hidden, n_heads=n_heads,
        n_kv_heads=k.per_layer_count("attention.head_count_kv", "n_kv_heads", n_layers, n_heads),
        head_dim=head_dim, rotary_dim=rotary_dim,
        ffn_hidden=k.per_layer_count("feed_forward_length", "ffn_hidden", n_layers),
        vocab=vocab, rms_eps=k.float("attention.layer_norm_rms_epsilon", gt=0.0, hi=1.0),
        rope_theta=k.float("rope.freq_base", 10000.0, gt=1.0),
        # convert_hf_to_gguf permutes llama's q/k rows for llama.cpp's NORM rope; other archs keep NEOX
        rope_style="interleaved" if src_arch == "llama" else "neox",
        context_length=k.count("context_length", "context_length"),
        tie_embeddings="output.weight" not in tensor_names,
        attn_bias=bool({"blk.0.attn_q.bias", "blk.0.attn_qkv.bias"} & tensor_names),
        rope_scaling=_gguf_rope_scaling(k, tensor_names, source),
        final_logit_softcap=k.float("final_logit_softcapping", 0.0, lo=0.0) or None,
        attn_logit_softcap=k.float("attn_logit_softcapping", 0.0, lo=0.0) or None,
        source_arch=src_arch, source_format="gguf",
        **_special_ids(md, vocab, source),
    )
    if ARCHITECTURES[arch].altup:
        kw.update(gemma3n.from_gguf(k, n_layers, hidden, shapes or {}))
    elif ARCHITECTURES[arch].gemma:
        kw.update(_gemma(k, arch, n_layers, hidden, n_heads, head_dim))
    else:
        window = _sliding_window(k)
        if window:  # a window on every layer (Mistral, Phi-3), as transformers runs them
            kw.update(sliding_window=window, layer_types=("sliding",) * n_layers)
    return ModelConfig(**kw).validate(source)


def _head_dim(k: _ArchKeys, arch: str, hidden: int, n_heads: int) -> tuple[int, int | None]:
    """(head_dim, rotary_dim or None when rope rotates the whole head)."""
    if k.raw("attention.key_length", None) is not None:
        head_dim = k.count("attention.key_length", "head_dim")
    elif hidden % n_heads:
        raise ModelLoadError(f"[config] {k.source}: {k.arch}.embedding_length {hidden} is not a multiple "
                             f"of {k.arch}.attention.head_count {n_heads}, and the file has no "
                             f"{k.arch}.attention.key_length to give the head size")
    else:
        head_dim = hidden // n_heads
    value_dim = k.count("attention.value_length", "head_dim", head_dim)
    if value_dim != head_dim:
        raise ModelLoadError(f"[config] {k.source}: {k.arch}.attention.value_length {value_dim} differs "
                             f"from the key length {head_dim}; metalkv needs them equal")
    rope_dim = k.count("rope.dimension_count", "head_dim", head_dim)
    if rope_dim == head_dim:
        return head_dim, None
    if not ARCHITECTURES[arch].partial_rotary:  # llama.cpp refuses it for llama too
        raise ModelLoadError(f"[config] {k.source}: partial rope (rope.dimension_count "
                             f"{rope_dim} != head_dim {head_dim}) is not supported for {k.arch} models")
    return head_dim, rope_dim  # ModelConfig.validate checks it is even and <= head_dim


def _sliding_window(k: _ArchKeys) -> int:
    return as_int(k.raw("attention.sliding_window", 0), f"{k.arch}.attention.sliding_window",
                  k.source, 0, INT_RANGES["sliding_window"][1])


def _vocab(md: dict[str, Any], k: _ArchKeys, source: str) -> int:
    """The token list's length; {arch}.vocab_size, when both are there, must agree."""
    tokens = md.get("tokenizer.ggml.tokens")
    if tokens is None:
        return k.count("vocab_size", "vocab")
    as_list(tokens, "tokenizer.ggml.tokens", source, "str")
    n = as_count(len(tokens), "the length of tokenizer.ggml.tokens", source, "vocab")
    if k.raw("vocab_size", None) is not None and k.count("vocab_size", "vocab") != n:
        raise ModelLoadError(f"[config] {source}: {k.arch}.vocab_size is {k.raw('vocab_size')} but "
                             f"tokenizer.ggml.tokens has {n} tokens; expected them equal")
    return n


def _special_ids(md: dict[str, Any], vocab: int, source: str) -> dict[str, Any]:
    """bos_id and eos_ids; every tokenizer.ggml.*_token_id must be inside the vocabulary."""
    for key in md:
        if _SPECIAL_ID.match(key):
            as_token_id(md[key], key, source, vocab)
    tokens = md.get("tokenizer.ggml.tokens") or []
    return dict(bos_id=md.get("tokenizer.ggml.bos_token_id"),
                eos_ids=eog_ids({t: i for i, t in enumerate(tokens)}, md.get("tokenizer.ggml.eos_token_id"),
                                *(md.get(f"tokenizer.ggml.{e}_token_id") for e in _EOG_KEYS)))


def _gguf_rope_scaling(k: _ArchKeys, tensor_names: set[str], source: str) -> dict | None:
    if "rope_freqs.weight" in tensor_names:
        return {"type": "freq_factors"}
    longrope = {"rope_factors_short.weight", "rope_factors_long.weight"}
    if longrope & tensor_names:  # convert_hf_to_gguf's Phi-3 LongRoPE
        if not longrope <= tensor_names:
            raise ModelLoadError(f"[config] {source}: LongRoPE needs both rope_factors_short.weight and "
                                 f"rope_factors_long.weight; the file has only {sorted(longrope & tensor_names)[0]}")
        return {"type": "longrope",
                "original_max_position_embeddings": k.count("rope.scaling.original_context_length",
                                                            "original_max_position_embeddings"),
                "attention_factor": k.float("rope.scaling.attn_factor", 1.0, gt=0.0)}
    kind = k.raw("rope.scaling.type", None)
    if kind is not None:
        as_str(kind, f"{k.arch}.rope.scaling.type", source)
    factor = k.float("rope.scaling.factor", 0.0, lo=0.0) or k.float("rope.scale_linear", 0.0, lo=0.0)
    if kind in (None, "none") and not factor:
        return None
    if kind in (None, "linear"):
        if not factor:
            raise ModelLoadError(f"[config] {source}: {k.arch}.rope.scaling.type is 'linear' but no "
                                 f"{k.arch}.rope.scaling.factor > 0 is given")
        return None if factor == 1.0 else {"type": "linear", "factor": factor}
    if kind == "yarn":
        return _gguf_yarn(k, factor or 1.0)
    raise ModelLoadError(f"[config] {source}: rope scaling type {kind!r} is not supported "
                         f"(supported: linear, yarn, rope_freqs factors, LongRoPE factors)")


def _gguf_yarn(k: _ArchKeys, factor: float) -> dict:
    """YaRN as llama.cpp runs a GGUF (llama-model.cpp load_hparams, llama-context.cpp), which
    is what a GGUF user compares with:
    - original context: rope.scaling.original_context_length, else (or 0) context_length;
    - beta_fast 32, beta_slow 1, floor/ceil truncation and ext_factor 1, always: the generic
      loader ignores rope.scaling.yarn_beta_fast / yarn_beta_slow / yarn_ext_factor /
      yarn_attn_factor (only grok reads them), so we do too;
    - cos and sin times (1 + 0.1 ln factor) * rope.scaling.attn_factor (default 1).
    Where this differs from transformers on the source config.json: an HF attention_factor
    (or mscale / mscale_all_dim ratio) replaces 1 + 0.1 ln factor there, while the converter
    writes it to yarn_attn_factor, which llama.cpp ignores; and an HF truncate: false (gpt-oss)
    has no GGUF key. Without those the two agree."""
    orig = k.raw("rope.scaling.original_context_length", 0)
    orig = k.count("context_length", "context_length") if orig == 0 and not isinstance(orig, bool) else \
        k.count("rope.scaling.original_context_length", "original_max_position_embeddings")
    return {"type": "yarn", "factor": factor, "original_max_position_embeddings": orig,
            "beta_fast": 32.0, "beta_slow": 1.0,
            "attention_factor": yarn_mscale(factor) * k.float("rope.scaling.attn_factor", 1.0, gt=0.0),
            "truncate": True}


def _gemma(k: _ArchKeys, arch: str, n_layers: int, hidden: int, n_heads: int,
           head_dim: int) -> dict[str, Any]:
    window = _sliding_window(k)
    # llama.cpp's patterns: gemma2 slides on even layers (hard-coded), gemma3 on 5 of every 6
    pattern = k.raw("attention.sliding_window_pattern", 6 if arch == "gemma3" else 2)
    key = f"{k.arch}.attention.sliding_window_pattern"
    if isinstance(pattern, list):  # one bool per layer: true = sliding
        as_list(pattern, key, k.source, "bool")
        if len(pattern) != n_layers:
            raise ModelLoadError(f"[config] {k.source}: {key} has {len(pattern)} values for "
                                 f"{n_layers} layers; expected one per layer")
        types = tuple("sliding" if p else "full" for p in pattern)
    else:
        types = sliding_pattern_types(n_layers, as_int(pattern, key, k.source, 0, (1 << 31) - 1))
    # llama.cpp: the 27B models (gemma2: 46 layers, gemma3: 62) scale by hidden/heads, the others
    # by head_dim
    big = n_layers == (46 if arch == "gemma2" else 62)
    return dict(
        hidden_act="gelu_tanh",
        sliding_window=window or None,
        layer_types=types if window else ("full",) * n_layers,
        rope_local_base_freq=k.float("rope.freq_base_swa", 10000.0, gt=1.0) if arch == "gemma3" else None,
        query_pre_attn_scalar=float(hidden // n_heads if big else head_dim),
        embedding_scale=math.sqrt(hidden),
        norm_weight_offset=0.0,  # the GGUF converter already added gemma's 1 to every norm
    )


def check_vocab_metadata(md: dict[str, Any], source: str) -> None:
    """The keys Tokenizer.from_gguf_metadata and ChatTemplate read, checked here so
    that a bad value is a ModelLoadError rather than an exception (or a Rust panic)
    inside the tokenizers package. config_from_gguf has checked the token list."""
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.chat_template"):
        if key in md:
            as_str(md[key], key, source)
    for key in ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token",
                "tokenizer.ggml.add_space_prefix"):
        if key in md:
            as_bool(md[key], key, source)
    tokens = md.get("tokenizer.ggml.tokens")
    if tokens is None:
        return
    _check_unique_tokens(tokens, source)
    if "tokenizer.ggml.token_type" in md:
        types = as_list(md["tokenizer.ggml.token_type"], "tokenizer.ggml.token_type", source, "int")
        if len(types) != len(tokens):
            raise ModelLoadError(f"[tokenizer] {source}: tokenizer.ggml.token_type has {len(types)} "
                                 f"entries for {len(tokens)} tokens; expected one per token")
        a = np.asarray(types, np.int64)
        if a.size and (a.min() < _TOKEN_TYPES.start or a.max() >= _TOKEN_TYPES.stop):
            i = int(np.flatnonzero((a < _TOKEN_TYPES.start) | (a >= _TOKEN_TYPES.stop))[0])
            raise ModelLoadError(f"[tokenizer] {source}: tokenizer.ggml.token_type[{i}] is {types[i]}; "
                                 f"expected a token type 0..6")
    if "tokenizer.ggml.scores" in md:  # SentencePiece: which adjacent pieces merge first
        scores = as_list(md["tokenizer.ggml.scores"], "tokenizer.ggml.scores", source, "float")
        if len(scores) != len(tokens):
            raise ModelLoadError(f"[tokenizer] {source}: tokenizer.ggml.scores has {len(scores)} "
                                 f"entries for {len(tokens)} tokens; expected one per token")
    if "tokenizer.ggml.merges" in md:
        _check_merges(as_list(md["tokenizer.ggml.merges"], "tokenizer.ggml.merges", source, "str"),
                      tokens, source)


def _check_unique_tokens(tokens: list[str], source: str) -> None:
    if len(set(tokens)) != len(tokens):
        first: dict[str, int] = {}
        for i, t in enumerate(tokens):
            if t in first:
                raise ModelLoadError(f"[tokenizer] {source}: tokenizer.ggml.tokens[{i}] {t[:40]!r} repeats "
                                     f"token {first[t]}; expected every token string once")
            first[t] = i


def _check_merges(merges: list[str], tokens: list[str], source: str) -> None:
    """Each BPE merge is "left right", both halves and their join in the vocabulary."""
    vocab = set(tokens)
    for i, m in enumerate(merges):
        left, sep, right = m.partition(" ")
        if not (sep and left and right and left in vocab and right in vocab and left + right in vocab):
            raise ModelLoadError(f"[tokenizer] {source}: tokenizer.ggml.merges[{i}] is {m[:40]!r}; "
                                 f"expected 'left right' with left, right and left+right all in "
                                 f"tokenizer.ggml.tokens")


def load_gguf_tensors(f: GGUFFile, cfg: ModelConfig, source: str,
                      progress: bool | None = None) -> dict[str, Tensor]:
    tensors = {t.name: Tensor(t.name, t.shape, t.ggml_type, f.tensor_array(t))
               for t in progress_bar(f.tensors, desc="tensors", progress=progress)}
    if cfg.traits.fused_projections:  # llama.cpp's phi3 ffn_up holds gate and up
        for i in range(cfg.n_layers):
            p = f"blk.{i}."
            if p + "ffn_gate.weight" not in tensors and p + "ffn_up.weight" in tensors:
                t = tensors.pop(p + "ffn_up.weight")
                tensors[p + "ffn_gate_up.weight"] = Tensor(p + "ffn_gate_up.weight", t.shape, t.dtype, t.data)
    split_fused(tensors, cfg, source, hint=lambda n: "in the file: " + n.replace("ffn_gate_up", "ffn_up"))
    if cfg.traits.altup:
        gemma3n.unstack(tensors, cfg, source)
    drop_reader_kv(tensors, cfg)
    check_tensors(tensors, cfg, source)
    check_finite(tensors, source)
    _check_rope_freqs(tensors, source)
    return tensors


def _check_rope_freqs(tensors: dict[str, Tensor], source: str) -> None:
    """rope_freqs.weight and LongRoPE's factors divide each rope frequency (model_spec.rope_tables)."""
    for name in ROPE_TENSORS:
        t = tensors.get(name)
        v = None if t is None else vector_f32(t)
        if v is not None and v.size and not (v > 0).all():
            raise ModelLoadError(f"[load] {source}: tensor {name} holds values <= 0 (min "
                                 f"{float(v.min()):g}); expected frequency divisors > 0")


def load_gguf(path: str | os.PathLike, *, progress: bool | None = None):
    """(config, tensors, metadata) of a GGUF file, checked as the module docstring says."""
    f = read_gguf(path)
    source = str(path)
    cfg = config_from_gguf(f.metadata, {t.name for t in f.tensors}, source, {t.name: t.shape for t in f.tensors})
    check_vocab_metadata(f.metadata, source)
    return cfg, load_gguf_tensors(f, cfg, source, progress), f.metadata
