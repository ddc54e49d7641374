"""Prefill attention with bidirectional blocks (AttentionDesc::blocks): a query
inside a block sees every key of its block, the later ones too (Gemma 3's image
tokens; a vision tower's whole sequence), against the float64 reference with the
same mask, on every prefill shape."""
from __future__ import annotations

import numpy as np
import pytest
from metalkv._core import GpuError

from .attention_ref import attention, build_cache
from .test_attention import ATOL, RTOL, heads, make_inputs, prefill

# (n_queries, q_pos0, blocks): blocks across query tiles, one ending at the last
# query, one before the queries (no query in it), a single block of everything
# (a tower), a block of one position (the same as causal).
CASES = [
    (70, 30, [(35, 50), (60, 100)]),
    (40, 0, [(0, 40)]),
    (33, 20, [(5, 12), (20, 21), (25, 53)]),
    (9, 100, [(100, 109)]),
]


@pytest.mark.parametrize("n_q,q_pos0,blocks", CASES)
@pytest.mark.parametrize("d,ratio", [(64, 3), (128, 8), (256, "mqa"), (80, 1)])
def test_blocks_match_reference(dev, prefill_shape, d, ratio, n_q, q_pos0, blocks):
    n = q_pos0 + n_q
    rng = np.random.default_rng(n + d)
    n_q_heads, n_kv = heads(ratio)
    q, k, v = make_inputs(rng, n_q, n_q_heads, n_kv, d, n)
    got = prefill(dev, q, build_cache(k, v, spare=2), q_pos0=q_pos0, variant=prefill_shape, blocks=blocks)
    want = attention(q, k, v, q_pos0, scale=d ** -0.5, blocks=blocks)
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=RTOL)
    causal = attention(q, k, v, q_pos0, scale=d ** -0.5)
    assert not np.allclose(want, causal)  # the blocks changed what the queries see


@pytest.mark.parametrize("window", [8, 64])
def test_blocks_with_a_sliding_window(dev, prefill_shape, window):
    """A block's query still starts at its own window; it adds only the block's later keys."""
    n_q, q_pos0, blocks = 48, 16, [(20, 40)]
    rng = np.random.default_rng(window)
    q, k, v = make_inputs(rng, n_q, 4, 2, 64, q_pos0 + n_q)
    got = prefill(dev, q, build_cache(k, v), q_pos0=q_pos0, window=window, variant=prefill_shape, blocks=blocks)
    np.testing.assert_allclose(got, attention(q, k, v, q_pos0, scale=0.125, window=window, blocks=blocks),
                               atol=ATOL, rtol=RTOL)


def test_a_block_gives_the_same_bits_in_any_chunk(dev, prefill_shape):
    """The rows of a block fed in a later chunk equal those of one call (chunk invariance)."""
    n, blocks = 64, [(40, 56)]
    rng = np.random.default_rng(3)
    q, k, v = make_inputs(rng, n, 8, 2, 128, n)
    cache = build_cache(k, v)
    whole = prefill(dev, q, cache, q_pos0=0, variant=prefill_shape, blocks=blocks)
    tail = prefill(dev, q[32:], cache, q_pos0=32, variant=prefill_shape, blocks=blocks)
    np.testing.assert_array_equal(tail, whole[32:])


@pytest.mark.parametrize("blocks,says", [
    ([(10, 10)], "is empty"),
    ([(0, 20), (10, 30)], "overlaps"),
    ([(20, 41)], "ends past n_tokens 40"),
    ([(i, i + 1) for i in range(9)], "at most 8"),
])
def test_bad_blocks_are_refused(dev, blocks, says):
    rng = np.random.default_rng(0)
    q, k, v = make_inputs(rng, 8, 2, 2, 64, 40)
    with pytest.raises(GpuError, match=says):
        prefill(dev, q, build_cache(k, v), q_pos0=32, blocks=blocks)
