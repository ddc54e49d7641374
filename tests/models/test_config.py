"""ModelConfig from the real GGUF and from config.json in every spelling we read."""
from __future__ import annotations

import math

import numpy as np
import pytest

from metalkv.models import ModelLoadError, rope_freq_factors
from metalkv.models.gguf_loader import config_from_gguf
from metalkv.models.hf_config import config_from_hf

from .tiny import gemma3_config, llama_config


def test_smollm2_gguf(smollm):
    c = smollm.config
    assert (c.arch, c.source_arch, c.source_format) == ("llama", "llama", "gguf")
    assert (c.n_layers, c.hidden, c.n_heads, c.n_kv_heads, c.head_dim) == (30, 576, 9, 3, 64)
    assert (c.ffn_hidden, c.vocab, c.context_length) == (1536, 49152, 8192)
    assert c.rope_theta == 100000.0 and c.rope_scaling is None
    assert c.rope_style == "interleaved"  # convert_hf_to_gguf permuted q/k for NORM rope
    assert c.tie_embeddings and not c.attn_bias and c.hidden_act == "silu"
    assert c.rms_eps == pytest.approx(1e-5)
    assert c.layer_types == () and not c.is_sliding(0)
    assert c.embedding_scale == 1.0 and c.norm_weight_offset == 0.0
    assert c.attn_scale == pytest.approx(1 / 8)


def test_smollm2_special_ids_match_llamacpp(smollm, llamacpp_ref):
    assert smollm.config.bos_id == llamacpp_ref["bos_id"]
    assert list(smollm.config.eos_ids) == llamacpp_ref["eog_ids"]  # <|endoftext|>, <|im_end|>, <reponame>


def test_llama_config_json():
    c = config_from_hf(llama_config(), "t")
    assert (c.arch, c.n_layers, c.hidden, c.n_heads, c.n_kv_heads, c.head_dim) == ("llama", 2, 32, 4, 2, 8)
    assert (c.ffn_hidden, c.vocab, c.context_length, c.rope_theta) == (48, 64, 256, 50000.0)
    assert c.rope_style == "neox" and not c.tie_embeddings and c.eos_ids == (2,) and c.bos_id == 1


def test_llama3_rope_both_spellings():
    s = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 8192}
    old = config_from_hf(llama_config(rope_theta=500000.0, rope_scaling={"rope_type": "llama3", **s},
                                      max_position_embeddings=131072), "t")
    new = config_from_hf({**llama_config(max_position_embeddings=131072),
                          "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, **s}}, "t")
    assert old.rope_scaling == new.rope_scaling == {"type": "llama3", **s}
    assert old.rope_theta == new.rope_theta == 500000.0


def test_llama3_freq_factors():
    c = config_from_hf(llama_config(num_attention_heads=1, num_key_value_heads=1, hidden_size=128,
                                    rope_theta=500000.0, rope_scaling={
                                        "type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}), "t")
    f = rope_freq_factors(c).astype(np.float64)
    assert f.shape == (64,)
    # Meta's rule spelled out per frequency: wavelengths beyond 8192 tokens are slowed
    # 8x, those under 2048 kept, the band between interpolated smoothly.
    for i, fi in enumerate(f):
        wavelen = 2 * math.pi * 500000.0 ** (2 * i / 128)
        if wavelen < 8192 / 4:
            assert fi == 1.0
        elif wavelen > 8192 / 1:
            assert fi == 8.0
        else:
            smooth = (8192 / wavelen - 1) / (4 - 1)
            assert 1 / fi == pytest.approx((1 - smooth) / 8 + smooth, rel=1e-6)
    assert rope_freq_factors(config_from_hf(llama_config(), "t")) is None


def test_llama3_freq_factors_match_transformers():
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_cfg = transformers.LlamaConfig(hidden_size=128, num_attention_heads=1, max_position_embeddings=131072,
                                      rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                                                       "factor": 8.0, "low_freq_factor": 1.0,
                                                       "high_freq_factor": 4.0,
                                                       "original_max_position_embeddings": 8192})
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_cfg, "cpu")
    c = config_from_hf(hf_cfg.to_dict(), "t")
    base = 500000.0 ** (-np.arange(0, 128, 2, dtype=np.float64) / 128)
    np.testing.assert_allclose(base / rope_freq_factors(c), inv_freq.double().numpy(), rtol=1e-5)


def test_qwen2_is_llama_with_bias():
    c = config_from_hf(llama_config(model_type="qwen2", tie_word_embeddings=True), "t")
    assert c.arch == "llama" and c.source_arch == "qwen2" and c.attn_bias and c.rope_style == "neox"


def test_gemma3_config_json_4x_spelling():
    c = config_from_hf(gemma3_config(rope_scaling={"rope_type": "linear", "factor": 8.0}), "t")
    assert c.arch == "gemma3" and c.head_dim == 16 and c.hidden_act == "gelu_tanh"
    assert c.layer_types == ("sliding",) * 5 + ("full", "sliding")  # every 6th layer is global
    assert c.sliding_window == 8 and c.rope_theta == 1e6 and c.rope_local_base_freq == 1e4
    assert c.rope_scaling == {"type": "linear", "factor": 8.0}
    assert c.tie_embeddings and c.embedding_scale == pytest.approx(math.sqrt(32))
    assert c.norm_weight_offset == 1.0 and c.attn_scale == pytest.approx(16 ** -0.5)
    assert c.eos_ids == (1, 60) and c.bos_id == 2 and c.final_logit_softcap is None


def test_gemma3_config_json_5x_spelling_and_nested():
    v5 = gemma3_config(layer_types=["full_attention"] + ["sliding_attention"] * 6,
                       rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 5e5},
                                        "sliding_attention": {"rope_type": "default", "rope_theta": 2e4}})
    del v5["rope_theta"], v5["rope_local_base_freq"]
    c = config_from_hf(v5, "t")
    assert c.layer_types == ("full",) + ("sliding",) * 6
    assert (c.rope_theta, c.rope_local_base_freq) == (5e5, 2e4)
    nested = config_from_hf({"model_type": "gemma3", "text_config": gemma3_config()}, "t")
    assert nested.arch == "gemma3" and nested.n_layers == 7


def test_gemma3_matches_transformers_config():
    transformers = pytest.importorskip("transformers")
    hf = transformers.Gemma3TextConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=13,
                                       num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                                       vocab_size=100, sliding_window=32, final_logit_softcapping=30.0)
    c = config_from_hf(hf.to_dict(), "t")
    want = tuple("sliding" if t == "sliding_attention" else "full" for t in hf.layer_types)
    assert c.layer_types == want and c.final_logit_softcap == 30.0
    assert c.query_pre_attn_scalar == hf.query_pre_attn_scalar and c.n_kv_heads == 1


@pytest.mark.parametrize("bad, match", [
    ({"model_type": "mamba"}, r"architecture 'mamba' is not supported; metalkv supports llama, qwen3, phi3, gemma2, gemma3"),
    ({"hidden_size": None}, r"lacks 'hidden_size'"),
    ({"num_key_value_heads": 3}, r"n_heads=4 is not a multiple of n_kv_heads=3"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}, r"rope scaling type 'dynamic' is not "
                                                                r"supported \(supported: linear, llama3, "
                                                                r"longrope, yarn\)"),
    ({"hidden_act": "relu"}, r"activation 'relu' is not supported"),
    ({"mlp_bias": True}, r"mlp_bias"),
])
def test_bad_config_json(bad, match):
    with pytest.raises(ModelLoadError, match=match):
        config_from_hf(llama_config(**bad), "t")


def test_gguf_metadata_errors():
    with pytest.raises(ModelLoadError, match=r"architecture 'falcon' is not supported"):
        config_from_gguf({"general.architecture": "falcon"}, set(), "f.gguf")
    with pytest.raises(ModelLoadError, match=r"lacks llama.block_count"):
        config_from_gguf({"general.architecture": "llama", "llama.attention.head_count": 4,
                          "llama.embedding_length": 32}, set(), "f.gguf")


def test_gguf_gemma3_metadata():
    md = {"general.architecture": "gemma3", "gemma3.block_count": 6, "gemma3.embedding_length": 64,
          "gemma3.attention.head_count": 4, "gemma3.attention.head_count_kv": 1,
          "gemma3.attention.key_length": 32, "gemma3.feed_forward_length": 96,
          "gemma3.attention.layer_norm_rms_epsilon": 1e-6, "gemma3.rope.freq_base": 1e6,
          "gemma3.context_length": 1024, "gemma3.attention.sliding_window": 16,
          "gemma3.rope.scaling.type": "linear", "gemma3.rope.scaling.factor": 8.0,
          "tokenizer.ggml.tokens": ["<pad>", "<eos>", "<bos>"] + ["x"] * 97,
          "tokenizer.ggml.eos_token_id": 1, "tokenizer.ggml.bos_token_id": 2}
    c = config_from_gguf(md, {"output_norm.weight"}, "g.gguf")
    assert c.rope_style == "neox" and c.tie_embeddings and c.vocab == 100
    assert c.layer_types == ("sliding",) * 5 + ("full",) and c.sliding_window == 16
    assert c.rope_local_base_freq == 10000.0 and c.rope_scaling == {"type": "linear", "factor": 8.0}
    assert c.norm_weight_offset == 0.0 and c.query_pre_attn_scalar == 32 and c.eos_ids == (1,)


# -- Qwen3, Mistral, Phi-3, Gemma 2 ---------------------------------------------------------

def test_arch_traits():
    traits = {a: config_from_hf(c, "t").traits for a, c in [
        ("qwen3", llama_config(model_type="qwen3")), ("phi3", llama_config(model_type="phi3")),
        ("gemma2", {**gemma3_config(), "model_type": "gemma2"}), ("gemma3", gemma3_config()),
        ("mistral", llama_config(model_type="mistral"))]}
    assert (traits["qwen3"].qk_norm, traits["qwen3"].sandwich_norms) == (True, False)
    assert (traits["gemma2"].qk_norm, traits["gemma2"].sandwich_norms) == (False, True)
    assert traits["gemma3"].qk_norm and traits["gemma3"].sandwich_norms
    assert traits["phi3"].fused_projections and traits["phi3"].partial_rotary
    assert traits["mistral"] == config_from_hf(llama_config(), "t").traits  # a llama


def test_mistral_window_on_every_layer():
    c = config_from_hf(llama_config(model_type="mistral", sliding_window=4096), "t")
    assert c.arch == "llama" and c.layer_types == ("sliding", "sliding") and c.sliding_window == 4096
    c = config_from_hf(llama_config(model_type="mistral", sliding_window=None), "t")  # v0.2+: full attention
    assert c.layer_types == () and c.sliding_window is None
    # a llama config's sliding_window key means nothing to LlamaAttention, nor to us
    assert config_from_hf(llama_config(sliding_window=8), "t").layer_types == ()


def test_qwen_use_sliding_window():
    """transformers: sliding only with use_sliding_window, from layer max_window_layers on."""
    base = llama_config(model_type="qwen2", num_hidden_layers=4, sliding_window=16, max_window_layers=2)
    assert config_from_hf({**base, "use_sliding_window": False}, "t").layer_types == ()
    c = config_from_hf({**base, "use_sliding_window": True}, "t")
    assert c.layer_types == ("full", "full", "sliding", "sliding") and c.sliding_window == 16


def test_phi3_partial_rotary_both_spellings():
    old = config_from_hf(llama_config(model_type="phi3", hidden_size=64, partial_rotary_factor=0.75), "t")
    new = config_from_hf({**llama_config(model_type="phi3", hidden_size=64),
                          "rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                              "partial_rotary_factor": 0.75}}, "t")
    assert old.head_dim == new.head_dim == 16 and old.rotary_dim == new.rotary_dim == 12
    assert old.rope_dim == 12 and config_from_hf(llama_config(model_type="phi3"), "t").rope_dim == 8


@pytest.mark.parametrize("bad, match", [
    ({"partial_rotary_factor": 0.5}, r"partial_rotary_factor = 0\.5, but llama models rotate the whole head; "
                                     r"partial rotary is supported for phi3"),
    ({"model_type": "phi3", "partial_rotary_factor": 0.1}, r"rotates 0 of head_dim=8 dims"),
    ({"model_type": "phi3", "partial_rotary_factor": 1.5}, r"partial_rotary_factor is a float 1\.5"),
])
def test_bad_partial_rotary(bad, match):
    with pytest.raises(ModelLoadError, match=match):
        config_from_hf(llama_config(**bad), "t")


def test_gemma2_config_json():
    g2 = {**gemma3_config(num_hidden_layers=4), "model_type": "gemma2"}
    del g2["rope_local_base_freq"], g2["sliding_window_pattern"], g2["final_logit_softcapping"]
    c = config_from_hf(g2, "t")
    assert c.arch == "gemma2" and c.hidden_act == "gelu_tanh" and c.norm_weight_offset == 1.0
    assert c.layer_types == ("sliding", "full") * 2 and c.sliding_window == 8
    assert c.rope_local_base_freq is None and c.rope_theta == 1e6
    # absent soft-caps take transformers' defaults; null turns them off
    assert (c.attn_logit_softcap, c.final_logit_softcap) == (50.0, 30.0)
    off = config_from_hf({**g2, "attn_logit_softcapping": None, "final_logit_softcapping": None}, "t")
    assert (off.attn_logit_softcap, off.final_logit_softcap) == (None, None)


def test_gemma2_matches_transformers_config():
    transformers = pytest.importorskip("transformers")
    hf = transformers.Gemma2Config(hidden_size=64, intermediate_size=96, num_hidden_layers=5,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=100)
    c = config_from_hf(hf.to_dict(), "t")
    assert c.layer_types == tuple("sliding" if t == "sliding_attention" else "full" for t in hf.layer_types)
    assert (c.attn_logit_softcap, c.final_logit_softcap) == (hf.attn_logit_softcapping, hf.final_logit_softcapping)
    assert c.query_pre_attn_scalar == hf.query_pre_attn_scalar and c.sliding_window == hf.sliding_window


LONG = {"type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4}


def test_longrope_config_json():
    c = config_from_hf(llama_config(model_type="phi3", max_position_embeddings=131072,
                                    original_max_position_embeddings=4096, rope_scaling=LONG), "t")
    s = c.rope_scaling
    assert s["type"] == "longrope" and s["original_max_position_embeddings"] == 4096
    assert s["short_factor"] == (1.0,) * 4 and s["long_factor"] == (2.0,) * 4
    assert s["attention_factor"] == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))
    su = config_from_hf(llama_config(model_type="phi3", max_position_embeddings=131072,
                                     original_max_position_embeddings=4096, rope_scaling={**LONG, "type": "su"}), "t")
    assert su.rope_scaling == s


def test_longrope_matches_transformers():
    """Our inv_freq (base / factors) and attention factor against transformers' own."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    short, long = [1.0 + 0.1 * i for i in range(8)], [1.0 + 3.0 * i for i in range(8)]
    hf = transformers.Phi3Config(hidden_size=64, num_attention_heads=4, max_position_embeddings=131072,
                                 original_max_position_embeddings=4096, pad_token_id=None,
                                 rope_parameters={"rope_type": "longrope", "rope_theta": 1e4,
                                                  "short_factor": short, "long_factor": long})
    c = config_from_hf(hf.to_dict(), "t")
    base = 1e4 ** (-np.arange(0, 16, 2, dtype=np.float64) / 16)
    for name, seq in (("short_factor", None), ("long_factor", 4097)):
        inv, attn = ROPE_INIT_FUNCTIONS["longrope"](hf, "cpu", seq_len=seq)
        np.testing.assert_allclose(base / np.asarray(c.rope_scaling[name]), inv.double().numpy(), rtol=1e-6)
        assert c.rope_scaling["attention_factor"] == pytest.approx(attn)


@pytest.mark.parametrize("bad, match", [
    ({"rope_scaling": {**LONG, "long_factor": [2.0] * 3}}, r"rope_scaling\.long_factor has 3 values; rope "
                                                          r"rotating 8 dims needs 4"),
    ({"rope_scaling": {**LONG, "short_factor": [1.0, 0.0, 1.0, 1.0]}}, r"short_factor\[1\] is a float 0\.0"),
    ({"rope_scaling": {"type": "longrope", "long_factor": [2.0] * 4}}, r"short_factor is null"),
    ({"hidden_size": 64, "partial_rotary_factor": 0.5, "rope_scaling": LONG},
     r"LongRoPE's attention factor 1\.19 with partial rotary \(8 of 16 dims\) is not supported"),
])
def test_bad_longrope(bad, match):
    with pytest.raises(ModelLoadError, match=match):
        config_from_hf(llama_config(model_type="phi3", max_position_embeddings=131072,
                                    original_max_position_embeddings=4096, **bad), "t")


YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
YARN_DEFAULTS = {"type": "yarn", "beta_fast": 32.0, "beta_slow": 1.0, "truncate": True}


def test_yarn_config_json():
    """Qwen2.5's long-context form, both key spellings; transformers' defaults for the rest."""
    want = {**YARN_DEFAULTS, "factor": 4.0, "original_max_position_embeddings": 32768,
            "attention_factor": pytest.approx(1 + 0.1 * math.log(4.0))}
    old = config_from_hf(llama_config(model_type="qwen2", max_position_embeddings=32768,
                                      rope_scaling={**YARN, "rope_type": None, "type": "yarn"}), "t")
    new = config_from_hf(llama_config(model_type="qwen3", max_position_embeddings=131072,
                                      rope_parameters={**YARN, "rope_theta": 1e6}), "t")
    assert old.rope_scaling == new.rope_scaling == want and new.rope_theta == 1e6


def test_yarn_config_json_derived_values():
    # no factor: max_position_embeddings / original (DeepSeek-V3-like); mscale / mscale_all_dim ratio
    c = config_from_hf(llama_config(max_position_embeddings=163840, rope_scaling={
        "rope_type": "yarn", "original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 0.5}), "t")
    f = 163840 / 4096
    assert c.rope_scaling == {**YARN_DEFAULTS, "factor": f, "original_max_position_embeddings": 4096,
                              "attention_factor": pytest.approx((1 + 0.1 * math.log(f)) / (1 + 0.05 * math.log(f)))}
    # the original context at the top of config.json (as transformers 5 reads it); explicit values win
    c = config_from_hf(llama_config(max_position_embeddings=4096, original_max_position_embeddings=1024,
                                    rope_scaling={"rope_type": "yarn", "attention_factor": 1.5, "beta_fast": 16,
                                                  "beta_slow": 2, "truncate": False}), "t")
    assert c.rope_scaling == {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
                              "attention_factor": 1.5, "beta_fast": 16.0, "beta_slow": 2.0, "truncate": False}
    # neither: the original is max_position_embeddings, so factor 1 (no scaling, attention factor 1)
    c = config_from_hf(llama_config(max_position_embeddings=4096, rope_scaling={"rope_type": "yarn"}), "t")
    assert c.rope_scaling == {**YARN_DEFAULTS, "factor": 1.0, "original_max_position_embeddings": 4096,
                              "attention_factor": 1.0}


@pytest.mark.parametrize("bad, match", [
    ({"factor": 0.0}, r"rope_scaling\.factor is a float 0\.0; expected a finite number > 0"),
    ({"factor": -4.0}, r"rope_scaling\.factor is a float -4\.0"),
    ({"factor": "4"}, r"rope_scaling\.factor is a string"),
    ({"original_max_position_embeddings": 0}, r"rope_scaling\.original_max_position_embeddings is an int 0"),
    ({"beta_slow": 0}, r"rope_scaling\.beta_slow is an int 0; expected a finite number > 0"),
    ({"beta_fast": 0.5}, r"rope_scaling\.beta_fast is a float 0\.5; expected a finite number >= 1"),
    ({"beta_fast": 4, "beta_slow": 8}, r"rope_scaling\.beta_fast is an int 4; expected a finite number >= 8"),
    ({"attention_factor": 0.0}, r"rope_scaling\.attention_factor is a float 0\.0"),
    ({"mscale": "1", "mscale_all_dim": 1.0}, r"rope_scaling\.mscale is a string"),
    ({"truncate": "no"}, r"rope_scaling\.truncate is a string 'no'; expected true or false"),
])
def test_bad_yarn(bad, match):
    with pytest.raises(ModelLoadError, match=match):
        config_from_hf(llama_config(rope_scaling={**YARN, **bad}), "t")


def test_yarn_partial_rotary_refused():
    """The attention factor scales only the rotated dims: the rule LongRoPE has (a GGUF: HF Phi-3
    has no yarn, below)."""
    yarn = {"rope.dimension_count": 8, "attention.key_length": 16, "attention.value_length": 16,
            "rope.scaling.type": "yarn"}
    with pytest.raises(ModelLoadError, match=r"YaRN's attention factor 1\.139 with partial rotary \(8 of 16 "
                                             r"dims\) is not supported"):
        config_from_gguf(_gguf_md("phi3", **yarn, **{"rope.scaling.factor": 4.0}), set(), "p.gguf")
    c = config_from_gguf(_gguf_md("phi3", **yarn, **{"rope.scaling.factor": 1.0}), set(), "p.gguf")
    assert c.rotary_dim == 8 and c.rope_scaling["attention_factor"] == 1.0


def test_phi3_yarn_is_longrope():
    """transformers' Phi3Config reads rope type "yarn" (like "su") as LongRoPE."""
    c = config_from_hf(llama_config(model_type="phi3", max_position_embeddings=131072,
                                    original_max_position_embeddings=4096, rope_scaling={**LONG, "type": "yarn"}),
                       "t")
    assert c.rope_scaling["type"] == "longrope" and c.rope_scaling["long_factor"] == (2.0,) * 4


def test_gguf_yarn_follows_llamacpp():
    """llama.cpp's loader: factor, original context (default: context_length), cos/sin times
    (1 + 0.1 ln factor) * rope.scaling.attn_factor; the yarn_* keys the converter writes from an HF
    config (beta_fast/slow, ext_factor, yarn_attn_factor) are ignored, as llama.cpp ignores them."""
    yarn = {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0}
    c = config_from_gguf(_gguf_md("qwen2", **yarn), set(), "q.gguf")
    assert c.rope_scaling == {**YARN_DEFAULTS, "factor": 4.0, "original_max_position_embeddings": 1024,
                              "attention_factor": pytest.approx(1 + 0.1 * math.log(4.0))}
    c = config_from_gguf(_gguf_md("qwen2", **yarn, **{
        "rope.scaling.original_context_length": 256, "rope.scaling.attn_factor": 1.25,
        "rope.scaling.yarn_beta_fast": 8.0, "rope.scaling.yarn_beta_slow": 2.0,
        "rope.scaling.yarn_ext_factor": 0.5, "rope.scaling.yarn_attn_factor": 3.0}), set(), "q.gguf")
    assert c.rope_scaling == {**YARN_DEFAULTS, "factor": 4.0, "original_max_position_embeddings": 256,
                              "attention_factor": pytest.approx(1.25 * (1 + 0.1 * math.log(4.0)))}
    c = config_from_gguf(_gguf_md("qwen2", **{"rope.scaling.type": "yarn",
                                              "rope.scaling.original_context_length": 0}), set(), "q.gguf")
    assert c.rope_scaling == {**YARN_DEFAULTS, "factor": 1.0, "original_max_position_embeddings": 1024,
                              "attention_factor": 1.0}
    with pytest.raises(ModelLoadError, match=r"qwen2\.rope\.scaling\.attn_factor is a float 0\.0"):
        config_from_gguf(_gguf_md("qwen2", **yarn, **{"rope.scaling.attn_factor": 0.0}), set(), "q.gguf")
    with pytest.raises(ModelLoadError, match=r"rope scaling type 'dynamic' is not supported"):
        config_from_gguf(_gguf_md("qwen2", **{"rope.scaling.type": "dynamic"}), set(), "q.gguf")


def _gguf_md(arch: str, **keys) -> dict:
    md = {"general.architecture": arch, f"{arch}.block_count": 4, f"{arch}.embedding_length": 64,
          f"{arch}.attention.head_count": 4, f"{arch}.attention.head_count_kv": 2,
          f"{arch}.feed_forward_length": 96, f"{arch}.attention.layer_norm_rms_epsilon": 1e-6,
          f"{arch}.context_length": 1024, "tokenizer.ggml.tokens": [f"t{i}" for i in range(100)]}
    md.update({f"{arch}.{k}": v for k, v in keys.items()})
    return md


def test_gguf_new_archs_metadata():
    q3 = config_from_gguf(_gguf_md("qwen3", **{"attention.key_length": 32, "attention.value_length": 32}),
                          set(), "q.gguf")
    assert q3.arch == "qwen3" and q3.rope_style == "neox" and q3.head_dim == 32 and q3.traits.qk_norm
    g2 = config_from_gguf(_gguf_md("gemma2", **{"attention.sliding_window": 16, "attn_logit_softcapping": 50.0,
                                                "final_logit_softcapping": 30.0}), set(), "g.gguf")
    assert g2.layer_types == ("sliding", "full") * 2 and g2.sliding_window == 16  # llama.cpp's pattern 2
    assert (g2.attn_logit_softcap, g2.final_logit_softcap) == (50.0, 30.0) and g2.rope_local_base_freq is None
    assert g2.query_pre_attn_scalar == 16 and g2.norm_weight_offset == 0.0 and g2.hidden_act == "gelu_tanh"
    big = config_from_gguf(_gguf_md("gemma2", block_count=46, **{"attention.key_length": 128}), set(), "g.gguf")
    assert big.query_pre_attn_scalar == 16  # 27B: hidden / heads, as llama.cpp scales it
    phi = config_from_gguf(_gguf_md("phi3", **{"rope.dimension_count": 12, "attention.sliding_window": 0}),
                           set(), "p.gguf")
    assert phi.rotary_dim == 12 and phi.layer_types == () and phi.rope_style == "neox"
    swa = config_from_gguf(_gguf_md("phi3", **{"attention.sliding_window": 2047}), set(), "p.gguf")
    assert swa.layer_types == ("sliding",) * 4 and swa.sliding_window == 2047
    mistral = config_from_gguf(_gguf_md("llama", **{"attention.sliding_window": 4096}), set(), "m.gguf")
    assert mistral.layer_types == ("sliding",) * 4 and mistral.rope_style == "interleaved"
    lr = config_from_gguf(_gguf_md("phi3", **{"rope.scaling.original_context_length": 256,
                                              "rope.scaling.attn_factor": 1.25}),
                          {"rope_factors_long.weight", "rope_factors_short.weight"}, "p.gguf")
    assert lr.rope_scaling == {"type": "longrope", "original_max_position_embeddings": 256,
                               "attention_factor": 1.25}


def test_gguf_partial_rope_refused_outside_phi3():
    with pytest.raises(ModelLoadError, match=r"partial rope \(rope.dimension_count 12 != head_dim 16\) is "
                                             r"not supported for qwen3 models"):
        config_from_gguf(_gguf_md("qwen3", **{"rope.dimension_count": 12}), set(), "q.gguf")
    with pytest.raises(ModelLoadError, match=r"LongRoPE needs both rope_factors_short\.weight and "
                                             r"rope_factors_long\.weight"):
        config_from_gguf(_gguf_md("phi3", **{"rope.scaling.original_context_length": 256}),
                         {"rope_factors_long.weight"}, "p.gguf")
