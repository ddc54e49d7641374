"""YaRN's inv_freq table and attention factor against transformers' own
(ROPE_INIT_FUNCTIONS["yarn"]) and against llama.cpp's formulas, and how the engine
spec takes them (config normalization: tests/models/test_config.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from metalkv import model_spec
from metalkv.models.config import normalize_rope_scaling, yarn_inv_freq
from metalkv.models.hf_config import config_from_hf

from .tiny import llama_config

# (model_type, head_dim, partial_rotary_factor, rope_theta, rope parameters, other config keys)
CASES = {
    # Qwen2.5-7B-Instruct's long-context form: the ramp on pairs 17..41 of 64
    "qwen2.5": ("qwen2", 128, 1.0, 1e6, {"factor": 4.0, "original_max_position_embeddings": 32768},
                {"max_position_embeddings": 131072}),
    # Qwen3 (max_position_embeddings 40960 != 4 * 32768: the explicit factor wins)
    "qwen3": ("qwen3", 128, 1.0, 1e6, {"factor": 4.0, "original_max_position_embeddings": 32768},
              {"max_position_embeddings": 40960}),
    # the parity model's: ramp on pairs 3..16 of 32
    "tiny": ("qwen2", 64, 1.0, 1e4, {"factor": 4.0, "original_max_position_embeddings": 512}, {}),
    # betas of the config, no floor/ceil (gpt-oss' truncate: false), an explicit attention factor
    "untruncated": ("qwen2", 64, 1.0, 1.5e5, {"factor": 8.0, "original_max_position_embeddings": 4096,
                                              "beta_fast": 16, "beta_slow": 2, "truncate": False,
                                              "attention_factor": 1.5}, {}),
    # DeepSeek's: factor null (max / original), the mscale / mscale_all_dim ratio
    "mscale": ("qwen2", 64, 1.0, 1e4, {"factor": None, "original_max_position_embeddings": 4096,
                                       "mscale": 1.0, "mscale_all_dim": 0.707},
               {"max_position_embeddings": 163840}),
    # partial rotary: the ramp's dims are the rotated ones (rotary_dim/2 entries)
    "partial": ("qwen2", 128, 0.5, 1e4, {"factor": 2.0, "original_max_position_embeddings": 2048}, {}),
}


def hf_config(name: str):
    transformers = pytest.importorskip("transformers")
    model_type, head_dim, partial, theta, rp, extra = CASES[name]
    rp = {"rope_type": "yarn", "rope_theta": theta, **rp}
    if partial != 1.0:
        rp["partial_rotary_factor"] = partial
    return transformers.AutoConfig.for_model(
        model_type, hidden_size=4 * head_dim, num_attention_heads=4, num_key_value_heads=2,
        head_dim=head_dim, pad_token_id=None, rope_parameters=rp, **extra)


@pytest.mark.parametrize("name", list(CASES))
def test_inv_freq_and_attention_factor_match_transformers(name):
    pytest.importorskip("torch")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = hf_config(name)
    c = hf.to_dict()  # as config.json has it
    s = normalize_rope_scaling(c["rope_parameters"], "t", "rope_parameters", top=c)
    rope_dim = int(c["head_dim"] * CASES[name][2])
    want, attn = ROPE_INIT_FUNCTIONS["yarn"](hf, "cpu")
    got = yarn_inv_freq(rope_dim, c["rope_parameters"]["rope_theta"], s)
    assert got.dtype == np.float32 and got.shape == tuple(want.shape) == (rope_dim // 2,)
    # the same float32 steps; torch's float32 pow is off by an ulp in rare places (1 of 64 in qwen2.5)
    np.testing.assert_allclose(got, want.numpy(), rtol=2.4e-7, atol=0)
    assert s["attention_factor"] == pytest.approx(attn, rel=1e-12)
    # the blend is real: the fastest pair kept, the slowest divided by the factor
    ratio = yarn_inv_freq(rope_dim, c["rope_parameters"]["rope_theta"], {**s, "factor": 1.0}) / got
    assert ratio[0] == pytest.approx(1.0) and ratio[-1] == pytest.approx(s["factor"], rel=1e-6)


def llamacpp_theta_scale(n_dims: int, base: float, s: dict) -> np.ndarray:
    """llama.cpp's per-pair frequency (ggml_rope_yarn_corr_dims, rope_yarn_ramp, rope_yarn; ext_factor
    1), in float64, from the research note (docs/research/issue37-gemma3n-gguf.md section 5)."""
    def corr_dim(n_rot):
        return n_dims * math.log(s["original_max_position_embeddings"] / (n_rot * 2 * math.pi)) / (2 * math.log(base))
    low = max(0, math.floor(corr_dim(s["beta_fast"])))
    high = min(n_dims - 1, math.ceil(corr_dim(s["beta_slow"])))
    i = np.arange(n_dims // 2, dtype=np.float64)
    ramp = 1 - np.clip((i - low) / max(0.001, high - low), 0, 1)
    extrap = base ** (-2 * i / n_dims)
    return extrap / s["factor"] * (1 - ramp) + extrap * ramp


@pytest.mark.parametrize("name", ["qwen2.5", "tiny"])
def test_inv_freq_matches_llamacpp(name):
    """For a GGUF (always truncated, betas 32 / 1) llama.cpp's formula gives the same table."""
    _, head_dim, _, theta, rp, extra = CASES[name]
    c = config_from_hf(llama_config(model_type="qwen2", hidden_size=2 * head_dim, num_attention_heads=2,
                                    num_key_value_heads=1, rope_theta=theta, **extra,
                                    rope_scaling={"rope_type": "yarn", **rp}), "t")
    np.testing.assert_allclose(yarn_inv_freq(c.rope_dim, c.rope_theta, c.rope_scaling),
                               llamacpp_theta_scale(head_dim, theta, c.rope_scaling), rtol=1e-6)


def test_engine_spec_takes_the_table_and_the_factor_squared():
    """Full-attention layers rotate by the yarn table; cos and sin times the attention factor
    become the scores times its square."""
    c = config_from_hf(llama_config(model_type="qwen2", hidden_size=128, num_attention_heads=2,
                                    num_key_value_heads=1, max_position_embeddings=2048,
                                    rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                  "original_max_position_embeddings": 512}), "t")
    tables, which = model_spec.rope_tables(c, {})
    np.testing.assert_array_equal(tables[0], yarn_inv_freq(64, c.rope_theta, c.rope_scaling))
    assert which == [0] * c.n_layers and model_spec.long_rope_tables(c, {}) == ([], 0)
    assert model_spec.attn_scale(c) == pytest.approx(c.attn_scale * (1 + 0.1 * math.log(4.0)) ** 2)
