"""Tiny random-weight transformers models, built offline from configs, and the
transformers-side reference (logits, greedy tokens) the parity tests compare with.

Weights are drawn with torch.manual_seed, then rounded so that they are exact
in float16 and in the dtype the checkpoint is saved in (float32, float16 or
bfloat16: one model each way, so every loader path runs). Whatever metalkv then
keeps its matrices in (f16 or f32), both sides compute with the very same
weights, and the only intended difference left is the f16 K/V cache (plus
float32 summation order).

Init scales are larger than transformers' 0.02 on purpose: with 0.02 the
attention scores are ~1e-3 (uniform attention) and the logits nearly flat, which
would test little. Here q.k/sqrt(d) and the logits come out O(1), and norm
weights and biases are random too, so a wrong scale, offset or bias shows.
"""
from __future__ import annotations

import copy
import pathlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# NAMES: head_dim 64, 128 or 256; the kernels' other sizes are HEAD_DIM_NAMES below.
SPECS: dict[str, dict[str, Any]] = {
    # GQA (4 query heads on 2 kv heads), untied lm_head, q width 256 != hidden 128.
    "llama_gqa": dict(
        model_type="llama", vocab_size=384, hidden_size=128, intermediate_size=256,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False, max_position_embeddings=512, save_dtype="float32"),
    # MQA, tied embeddings, llama3 rope scaling whose original context (16) is short
    # enough that all three frequency bands (kept, blended, slowed) occur at head_dim 128.
    "llama_tied_llama3": dict(
        model_type="llama", vocab_size=320, hidden_size=128, intermediate_size=192,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=128,
        rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=512,
        rope_parameters={"rope_type": "llama3", "rope_theta": 50000.0, "factor": 4.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 16},
        save_dtype="bfloat16"),
    # q/k/v bias (qwen2's config has no attention_bias key: the bias is implied).
    "qwen2": dict(
        model_type="qwen2", vocab_size=256, hidden_size=128, intermediate_size=256,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        tie_word_embeddings=False, max_position_embeddings=512, save_dtype="float16"),
    # Gemma3 text: 5 sliding + 1 full + 1 sliding (the default pattern of 6), window 8,
    # per-type rope base, QK-norm, query_pre_attn_scalar != head_dim, GeGLU, sqrt(hidden)
    # embedding scale, (1 + w) norms, four norms per layer, tied embeddings.
    "gemma3": dict(
        model_type="gemma3_text", vocab_size=288, hidden_size=128, intermediate_size=256,
        num_hidden_layers=7, num_attention_heads=2, num_key_value_heads=1, head_dim=256,
        rms_norm_eps=1e-6, sliding_window=8, query_pre_attn_scalar=128,
        layer_types=["sliding_attention"] * 5 + ["full_attention", "sliding_attention"],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
        max_position_embeddings=512, save_dtype="float16"),
    # Gemma3 with linear rope scaling on the full layers, alternating layer types, GQA.
    "gemma3_linear": dict(
        model_type="gemma3_text", vocab_size=256, hidden_size=64, intermediate_size=160,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        rms_norm_eps=1e-6, sliding_window=8, query_pre_attn_scalar=48,
        layer_types=["sliding_attention", "full_attention"] * 2,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
        max_position_embeddings=512, save_dtype="float32"),
    # Qwen3: per-head q/k RMSNorm (weights 1 + w, no offset), no q/k/v bias, q width 256 != hidden.
    "qwen3": dict(
        model_type="qwen3", vocab_size=272, hidden_size=128, intermediate_size=192,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        tie_word_embeddings=True, max_position_embeddings=512, save_dtype="bfloat16"),
    # Mistral: a llama with a sliding window (8 < the sequences) on every layer.
    "mistral": dict(
        model_type="mistral", vocab_size=256, hidden_size=128, intermediate_size=256,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1, head_dim=64,
        rms_norm_eps=1e-5, sliding_window=8, rope_parameters={"rope_type": "default", "rope_theta": 1e4},
        tie_word_embeddings=False, max_position_embeddings=512, save_dtype="float16"),
    # Phi-3 (Phi-4-like: no window): fused qkv_proj and gate_up_proj, full rotary, GQA.
    "phi3": dict(
        model_type="phi3", vocab_size=256, hidden_size=256, intermediate_size=192,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 1e4},
        sliding_window=None, tie_word_embeddings=False, max_position_embeddings=512,
        original_max_position_embeddings=512, save_dtype="float32"),
    # Phi-3 with partial rotary (64 of head_dim 128 rotate, Phi-4-mini-like) and Phi-3-mini's
    # sliding window on every layer.
    "phi3_partial": dict(
        model_type="phi3", vocab_size=288, hidden_size=256, intermediate_size=256,
        num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1,
        rms_norm_eps=1e-5, sliding_window=8,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5},
        tie_word_embeddings=True, max_position_embeddings=512, original_max_position_embeddings=512,
        save_dtype="float16"),
    # Phi-3 with LongRoPE (Phi-3-mini-128k-like: whole-head rotary): the 40-token prompts exceed
    # original_max_position_embeddings = 32, so transformers runs the long factors, as metalkv
    # does for a cache of more than 32 tokens; test_longrope_short_factors takes a shorter one.
    # The attention factor scales cos and sin, so K in the cache: metalkv scales the scores
    # by its square instead, which rounds K to f16 the same way only for a power of two
    # (the default sqrt(1 + ln(512 / 32) / ln(32)) is checked in tests/models/test_config.py).
    "phi3_longrope": dict(
        model_type="phi3", vocab_size=256, hidden_size=128, intermediate_size=192,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        rms_norm_eps=1e-5, sliding_window=None,
        rope_parameters={"rope_type": "longrope", "rope_theta": 1e4,
                         "short_factor": [1.0 + 0.05 * i for i in range(32)],
                         "long_factor": [1.0 + 0.5 * i for i in range(32)], "attention_factor": 2.0},
        tie_word_embeddings=False, max_position_embeddings=512, original_max_position_embeddings=32,
        save_dtype="float16"),
    # Qwen2 with YaRN (Qwen2.5-long-context-like, factor 4): with original 512, base 1e4 and
    # head_dim 64 the correction dims of beta_fast 32 and beta_slow 1 are pairs 3 and 16 (of 32),
    # so the extrapolated, ramped and interpolated frequencies all occur. The attention factor
    # is a power of two for the reason phi3_longrope's is (the default 1 + 0.1 ln 4 rounds K
    # differently, as much as f16 K/V itself: tests/models/test_rope_yarn.py checks it, and
    # test_gguf_vs_hf.py[qwen2_yarn] runs it).
    "qwen2_yarn": dict(
        model_type="qwen2", vocab_size=256, hidden_size=128, intermediate_size=192,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
                                            "original_max_position_embeddings": 512,
                                            "attention_factor": 2.0},
        tie_word_embeddings=False, max_position_embeddings=2048, save_dtype="float16"),
    # Gemma 2: sliding (window 8) and full layers alternating, attention and final logit
    # soft-capping low enough to bend these models' scores and logits, sandwich norms, (1 + w)
    # norms, query_pre_attn_scalar != head_dim, GeGLU, sqrt(hidden) embedding scale.
    "gemma2": dict(
        model_type="gemma2", vocab_size=256, hidden_size=128, intermediate_size=192,
        num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1, head_dim=128,
        rms_norm_eps=1e-6, sliding_window=8, query_pre_attn_scalar=96,
        attn_logit_softcapping=4.0, final_logit_softcapping=6.0,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4},
        max_position_embeddings=512, save_dtype="bfloat16"),
}
NAMES = tuple(SPECS)

# One tiny llama per head size of the attention kernels (cpp/ops/attention.h) that
# the models above do not use; test_head_dims_cover_the_kernels checks the two agree.
HEAD_DIMS = (32, 80, 96, 112, 160, 192)
for _d in HEAD_DIMS:
    SPECS[f"llama_d{_d}"] = dict(
        model_type="llama", vocab_size=256, hidden_size=128, intermediate_size=192,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=_d,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 1e4},
        tie_word_embeddings=False, max_position_embeddings=512, save_dtype="float16")
HEAD_DIM_NAMES = tuple(f"llama_d{d}" for d in HEAD_DIMS)

# Gemma 3n (Gemma3nForCausalLM): 4 AltUp streams, LAuReL, per-layer inputs of 16 (a per-layer
# table smaller than the vocabulary, so some prompt ids fall outside it), v norm, scores
# unscaled, x * w norms, window 8, and the last layers reading earlier layers' K and V. Apart
# from NAMES until the engine runs them (tests/engine/test_gemma3n.py).
_GEMMA3N = dict(model_type="gemma3n_text", rms_norm_eps=1e-6, sliding_window=8, altup_num_inputs=4,
                hidden_size_per_layer_input=16, laurel_rank=8, max_position_embeddings=512,
                rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                 "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
_S, _F = "sliding_attention", "full_attention"
GEMMA3N_SPECS: dict[str, dict[str, Any]] = {
    # E2B's head_dim 256 and GQA 2:1, q width 512 != hidden; sparse ffn gates on the first three
    # layers (0.95, E2B's); 8 layers, the last 3 reading: 5 and 7 (full) read 2, 6 (sliding) reads 4.
    "gemma3n": dict(
        _GEMMA3N, vocab_size=288, vocab_size_per_layer_input=256, hidden_size=128, intermediate_size=256,
        num_hidden_layers=8, num_attention_heads=2, num_key_value_heads=1, head_dim=256,
        layer_types=[_S, _S, _F, _S, _S, _F, _S, _F], num_kv_shared_layers=3,
        activation_sparsity_pattern=[0.95] * 3 + [0.0] * 5, save_dtype="float16"),
    # head_dim 64, GQA 4:2, no sparsity and no sharing, alternating types, a final soft-cap that
    # bends the logits.
    "gemma3n_d64": dict(
        _GEMMA3N, vocab_size=256, vocab_size_per_layer_input=200, hidden_size=128, intermediate_size=192,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        layer_types=[_S, _F] * 2, num_kv_shared_layers=0, final_logit_softcapping=4.0,
        activation_sparsity_pattern=[0.0] * 4, save_dtype="bfloat16"),
    # Most layers reading (4 of 6: 2 and 4 read 0, 3 and 5 read 1), two sparsities, transformers'
    # default pattern of layer types (every 5th full) replaced by its own.
    "gemma3n_shared": dict(
        _GEMMA3N, vocab_size=256, vocab_size_per_layer_input=256, hidden_size=64, intermediate_size=128,
        num_hidden_layers=6, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
        layer_types=[_S, _F] * 3, num_kv_shared_layers=4,
        activation_sparsity_pattern=[0.95, 0.75] + [0.0] * 4, save_dtype="float32"),
}
SPECS.update(GEMMA3N_SPECS)
GEMMA3N_NAMES = tuple(GEMMA3N_SPECS)
WEIGHT_STD = 0.1  # see the module docstring
NORM_STD = 0.1    # norm weights: 1 + N(0, 0.1²) (llama) or N(0, 0.1²) (gemma's w of x * (1 + w))
BIAS_STD = 0.1


def hf_config(name: str):
    from transformers import AutoConfig

    spec = dict(SPECS[name])
    model_type = spec.pop("model_type")
    spec.pop("save_dtype")
    # No eos and no bos: the greedy tests run a fixed number of steps.
    return AutoConfig.for_model(model_type, bos_token_id=None, eos_token_id=None,
                                pad_token_id=None, **spec)


def _gemma3n_std(pname: str, cfg) -> tuple[float, float] | None:
    """(mean, std) of a Gemma 3n weight where the generic scales would test little: the
    router sees router_norm(x) / hidden, so its weights are ~sqrt(hidden) for tanh's input to
    be O(1) and AltUp's coefficients to mix the streams by ~20 %; with unscaled scores, the
    q and k norms' weights ~head_dim**-0.25 keep q.k O(1); correct_output_scale is
    zero-initialised by transformers, which would silence the per-layer inputs."""
    if pname.endswith("modality_router.weight"):
        return 0.0, 0.5 * cfg.hidden_size ** 0.5
    if pname.endswith(("q_norm.weight", "k_norm.weight")):
        return cfg.head_dim ** -0.25, NORM_STD * cfg.head_dim ** -0.25
    if pname.endswith("correct_output_scale"):
        return 1.0, NORM_STD
    return None


def build_model(name: str, seed: int = 0):
    """A float32 transformers CausalLM with f16-representable random weights."""
    import torch
    from transformers import AutoModelForCausalLM

    cfg = hf_config(name)
    torch.manual_seed(seed)
    # Soft-capped attention runs eager: SDPA has no soft-cap, and transformers up to
    # 5.17 picked SDPA for Gemma 2 anyway, silently dropping the cap (5.24 refuses SDPA).
    attn = "eager" if getattr(cfg, "attn_logit_softcapping", None) else None
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation=attn)
    gemma = cfg.model_type in ("gemma2", "gemma3_text")  # (1 + w) norms; Gemma 3n's take w itself
    with torch.no_grad():
        for pname, p in model.named_parameters():  # tied weights appear once
            special = _gemma3n_std(pname, cfg) if cfg.model_type == "gemma3n_text" else None
            if special is not None:
                p.copy_(special[0] + special[1] * torch.randn_like(p))
            elif pname.endswith("norm.weight"):
                p.copy_((0.0 if gemma else 1.0) + NORM_STD * torch.randn_like(p))
            elif pname.endswith(".bias"):
                p.copy_(BIAS_STD * torch.randn_like(p))
            else:
                p.copy_(WEIGHT_STD * torch.randn_like(p))
            if SPECS[name]["save_dtype"] == "bfloat16":
                # bf16 values are f16 values too, except below f16's normal range
                p.copy_(p.bfloat16().float())
                p.masked_fill_(p.abs() < 2.0**-14, 0.0)
            p.copy_(p.half().float())
    if cfg.model_type == "gemma3n_text":
        _per_layer_ids_outside_read_row_0(model)
    return model.eval()


def _per_layer_ids_outside_read_row_0(model) -> None:
    """Ids outside Gemma 3n's per-layer table read its row 0 (transformers 5.24's rule, and
    metalkv's). transformers 5.17 indexes the table with them (an IndexError), so the
    reference clamps them itself first: a no-op where transformers does."""
    import torch

    inner = model.model
    original = inner.get_per_layer_inputs

    def clamped(input_ids):
        inside = (input_ids >= 0) & (input_ids < inner.config.vocab_size_per_layer_input)
        return original(torch.where(inside, input_ids, 0))

    inner.get_per_layer_inputs = clamped


def save_model(model, name: str, d: pathlib.Path) -> pathlib.Path:
    """safetensors in the spec's save_dtype; lossless, as the weights were rounded for it."""
    import torch

    d.mkdir(parents=True, exist_ok=True)
    # A copy: .to(dtype) also rounds buffers such as rope's inv_freq, and the
    # reference must keep computing those in float32.
    copy.deepcopy(model).to(getattr(torch, SPECS[name]["save_dtype"])).save_pretrained(str(d))
    return d


# ---- reference side ---------------------------------------------------------

_F16KV = {"sdpa": "metalkv_f16kv", "eager": "metalkv_f16kv_eager"}


def _register_f16kv() -> None:
    """Attention implementations that round K and V to float16 (after rope and
    QK-norm, as metalkv's cache stores them) and otherwise are transformers' sdpa,
    or, for models sdpa cannot run (Gemma 2's soft-capping), the model's own eager
    attention."""
    import sys

    import torch
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask, sdpa_mask

    def rounded(t, like):
        return t.to(torch.float16).to(like.dtype)

    def f16kv(module, query, key, value, attention_mask, **kw):
        return sdpa_attention_forward(module, query, rounded(key, query), rounded(value, query),
                                      attention_mask, **kw)

    def f16kv_eager(module, query, key, value, attention_mask, **kw):
        eager = sys.modules[type(module).__module__].eager_attention_forward
        return eager(module, query, rounded(key, query), rounded(value, query), attention_mask, **kw)

    AttentionInterface.register(_F16KV["sdpa"], f16kv)
    AttentionInterface.register(_F16KV["eager"], f16kv_eager)
    # and their masks: without this, transformers builds no mask for an unknown
    # implementation and the sliding window is lost (gemma3 logits off by ~5)
    ALL_MASK_ATTENTION_FUNCTIONS.register(_F16KV["sdpa"], sdpa_mask)
    ALL_MASK_ATTENTION_FUNCTIONS.register(_F16KV["eager"], eager_mask)


@dataclass
class Reference:
    """One tiny model on disk and transformers' answers about it."""
    name: str
    path: pathlib.Path
    model: Any = field(repr=False)
    _model64: Any = field(default=None, repr=False)

    def logits(self, ids: list[int], *, f16_kv: bool = False, float64: bool = False) -> np.ndarray:
        """(n, vocab) logits of transformers at every position (as float64 when
        float64, else float32). f16_kv: with K/V rounded to float16 like metalkv's
        cache. float64: the same model computed in float64 (rope angles stay
        float32 in transformers), the exact answer to compare float32 runs with."""
        import torch

        model = self.model
        if float64:
            if self._model64 is None:
                self._model64 = copy.deepcopy(self.model).double()
            model = self._model64
        base = self.model.config._attn_implementation  # "sdpa", or "eager" where sdpa cannot run
        model.set_attn_implementation(_F16KV[base] if f16_kv else base)
        try:
            with torch.no_grad():
                out = model(torch.tensor([ids]), use_cache=False)
        finally:
            model.set_attn_implementation(base)
        return out.logits[0].numpy()

    def greedy(self, ids: list[int], steps: int) -> tuple[list[int], np.ndarray]:
        """model.generate(do_sample=False) tokens, and per step the top-2 margin of the
        logits they were chosen from (float32 K/V)."""
        import torch

        x = torch.tensor([ids])
        with torch.no_grad():
            # an explicit mask: without one generate masks every prompt token equal to pad_token_id
            out = self.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                                      max_new_tokens=steps, min_new_tokens=steps, output_logits=True,
                                      return_dict_in_generate=True, pad_token_id=0)
        toks = out.sequences[0, len(ids):].tolist()
        margins = np.array([top2_margin(lg[0].float().numpy()) for lg in out.logits])
        return toks, margins


def top2_margin(row: np.ndarray) -> float:
    top = np.sort(row)[-2:]
    return float(top[1] - top[0])


def build_all(root: pathlib.Path, names=NAMES) -> dict[str, Reference]:
    _register_f16kv()
    refs = {}
    for name in names:
        model = build_model(name, seed=1000 + list(SPECS).index(name))  # the same weights in any subset
        refs[name] = Reference(name, save_model(model, name, root / name), model)
    return refs
