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
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, r"rope scaling type 'yarn' is not supported"),
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
