"""Chunk invariance of prefill attention: a query's output does not depend on
which chunk (or query tile) it arrived in, bit for bit. The scheduler cuts a
prompt wherever its token budget ends, and a prefix from the prefix cache was
computed in another request's chunks; a sequence gets the same bits alone, in a
batch, and from the cache only if this holds (docs/BATCHING.md).

One paged cache holds every key; the same queries go through
ops.attention_prefill in one call and in several chunkings, and each query's
row must be array_equal across them (and close to the float64 reference)."""
from __future__ import annotations

import numpy as np
import pytest

from .attention_ref import attention, build_cache
from .test_attention import ATOL, RTOL, heads, make_inputs, prefill
from devices import test_device  # tests/ is on sys.path

CHUNKINGS = [[70], [1, 69], [3, 30, 37], [16, 16, 16, 22], [33, 5, 32]]


@pytest.mark.parametrize("d", [64, 128, 80])
@pytest.mark.parametrize("window", [0, 7, 20, 64])
@pytest.mark.parametrize("softcap", [0.0, 30.0])
def test_prefill_rows_do_not_depend_on_the_chunking(d, window, softcap):
    dev = test_device()
    rng = np.random.default_rng(d + window)
    n_q_heads, n_kv = heads(3)
    first, n_q = 41, 70  # queries at positions 41..110 after 41 cached keys
    q, k, v = make_inputs(rng, n_q, n_q_heads, n_kv, d, first + n_q)
    cache = build_cache(k, v)
    scale = 1.0 / np.sqrt(d)
    rows = []
    for chunks in CHUNKINGS:
        out, at = [], 0
        for c in chunks:
            out.append(prefill(dev, q[at:at + c], cache, q_pos0=first + at, window=window, softcap=softcap))
            at += c
        rows.append(np.concatenate(out))
    for other, chunks in zip(rows[1:], CHUNKINGS[1:]):
        np.testing.assert_array_equal(other, rows[0], err_msg=f"chunks {chunks}")
    ref = attention(q, k, v, first, scale=scale, window=window, softcap=softcap)
    np.testing.assert_allclose(rows[0], ref, atol=ATOL, rtol=RTOL)
