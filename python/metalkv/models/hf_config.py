"""Hugging Face config.json -> ModelConfig. Reads both spellings transformers has
used: rope_theta + rope_scaling (<= 4.x, what hub repos carry) and
rope_parameters (5.x, per layer kind for gemma3). Every key is checked for type
and range where it is read (values.py); null means "not given" as in transformers."""
from __future__ import annotations

import math
from typing import Any, Mapping

from . import gemma3n
from .architectures import ARCHITECTURES, normalize_arch
from .config import ModelConfig, eog_ids, normalize_rope_scaling, sliding_pattern_types
from .errors import ModelLoadError
from .values import as_bool, as_count, as_float, as_int, as_list, as_str, as_token_id, describe

_ACTS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}
_LAYER_TYPES = {"full_attention": "full", "sliding_attention": "sliding"}


class _Keys:
    """Typed access to config.json keys, naming the key in every error."""

    def __init__(self, c: Mapping[str, Any], source: str):
        self.c, self.source = c, source

    def get(self, key: str) -> Any:
        return self.c.get(key)

    def req(self, key: str) -> Any:
        if self.c.get(key) is None:
            raise ModelLoadError(f"[config] {self.source}: config.json lacks {key!r}")
        return self.c[key]

    def count(self, key: str, field: str, default: Any = None) -> int:
        v = self.c.get(key)
        return as_count(default if v is None else v, key, self.source, field)

    def float(self, key: str, default: float, **bounds) -> float:
        v = self.c.get(key)
        return as_float(default if v is None else v, key, self.source, **bounds)

    def bool(self, key: str, default: bool) -> bool:
        v = self.c.get(key)
        return default if v is None else as_bool(v, key, self.source)

    def str(self, key: str, default: str | None = None) -> str | None:
        v = self.c.get(key)
        return default if v is None else as_str(v, key, self.source)


def config_from_hf(c: Mapping[str, Any], source: str, *,
                   generation_config: Mapping[str, Any] | None = None,
                   special_tokens: Mapping[str, int] | None = None) -> ModelConfig:
    """special_tokens: the tokenizer's added tokens (text -> id), used to find the
    end-of-turn ids llama.cpp would stop on; generation_config may add eos ids."""
    if not isinstance(c, dict):
        raise ModelLoadError(f"[config] {source}: config.json is {describe(c)}; expected an object")
    top = c
    if c.get("model_type") in _MULTIMODAL and c.get("text_config") is not None:
        # Gemma3(n)ForConditionalGeneration: the language model's config is nested; towers ignored
        if not isinstance(c["text_config"], dict):
            raise ModelLoadError(f"[config] {source}: text_config is {describe(c['text_config'])}; "
                                 f"expected an object")
        c = {"model_type": _MULTIMODAL[c["model_type"]],
             "tie_word_embeddings": top.get("tie_word_embeddings", True), **c["text_config"]}
    k = _Keys(c, source)
    model_type = k.str("model_type")
    arch = normalize_arch(model_type, source)
    traits = ARCHITECTURES[arch]
    gemma = traits.gemma or traits.altup  # Gemma 3n shares Gemma's defaults (GeGLU, head_dim 256, tied)
    hidden = k.count("hidden_size", "hidden", k.req("hidden_size"))
    n_heads = k.count("num_attention_heads", "n_heads", k.req("num_attention_heads"))
    n_layers = k.count("num_hidden_layers", "n_layers", k.req("num_hidden_layers"))
    if k.bool("mlp_bias", False):
        raise ModelLoadError(f"[config] {source}: mlp_bias=true is not supported")
    act_name = k.str("hidden_activation") or k.str("hidden_act") or ("gelu_pytorch_tanh" if gemma else "silu")
    if act_name not in _ACTS:
        raise ModelLoadError(f"[config] {source}: activation {act_name!r} is not supported "
                             f"(supported: {', '.join(_ACTS)})")
    theta, scaling, local_theta = _rope(c, arch, source)
    vocab = k.count("vocab_size", "vocab", k.req("vocab_size"))
    head_dim = k.count("head_dim", "head_dim", 256 if gemma else _head_dim(hidden, n_heads, source))
    kw: dict[str, Any] = dict(
        arch=arch, n_layers=n_layers, hidden=hidden, n_heads=n_heads,
        n_kv_heads=k.count("num_key_value_heads", "n_kv_heads", n_heads), head_dim=head_dim,
        ffn_hidden=_ffn_hidden(k, n_layers), vocab=vocab,
        rms_eps=k.float("rms_norm_eps", 1e-6, gt=0.0, hi=1.0), rope_theta=theta,
        rope_style="neox",  # HF checkpoints keep q/k rows in rotate_half order
        rotary_dim=_rotary_dim(c, arch, head_dim, source),
        context_length=k.count("max_position_embeddings", "context_length", _CONTEXT.get(arch, 2048)),
        tie_embeddings=k.bool("tie_word_embeddings", gemma),
        hidden_act=_ACTS[act_name], rope_scaling=scaling,
        attn_bias=k.bool("attention_bias", model_type == "qwen2"),
        **_special_ids(c, generation_config or {}, special_tokens or {}, vocab, source),
        source_arch=model_type, source_format="safetensors",
    )
    types = _layer_types(k, n_layers) or _default_layer_types(k, model_type, n_layers)
    if traits.altup:
        kw.update(gemma3n.from_hf(k, n_layers, hidden, local_theta, types))
    elif gemma:
        kw.update(_gemma(k, arch, n_layers, hidden, local_theta, types))
    else:
        if "sliding" in types:
            kw["sliding_window"] = k.count("sliding_window", "sliding_window", k.req("sliding_window"))
        if types:
            kw["layer_types"] = types
    return ModelConfig(**kw).validate(source)


_CONTEXT = {"gemma3": 131072, "gemma2": 8192, "qwen3": 32768, "phi3": 4096,
            "gemma3n": 32768}  # transformers' defaults
_MULTIMODAL = {"gemma3": "gemma3_text", "gemma3n": "gemma3n_text"}  # model_type -> text_config's


def _ffn_hidden(k: _Keys, n_layers: int) -> int:
    """intermediate_size: one int, or (Gemma 3n) one per layer, which must all be equal."""
    v = k.req("intermediate_size")
    if not isinstance(v, list):
        return k.count("intermediate_size", "ffn_hidden")
    sizes = as_list(v, "intermediate_size", k.source, "int")
    if len(sizes) != n_layers or len(set(sizes)) != 1:
        raise ModelLoadError(f"[config] {k.source}: intermediate_size is a per-layer list {sizes[:8]}"
                             f"{'...' if len(sizes) > 8 else ''} of {len(sizes)} sizes; metalkv needs one "
                             f"size for all {n_layers} layers")
    return as_count(sizes[0], "intermediate_size[0]", k.source, "ffn_hidden")


def _rotary_dim(c: Mapping[str, Any], arch: str, head_dim: int, source: str) -> int | None:
    """int(head_dim * partial_rotary_factor), as transformers computes it; the factor
    sits at the top level (<= 4.x) or inside rope_parameters (5.x)."""
    rp = c.get("rope_parameters")
    inner = rp.get("partial_rotary_factor") if isinstance(rp, dict) else None
    key = "rope_parameters.partial_rotary_factor" if inner is not None else "partial_rotary_factor"
    v = inner if inner is not None else c.get("partial_rotary_factor")
    if v is None:
        return None
    factor = as_float(v, key, source, gt=0.0, hi=1.0)
    if factor == 1.0:
        return None
    if not ARCHITECTURES[arch].partial_rotary:
        raise ModelLoadError(f"[config] {source}: {key} = {factor:g}, but {arch} models rotate the whole "
                             f"head; partial rotary is supported for "
                             f"{', '.join(a for a, t in ARCHITECTURES.items() if t.partial_rotary)}")
    dim = int(head_dim * factor)
    if dim < 2 or dim % 2:
        raise ModelLoadError(f"[config] {source}: {key} = {factor:g} rotates {dim} of head_dim={head_dim} "
                             f"dims; expected an even number >= 2")
    return dim


def _default_layer_types(k: _Keys, model_type: str, n_layers: int) -> tuple[str, ...]:
    """Layer kinds when config.json has no layer_types, as transformers derives them:
    Mistral and Phi-3 slide on every layer when sliding_window is set; Qwen2/3 only
    with use_sliding_window, from layer max_window_layers on; Gemma 2 alternates
    (even layers sliding); Gemma 3 follows its pattern (_gemma)."""
    window = k.get("sliding_window")
    if model_type in ("mistral", "phi3") and window is not None:
        return ("sliding",) * n_layers
    if model_type in ("qwen2", "qwen3") and window is not None and k.bool("use_sliding_window", False):
        first = as_int(k.get("max_window_layers") or 0, "max_window_layers", k.source, 0, n_layers)
        return tuple("sliding" if i >= first else "full" for i in range(n_layers))
    if model_type == "gemma2":
        return tuple("sliding" if i % 2 == 0 else "full" for i in range(n_layers))
    return ()


def _head_dim(hidden: int, n_heads: int, source: str) -> int:
    if hidden % n_heads:
        raise ModelLoadError(f"[config] {source}: hidden_size {hidden} is not a multiple of "
                             f"num_attention_heads {n_heads}, and config.json has no head_dim")
    return hidden // n_heads


def _special_ids(c: Mapping[str, Any], gen: Mapping[str, Any], special: Mapping[str, int],
                 vocab: int, source: str) -> dict[str, Any]:
    """bos_id, eos_ids; every *_token_id key of config.json / generation_config.json
    is null, a token id in the vocabulary, or (eos) a list of them."""
    for where, d in (("", c), ("generation_config.json: ", gen)):
        for key, v in d.items():
            if key.endswith("_token_id") and v is not None:
                for i, x in enumerate(v if isinstance(v, list) else [v]):
                    as_token_id(x, f"{where}{key}" + (f"[{i}]" if isinstance(v, list) else ""),
                                source, vocab)
    bos = c.get("bos_token_id", gen.get("bos_token_id"))
    if isinstance(bos, list):
        raise ModelLoadError(f"[config] {source}: bos_token_id is {describe(bos)}; expected one id")
    # added tokens beyond the embedding can never be sampled, so they cannot end generation
    special = {text: i for text, i in special.items() if 0 <= i < vocab}
    return dict(bos_id=bos, eos_ids=eog_ids(special, c.get("eos_token_id"), gen.get("eos_token_id")))


def _layer_types(k: _Keys, n_layers: int) -> tuple[str, ...]:
    raw = k.get("layer_types")
    if raw is None:
        return ()
    names = as_list(raw, "layer_types", k.source, "str")
    bad = sorted(set(names) - set(_LAYER_TYPES))
    if bad:
        raise ModelLoadError(f"[config] {k.source}: layer types {bad} are not supported "
                             f"(supported: full_attention, sliding_attention)")
    if len(names) != n_layers:
        raise ModelLoadError(f"[config] {k.source}: layer_types has {len(names)} entries for "
                             f"num_hidden_layers={n_layers}; expected one per layer")
    return tuple(_LAYER_TYPES[t] for t in names)


def _gemma(k: _Keys, arch: str, n_layers: int, hidden: int, local_theta: float | None,
           types: tuple[str, ...]) -> dict[str, Any]:
    if not types:  # gemma3 without layer_types: its sliding window pattern
        v = k.get("sliding_window_pattern")
        v = k.get("_sliding_window_pattern") if v is None else v
        key = "sliding_window_pattern"
        types = sliding_pattern_types(n_layers, as_int(6 if v is None else v, key, k.source, 1))
    # transformers' defaults for an absent key: gemma2 caps at 50 / 30, gemma3 does not; null is off
    defaults = {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0} if arch == "gemma2" else {}

    def cap(key: str) -> float | None:
        if key not in k.c:
            return defaults.get(key)
        return None if k.get(key) is None else (k.float(key, 0.0, lo=0.0) or None)

    caps = dict(attn_logit_softcap=cap("attn_logit_softcapping"),
                final_logit_softcap=cap("final_logit_softcapping"))
    return dict(
        sliding_window=k.count("sliding_window", "sliding_window", 4096),
        rope_local_base_freq=local_theta, layer_types=types,
        query_pre_attn_scalar=k.float("query_pre_attn_scalar", 256.0, gt=0.0),
        embedding_scale=math.sqrt(hidden),
        norm_weight_offset=1.0,  # Gemma's RMSNorm computes x * (1 + w)
        **caps,
    )


def _rope(c: Mapping[str, Any], arch: str, source: str) -> tuple[float, dict | None, float | None]:
    """(theta, scaling of full layers, theta of gemma3's sliding layers)."""
    gemma3 = arch in ("gemma3", "gemma3n")  # a rope base of their own on sliding layers
    rp = c.get("rope_parameters")
    local: Mapping[str, Any] = {}
    key = "rope_parameters"
    if rp is not None and not isinstance(rp, dict):
        raise ModelLoadError(f"[config] {source}: rope_parameters is {describe(rp)}; expected an object")
    if rp and "full_attention" in rp:
        full, local = rp["full_attention"], rp.get("sliding_attention") or {}
        key = "rope_parameters.full_attention"
    elif rp:
        full = rp
    else:
        full, key = c.get("rope_scaling") or {}, "rope_scaling"
    for name, d in ((key, full), ("rope_parameters.sliding_attention", local)):
        if not isinstance(d, dict):
            raise ModelLoadError(f"[config] {source}: {name} is {describe(d)}; expected an object")
    theta = as_float(*_first((key, full, "rope_theta"), ("", c, "rope_theta"),
                             default=1e6 if gemma3 else 10000.0), source, gt=1.0)
    if normalize_rope_scaling(local, source, "rope_parameters.sliding_attention") is not None:
        raise ModelLoadError(f"[config] {source}: rope scaling on sliding layers is not supported")
    local_theta = None
    if gemma3:
        local_theta = as_float(*_first(("rope_parameters.sliding_attention", local, "rope_theta"),
                                       ("", c, "rope_local_base_freq"), default=10000.0), source, gt=1.0)
    return theta, normalize_rope_scaling(full, source, key, top=c), local_theta


def _first(*where: tuple[str, Mapping[str, Any], str], default: Any) -> tuple[Any, str]:
    """(value, its key for messages) of the first (prefix, dict, key) that has a
    non-null value, else (default, the first key)."""
    for prefix, d, key in where:
        if d.get(key) is not None:
            return d[key], f"{prefix}.{key}" if prefix else key
    prefix, _, key = where[0]
    return default, f"{prefix}.{key}" if prefix else key
