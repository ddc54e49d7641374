"""Prefill attention with half operands (AttentionDesc::half_operands, the
towers' choice on matrix units): the mma kernels round Q to half as they load
it and the softmax's weights P as they form them, so Q·Kᵀ and P·V are half x
half products with float sums (attn_prefill_mma_f16_dD_half).

The reference is the float64 attention of Q rounded to half (numpy's float16,
the same rounding), so only P's rounding is left: each weight is off by at most
2^-11 of itself, which moves an output by at most 2^-11 / (1 - 2^-11) of the
spread of V (the weights still sum to one: the row sums add the rounded P).
The float kernels are held to 2e-5; these get that plus the bound. Other shapes
compute in float as always; the combinations the kernels lack are refused."""
from __future__ import annotations

import numpy as np
import pytest
from metalkv._core import GpuError, ops

from .attention_ref import attention, build_cache
from .test_attention import ATOL, RTOL, heads, make_inputs, prefill


def p_bound(v: np.ndarray) -> float:
    """The most P's rounding to half can move an output: 2^-11 / (1 - 2^-11) of V's spread."""
    v = v.astype(np.float64)
    return 2.0 ** -11 / (1 - 2.0 ** -11) * float(v.max() - v.min())


# (d, ratio, n_queries, q_pos0, blocks): a tower's one bidirectional block (SigLIP's
# padded D 80, MHA), causal GQA over several tiles, a block inside a causal prompt.
CASES = [
    (80, 1, 70, 0, [(0, 70)]),
    (64, 3, 70, 30, []),
    (128, 8, 40, 9, [(12, 30)]),
    (256, "mqa", 33, 0, [(0, 33)]),
    (32, 2, 9, 100, []),
]


@pytest.mark.parametrize("d,ratio,n_q,q_pos0,blocks", CASES)
def test_half_operands_match_the_reference_of_half_q(dev, d, ratio, n_q, q_pos0, blocks):
    n = q_pos0 + n_q
    rng = np.random.default_rng(n + d)
    n_q_heads, n_kv = heads(ratio)
    q, k, v = make_inputs(rng, n_q, n_q_heads, n_kv, d, n)
    cache = build_cache(k, v, spare=2)
    got = prefill(dev, q, cache, q_pos0=q_pos0, variant="mma", blocks=blocks, half_operands=True)
    q16 = q.astype(np.float16).astype(np.float32)
    want = attention(q16, k, v, q_pos0, scale=d ** -0.5, blocks=blocks)
    np.testing.assert_allclose(got, want, atol=ATOL + p_bound(v), rtol=RTOL)
    # The rounding is real: the float kernel's outputs differ (and stay closer to float Q's).
    full = prefill(dev, q, cache, q_pos0=q_pos0, variant="mma", blocks=blocks)
    assert not np.array_equal(got, full)
    exact = attention(q, k, v, q_pos0, scale=d ** -0.5, blocks=blocks)
    assert np.abs(full - exact).max() < np.abs(got - exact).max()


def test_half_operands_are_chunk_invariant(dev):
    """A chunk's rows equal those of one call, as the float kernels' do."""
    n = 96
    rng = np.random.default_rng(5)
    q, k, v = make_inputs(rng, n, 4, 4, 80, n)
    cache = build_cache(k, v)
    whole = prefill(dev, q, cache, q_pos0=0, variant="mma", half_operands=True)
    tail = prefill(dev, q[40:], cache, q_pos0=40, variant="mma", half_operands=True)
    np.testing.assert_array_equal(tail, whole[40:])


@pytest.mark.parametrize("variant", ["gpu", "host"])
def test_other_shapes_compute_in_float(dev, variant):
    """half_operands is the matrix units' option: the SIMD and host shapes give their float bits."""
    if variant == "host" and not dev.properties["has_host_shapes"]:
        pytest.skip("the host executor's shape is built for it only")
    rng = np.random.default_rng(11)
    q, k, v = make_inputs(rng, 24, 4, 2, 64, 24)
    cache = build_cache(k, v)
    plain = prefill(dev, q, cache, q_pos0=0, variant=variant)
    np.testing.assert_array_equal(prefill(dev, q, cache, q_pos0=0, variant=variant, half_operands=True), plain)


def test_half_operands_refuse_a_quantized_cache(dev):
    rng = np.random.default_rng(1)
    q, k, v = make_inputs(rng, 8, 2, 2, 64, 8)
    cache = build_cache(k, v)
    with pytest.raises(GpuError, match="half_operands is built for f16 K and V"):
        ops.attention_prefill(dev, dev.buffer_from(q), dev.buffer_from(cache.pool), dev.buffer_from(cache.table),
                              dev.buffer(q.nbytes), n_q_heads=2, n_kv_heads=2, head_dim=64, n_queries=8, q_pos0=0,
                              slots=cache.slots, kv_k="q8", variant="mma", half_operands=True)
