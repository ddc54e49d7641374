"""ModelConfig: one description of a model, whether it came from GGUF metadata or
a Hugging Face config.json. Everything the engine needs to build the forward pass
is here; nothing here depends on tensors except what GGUF only tells through them
(q/k/v bias, rope frequency factors).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .architectures import ARCHITECTURES, Architecture
from .errors import ModelLoadError
from .values import as_bool, as_count, as_float, as_token_id, describe

# llama.cpp ends generation on tokens with these texts (llama-vocab.cpp), including the
# fill-in-the-middle pad/repo/file-separator tokens; so do we, to stop where it stops.
EOG_TEXTS = frozenset({"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                       "<|eom_id|>", "<EOT>", "<|end_of_text|>", "<eos>",
                       "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "<|fim_repo|>",
                       "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>"})


@dataclass(frozen=True)
class ModelConfig:
    arch: str                   # a key of architectures.ARCHITECTURES
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_hidden: int
    vocab: int
    rms_eps: float
    rope_theta: float           # full-attention layers
    rope_style: str             # "interleaved" (GGUF llama: pairs (2i, 2i+1)) | "neox" (pairs (i, i+d/2))
    context_length: int
    tie_embeddings: bool
    hidden_act: str = "silu"    # "silu" (llama) | "gelu_tanh" (gemma), gating the ffn_up product
    # None, {"type": "linear", "factor"}, {"type": "llama3", "factor", "low_freq_factor",
    # "high_freq_factor", "original_max_position_embeddings"}, {"type": "freq_factors"}
    # (GGUF: divide each frequency by the rope_freqs.weight tensor), {"type": "longrope",
    # "original_max_position_embeddings", "attention_factor", "short_factor", "long_factor"}
    # (GGUF: the factors are the rope_factors_{short,long}.weight tensors) or {"type": "yarn",
    # "factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor",
    # "truncate"} (yarn_inv_freq). Full-attention layers only (unless the model has no separate
    # sliding-layer base). An "attention_factor" multiplies cos and sin (model_spec.attn_scale).
    rope_scaling: dict | None = None
    rope_local_base_freq: float | None = None   # gemma3 sliding layers (no scaling there)
    rotary_dim: int | None = None                # dims of each head rope rotates; None = head_dim
    attn_bias: bool = False     # q/k/v projections carry a bias (qwen2)
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()           # per layer "full" | "sliding"
    query_pre_attn_scalar: float | None = None  # scores scale = scalar**-0.5 (gemma)
    attn_logit_softcap: float | None = None     # scores = cap * tanh(scores / cap)
    final_logit_softcap: float | None = None
    embedding_scale: float = 1.0                # x = token_embd[id] * scale (gemma: sqrt(hidden))
    norm_weight_offset: float = 0.0             # rms_norm(x) * (offset + w): HF gemma stores w - 1
    bos_id: int | None = None
    eos_ids: tuple[int, ...] = ()               # any of these ends generation
    # Gemma 3n (traits.altup; models/gemma3n.py reads them); the defaults mean "none" for every other model
    altup_inputs: int = 0                       # N streams of the hidden state (AltUp); 0: one
    altup_active: int = 0                       # the stream each layer computes on
    per_layer_dim: int = 0                      # P: each layer's input from its token (HF hidden_size_per_layer_input)
    per_layer_vocab: int = 0                    # rows of per_layer_token_embd (HF vocab_size_per_layer_input)
    laurel_rank: int = 0                        # rank of LAuReL's residual beside attention
    ffn_sparse_std: tuple[float | None, ...] = ()  # per layer: the ffn gate keeps what exceeds
    #                                             mean + std * this (float32 icdf of the target sparsity);
    #                                             None: a dense layer; (): all dense
    kv_shared_layers: int = 0                   # the last n layers read K and V (kv_share_sources)
    source_arch: str = ""                       # as the file names it: "llama", "qwen2", "gemma3_text", ...
    source_format: str = ""                     # "gguf" | "safetensors"

    @property
    def attn_scale(self) -> float:
        base = self.query_pre_attn_scalar if self.query_pre_attn_scalar else self.head_dim
        return 1.0 / math.sqrt(base)

    @property
    def traits(self) -> Architecture:
        return ARCHITECTURES[self.arch]

    @property
    def rope_dim(self) -> int:
        """Dims of each head that rope rotates (the first rope_dim; the rest pass through)."""
        return self.rotary_dim or self.head_dim

    def is_sliding(self, layer: int) -> bool:
        return bool(self.layer_types) and self.layer_types[layer] == "sliding"

    def kv_share_sources(self, source: str = "config") -> dict[int, int]:
        """The model's own KV sharing, {reader: source layer}: each of the last kv_shared_layers
        layers attends over the K and V of the last earlier layer of its own type (sliding or
        full), as transformers' Gemma3nTextConfig.kv_sharing_modes; {} without."""
        first = self.n_layers - self.kv_shared_layers
        if not self.kv_shared_layers:
            return {}
        kinds = ["sliding" if self.is_sliding(i) else "full" for i in range(self.n_layers)]
        last = {kind: i for i, kind in enumerate(kinds[:first])}
        missing = sorted(set(kinds[first:]) - set(last))
        if missing:
            raise ModelLoadError(
                f"[config] {source}: the last {self.kv_shared_layers} layers ({first}..{self.n_layers - 1}) "
                f"read the K and V of the last earlier layer of their type, but no {missing[0]} layer comes "
                f"before layer {first}; expected every reader's type among layers 0..{first - 1}")
        return {i: last[kinds[i]] for i in range(first, self.n_layers)}

    def validate(self, source: str) -> "ModelConfig":
        """Ranges and relations of the fields, whatever file they came from; the
        loaders have checked the type of each key they read."""
        for name in _COUNT_FIELDS:
            as_count(getattr(self, name), name, source, name)
        if self.n_heads % self.n_kv_heads:
            raise ModelLoadError(f"[config] {source}: n_heads={self.n_heads} is not a multiple of "
                                 f"n_kv_heads={self.n_kv_heads}")
        if self.head_dim % 2:
            raise ModelLoadError(f"[config] {source}: head_dim={self.head_dim} must be even for rope")
        if self.rotary_dim is not None and not (2 <= self.rotary_dim <= self.head_dim
                                                and self.rotary_dim % 2 == 0):
            raise ModelLoadError(f"[config] {source}: rope rotates {self.rotary_dim} dims of each head; "
                                 f"expected an even number in 2..head_dim={self.head_dim}")
        self._validate_floats(source)
        check_rope_scaling(self.rope_scaling, "rope_scaling", source)
        s = self.rope_scaling
        if s is not None and s.get("attention_factor", 1.0) != 1.0 and self.rope_dim < self.head_dim:
            # it multiplies the rotated dims of q and k only: no score scale can stand for it
            raise ModelLoadError(
                f"[config] {source}: {_SCALING_NAMES[s['type']]}'s attention factor "
                f"{s['attention_factor']:.4g} with partial rotary ({self.rope_dim} of {self.head_dim} "
                f"dims) is not supported: the factor scales only the rotated dims, which the rope "
                f"kernels do not do")
        if s is not None and s["type"] == "longrope":
            for name in ("short_factor", "long_factor"):
                if name in s and len(s[name]) != self.rope_dim // 2:
                    raise ModelLoadError(f"[config] {source}: rope_scaling.{name} has {len(s[name])} "
                                         f"values; rope rotating {self.rope_dim} dims needs "
                                         f"{self.rope_dim // 2}")
        self._validate_layers(source)
        if self.traits.altup:
            self._validate_altup(source)
        if self.bos_id is not None:
            as_token_id(self.bos_id, "bos_id", source, self.vocab)
        for i in self.eos_ids:
            as_token_id(i, "eos_ids", source, self.vocab)
        return self

    def _validate_floats(self, source: str) -> None:
        as_float(self.rms_eps, "rms_eps", source, gt=0.0, hi=1.0)
        as_float(self.rope_theta, "rope_theta", source, gt=1.0)
        as_float(self.embedding_scale, "embedding_scale", source, gt=0.0)
        as_float(self.norm_weight_offset, "norm_weight_offset", source)
        if self.rope_local_base_freq is not None:
            as_float(self.rope_local_base_freq, "rope_local_base_freq", source, gt=1.0)
        for name in ("query_pre_attn_scalar", "attn_logit_softcap", "final_logit_softcap"):
            if getattr(self, name) is not None:
                as_float(getattr(self, name), name, source, gt=0.0)

    def _validate_layers(self, source: str) -> None:
        if self.layer_types and len(self.layer_types) != self.n_layers:
            raise ModelLoadError(f"[config] {source}: {len(self.layer_types)} layer types for "
                                 f"{self.n_layers} layers")
        bad = sorted(set(self.layer_types) - {"full", "sliding"})
        if bad:
            raise ModelLoadError(f"[config] {source}: layer types {bad}; expected 'full' or 'sliding'")
        if self.sliding_window is not None:
            as_count(self.sliding_window, "sliding_window", source, "sliding_window")
        if "sliding" in self.layer_types and not self.sliding_window:
            raise ModelLoadError(f"[config] {source}: sliding layers but no sliding_window")


    def _validate_altup(self, source: str) -> None:
        for name in ("altup_inputs", "per_layer_dim", "per_layer_vocab", "laurel_rank"):
            as_count(getattr(self, name), name, source, name)
        if not 0 <= self.altup_active < self.altup_inputs:  # the loaders name the key; this is the relation
            raise ModelLoadError(f"[config] {source}: AltUp's active stream {self.altup_active} is not one of its "
                                 f"{self.altup_inputs} streams")
        if self.kv_shared_layers >= self.n_layers:
            raise ModelLoadError(f"[config] {source}: the last {self.kv_shared_layers} layers would read earlier "
                                 f"layers' K and V (num_kv_shared_layers, GGUF attention.shared_kv_layers) in a "
                                 f"model of {self.n_layers} layers; expected fewer than {self.n_layers}")
        if self.ffn_sparse_std and len(self.ffn_sparse_std) != self.n_layers:
            raise ModelLoadError(f"[config] {source}: {len(self.ffn_sparse_std)} ffn sparsities for "
                                 f"{self.n_layers} layers; expected one per layer")
        for i, v in enumerate(self.ffn_sparse_std):
            if v is not None:
                as_float(v, f"ffn_sparse_std[{i}]", source)
        self.kv_share_sources(source)


_SCALING_NAMES = {"longrope": "LongRoPE", "yarn": "YaRN"}  # the scalings with an attention factor
_COUNT_FIELDS = ("n_layers", "hidden", "n_heads", "n_kv_heads", "head_dim", "ffn_hidden", "vocab",
                 "context_length")


def normalize_rope_scaling(s: Any, source: str, key: str = "rope_scaling",
                           top: Mapping[str, Any] | None = None) -> dict | None:
    """HF rope_scaling / rope_parameters (either key spelling) -> our dict or None.
    top: the whole config.json, where LongRoPE's and YaRN's context lengths may live."""
    if not s:
        return None
    if not isinstance(s, dict):
        raise ModelLoadError(f"[config] {source}: {key} is {describe(s)}; expected an object or null")
    kind = s.get("rope_type") or s.get("type") or "default"
    if kind == "default":
        return None
    if kind == "linear":
        out = {"type": "linear", "factor": as_float(s.get("factor"), f"{key}.factor", source)}
    elif kind == "llama3":
        keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        missing = [k for k in keys if k not in s]
        if missing:
            raise ModelLoadError(f"[config] {source}: llama3 rope scaling lacks {', '.join(missing)}")
        out = {"type": "llama3", **{k: as_float(s[k], f"{key}.{k}", source) for k in keys[:3]}}
        out["original_max_position_embeddings"] = as_count(
            s["original_max_position_embeddings"], f"{key}.original_max_position_embeddings", source,
            "original_max_position_embeddings")
    elif kind in ("longrope", "su") or (kind == "yarn" and (top or {}).get("model_type") == "phi3"):
        # "su": Phi-3's first name for it; transformers' Phi3Config reads "yarn" as one too
        out = _longrope(s, key, source, top or {})
    elif kind == "yarn":
        out = _yarn(s, key, source, top or {})
    else:
        raise ModelLoadError(f"[config] {source}: rope scaling type {kind!r} is not supported "
                             f"(supported: linear, llama3, longrope, yarn)")
    return out  # ranges: ModelConfig.validate (check_rope_scaling)


def _longrope(s: Mapping[str, Any], key: str, source: str, top: Mapping[str, Any]) -> dict:
    """LongRoPE as transformers computes it (_compute_longrope_parameters): per-frequency
    divisors short_factor (a sequence within original_max_position_embeddings) or
    long_factor (beyond), and cos/sin multiplied by attention_factor, by default
    sqrt(1 + ln(factor) / ln(original)) with factor = max_position_embeddings / original."""
    out: dict[str, Any] = {"type": "longrope"}
    for name in ("short_factor", "long_factor"):
        v = s.get(name)
        if not isinstance(v, list) or not v:
            raise ModelLoadError(f"[config] {source}: {key}.{name} is {describe(v)}; expected a "
                                 f"non-empty list of numbers")
        out[name] = tuple(as_float(x, f"{key}.{name}[{i}]", source, gt=0.0) for i, x in enumerate(v))
    k_orig = f"{key}.original_max_position_embeddings"
    orig = s.get("original_max_position_embeddings")
    if orig is None:
        orig, k_orig = top.get("original_max_position_embeddings"), "original_max_position_embeddings"
    out["original_max_position_embeddings"] = as_count(orig, k_orig, source, "original_max_position_embeddings")
    factor = s.get("factor")
    if factor is None:
        factor = as_count(top.get("max_position_embeddings"), "max_position_embeddings", source,
                          "context_length") / out["original_max_position_embeddings"]
    factor = as_float(factor, f"{key}.factor", source, gt=0.0)
    attn = s.get("attention_factor")
    if attn is None:
        attn = math.sqrt(1 + math.log(factor) / math.log(out["original_max_position_embeddings"])) \
            if factor > 1.0 else 1.0
    out["attention_factor"] = as_float(attn, f"{key}.attention_factor", source, gt=0.0)
    return out


def _yarn(s: Mapping[str, Any], key: str, source: str, top: Mapping[str, Any]) -> dict:
    """YaRN as transformers 5 computes it (_compute_yarn_parameters; the table itself:
    yarn_inv_freq). original_max_position_embeddings: in the scaling dict, else at the top
    of config.json (where transformers 5 also looks), else max_position_embeddings; factor,
    when absent, max_position_embeddings / original (an explicit factor wins, as in
    transformers 5 and llama.cpp, even where that ratio differs). attention_factor: the
    config's, else get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) when both
    are set (DeepSeek), else 1 + 0.1 ln(factor). Keys transformers does not read (an
    ext_factor, say) are ignored as it ignores them."""
    out: dict[str, Any] = {"type": "yarn"}
    k_orig, orig = f"{key}.original_max_position_embeddings", s.get("original_max_position_embeddings")
    if orig is None:
        k_orig, orig = "original_max_position_embeddings", top.get("original_max_position_embeddings")
    if orig is None:
        k_orig, orig = "max_position_embeddings", top.get("max_position_embeddings")
    orig = as_count(orig, k_orig, source, "original_max_position_embeddings")
    factor = s.get("factor")
    if factor is None:
        longest = top.get("max_position_embeddings")
        factor = 1.0 if longest is None else \
            as_count(longest, "max_position_embeddings", source, "context_length") / orig
    out["factor"] = factor = as_float(factor, f"{key}.factor", source, gt=0.0)
    out["original_max_position_embeddings"] = orig
    slow = s.get("beta_slow")
    out["beta_slow"] = slow = 1.0 if slow is None else as_float(slow, f"{key}.beta_slow", source, gt=0.0)
    fast = s.get("beta_fast")
    # beta_fast counts the faster rotations: below beta_slow the ramp would run backwards
    out["beta_fast"] = 32.0 if fast is None else as_float(fast, f"{key}.beta_fast", source, lo=slow)
    attn = s.get("attention_factor")
    if attn is None:
        ms = {name: as_float(s[name], f"{key}.{name}", source) if s.get(name) is not None else None
              for name in ("mscale", "mscale_all_dim")}
        if ms["mscale"] and ms["mscale_all_dim"]:
            attn = yarn_mscale(factor, ms["mscale"]) / yarn_mscale(factor, ms["mscale_all_dim"])
        else:
            attn = yarn_mscale(factor)
    out["attention_factor"] = as_float(attn, f"{key}.attention_factor", source, gt=0.0)
    truncate = s.get("truncate")
    out["truncate"] = True if truncate is None else as_bool(truncate, f"{key}.truncate", source)
    return out


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention magnitude for a context `factor` times longer (transformers'
    get_mscale; llama.cpp's too): 1 + 0.1 * mscale * ln(factor), and 1 for factor <= 1."""
    return 1.0 if factor <= 1.0 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_inv_freq(rope_dim: int, rope_theta: float, s: Mapping[str, Any]) -> np.ndarray:
    """(rope_dim/2,) float32 inv_freq under YaRN scaling s, in transformers' order of
    float32 operations: each frequency blends base^(-2i/d) / factor (interpolated) and
    base^(-2i/d) (extrapolated) by a linear ramp over the pairs i between the correction
    dims of beta_fast (below: extrapolated, the fast rotations) and beta_slow (above:
    interpolated); llama.cpp (ggml_rope_yarn_corr_dims, rope_yarn_ramp) computes the same
    ramp, always with floor/ceil (truncate) and an ext_factor of 1."""
    d, base = rope_dim, float(rope_theta)
    orig = s["original_max_position_embeddings"]

    def corr_dim(rotations: float) -> float:  # the dim whose wavelength fits `rotations` times in orig
        return d * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = corr_dim(s["beta_fast"]), corr_dim(s["beta_slow"])
    if s["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    f32 = np.float32
    # base^(2i/d) of a float32 base and exponent, rounded once: torch's float32 pow is about
    # that exact (numpy's float32 pow is off by an ulp in ~1 of 10)
    pos_freqs = (np.float64(f32(base)) ** (np.arange(0, d, 2, dtype=f32) / f32(d)).astype(np.float64)).astype(f32)
    extrapolated = f32(1.0) / pos_freqs
    interpolated = f32(1.0) / (f32(s["factor"]) * pos_freqs)
    ramp = np.clip((np.arange(d // 2, dtype=f32) - f32(low)) / f32(high - low), f32(0.0), f32(1.0))
    keep = f32(1.0) - ramp  # transformers' inv_freq_extrapolation_factor
    return (interpolated * (f32(1.0) - keep) + extrapolated * keep).astype(f32)


def check_rope_scaling(s: dict | None, key: str, source: str) -> None:
    """Factors that divide frequencies must be > 0, and llama3's blend divides by
    high_freq_factor - low_freq_factor."""
    if s is None or s["type"] == "freq_factors":
        return
    if s["type"] == "longrope":  # factors and lengths: _longrope, the file's tensors, validate
        as_float(s["attention_factor"], f"{key}.attention_factor", source, gt=0.0)
        return
    as_float(s["factor"], f"{key}.factor", source, gt=0.0)
    if s["type"] == "yarn":
        as_count(s["original_max_position_embeddings"], f"{key}.original_max_position_embeddings",
                 source, "original_max_position_embeddings")
        slow = as_float(s["beta_slow"], f"{key}.beta_slow", source, gt=0.0)
        as_float(s["beta_fast"], f"{key}.beta_fast", source, lo=slow)
        as_float(s["attention_factor"], f"{key}.attention_factor", source, gt=0.0)
        as_bool(s["truncate"], f"{key}.truncate", source)
        return
    if s["type"] == "llama3":
        low = as_float(s["low_freq_factor"], f"{key}.low_freq_factor", source, gt=0.0)
        as_float(s["high_freq_factor"], f"{key}.high_freq_factor", source, gt=low)
        as_count(s["original_max_position_embeddings"], f"{key}.original_max_position_embeddings",
                 source, "original_max_position_embeddings")


def rope_freq_factors(cfg: ModelConfig) -> np.ndarray | None:
    """Per-frequency divisors (head_dim/2,) that llama3 scaling applies to
    theta_i = rope_theta**(-2i/head_dim), the same numbers llama.cpp's converter
    stores as rope_freqs.weight. None when the config has no llama3 scaling."""
    s = cfg.rope_scaling
    if not s or s["type"] != "llama3":
        return None
    inv_freq = cfg.rope_theta ** (-np.arange(0, cfg.head_dim, 2, dtype=np.float64) / cfg.head_dim)
    wavelen = 2 * math.pi / inv_freq
    old = s["original_max_position_embeddings"]
    low_wavelen = old / s["low_freq_factor"]
    high_wavelen = old / s["high_freq_factor"]
    smooth = (old / wavelen - s["low_freq_factor"]) / (s["high_freq_factor"] - s["low_freq_factor"])
    # long wavelengths are slowed by `factor`, short ones kept, the band between blended
    factors = np.where(wavelen > low_wavelen, s["factor"],
                       np.where(wavelen < high_wavelen, 1.0, 1.0 / ((1 - smooth) / s["factor"] + smooth)))
    return factors.astype(np.float32)


def sliding_pattern_types(n_layers: int, pattern: int) -> tuple[str, ...]:
    """Gemma3's pattern: every `pattern`-th layer (1-based) is full, the rest sliding."""
    if pattern <= 0:
        return ("sliding",) * n_layers
    return tuple("full" if i % pattern == pattern - 1 else "sliding" for i in range(n_layers))


def eog_ids(tokens: Mapping[str, int], *explicit: Any) -> tuple[int, ...]:
    """End-of-generation ids: the explicit ones (ints, lists or None) plus the
    special tokens llama.cpp recognises as ends of turn by their text."""
    ids: set[int] = set()
    for e in explicit:
        if isinstance(e, (list, tuple)):
            ids.update(int(x) for x in e)
        elif e is not None:
            ids.add(int(e))
    ids.update(i for text, i in tokens.items() if text in EOG_TEXTS)
    return tuple(sorted(ids))

