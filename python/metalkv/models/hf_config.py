"""Hugging Face config.json -> ModelConfig. Reads both spellings transformers has
used: rope_theta + rope_scaling (<= 4.x, what hub repos carry) and
rope_parameters (5.x, per layer kind for gemma3)."""
from __future__ import annotations

import math
from typing import Any, Mapping

from .config import (ModelConfig, eog_ids, normalize_arch, normalize_rope_scaling,
                     sliding_pattern_types)
from .tensor import ModelLoadError

_ACTS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}
_LAYER_TYPES = {"full_attention": "full", "sliding_attention": "sliding"}


def config_from_hf(c: Mapping[str, Any], source: str, *,
                   generation_config: Mapping[str, Any] | None = None,
                   special_tokens: Mapping[str, int] | None = None) -> ModelConfig:
    """special_tokens: the tokenizer's added tokens (text -> id), used to find the
    end-of-turn ids llama.cpp would stop on; generation_config may add eos ids."""
    top = c
    if c.get("model_type") == "gemma3" and isinstance(c.get("text_config"), dict):
        # Gemma3ForConditionalGeneration: the language model's config is nested
        c = {"model_type": "gemma3_text", "tie_word_embeddings": top.get("tie_word_embeddings", True),
             **c["text_config"]}
    model_type = c.get("model_type")
    arch = normalize_arch(model_type, source)
    gemma = arch == "gemma3"

    def req(key: str) -> Any:
        if c.get(key) is None:
            raise ModelLoadError(f"[config] {source}: config.json lacks {key!r}")
        return c[key]

    hidden, n_heads, n_layers = int(req("hidden_size")), int(req("num_attention_heads")), \
        int(req("num_hidden_layers"))
    if c.get("mlp_bias"):
        raise ModelLoadError(f"[config] {source}: mlp_bias=true is not supported")
    act_name = c.get("hidden_activation") or c.get("hidden_act") or ("gelu_pytorch_tanh" if gemma else "silu")
    if act_name not in _ACTS:
        raise ModelLoadError(f"[config] {source}: activation {act_name!r} is not supported "
                             f"(supported: {', '.join(_ACTS)})")
    theta, scaling, local_theta = _rope(c, gemma, source)
    gen = generation_config or {}
    kw: dict[str, Any] = dict(
        arch=arch, n_layers=n_layers, hidden=hidden, n_heads=n_heads,
        n_kv_heads=int(c.get("num_key_value_heads") or n_heads),
        head_dim=int(c.get("head_dim") or (256 if gemma else hidden // n_heads)),
        ffn_hidden=int(req("intermediate_size")), vocab=int(req("vocab_size")),
        rms_eps=float(c.get("rms_norm_eps", 1e-6)), rope_theta=theta,
        rope_style="neox",  # HF checkpoints keep q/k rows in rotate_half order
        context_length=int(c.get("max_position_embeddings") or (131072 if gemma else 2048)),
        tie_embeddings=bool(c.get("tie_word_embeddings", gemma)),
        hidden_act=_ACTS[act_name], rope_scaling=scaling,
        attn_bias=bool(c.get("attention_bias", model_type == "qwen2")),
        bos_id=c.get("bos_token_id", gen.get("bos_token_id")),
        eos_ids=eog_ids(special_tokens or {}, c.get("eos_token_id"), gen.get("eos_token_id")),
        source_arch=model_type, source_format="safetensors",
    )
    types = tuple(_LAYER_TYPES.get(t, t) for t in c.get("layer_types") or ())
    if gemma:
        if not types:
            pattern = c.get("sliding_window_pattern") or c.get("_sliding_window_pattern") or 6
            types = sliding_pattern_types(n_layers, int(pattern))
        kw.update(
            sliding_window=int(c.get("sliding_window") or 4096),
            rope_local_base_freq=local_theta,
            query_pre_attn_scalar=float(c.get("query_pre_attn_scalar") or 256),
            attn_logit_softcap=c.get("attn_logit_softcapping") or None,
            final_logit_softcap=c.get("final_logit_softcapping") or None,
            embedding_scale=math.sqrt(hidden),
            norm_weight_offset=1.0,  # Gemma3RMSNorm computes x * (1 + w)
        )
    elif "sliding" in types:
        kw["sliding_window"] = int(req("sliding_window"))
    if types:
        bad = sorted(set(types) - {"full", "sliding"})
        if bad:
            raise ModelLoadError(f"[config] {source}: layer types {bad} are not supported "
                                 f"(supported: full_attention, sliding_attention)")
        kw["layer_types"] = types
    return ModelConfig(**kw).validate(source)


def _rope(c: Mapping[str, Any], gemma: bool, source: str) -> tuple[float, dict | None, float | None]:
    """(theta, scaling of full layers, theta of gemma's sliding layers)."""
    rp = c.get("rope_parameters")
    local: Mapping[str, Any] = {}
    if isinstance(rp, dict) and "full_attention" in rp:
        full, local = rp["full_attention"], rp.get("sliding_attention") or {}
    elif isinstance(rp, dict):
        full = rp
    else:
        full = c.get("rope_scaling") or {}
    theta = full.get("rope_theta") or c.get("rope_theta") or (1e6 if gemma else 10000.0)
    if normalize_rope_scaling(local, source) is not None:
        raise ModelLoadError(f"[config] {source}: rope scaling on sliding layers is not supported")
    local_theta = None
    if gemma:
        local_theta = float(local.get("rope_theta") or c.get("rope_local_base_freq") or 10000.0)
    return float(theta), normalize_rope_scaling(full, source), local_theta
