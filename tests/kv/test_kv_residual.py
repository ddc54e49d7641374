"""The residual window and q2 (issue 14): attention reads each query's window
(its last `residual` positions and the block they start in) as the f16 rows
of a ring, and the keys before it from the quantized pool; q2's K is sealed
per channel block by block. Checked against the float64 reference attention
over, per query, the reference's dequantized keys before its window start
and the f16 rows from it on (kv_quant_ref.py, attention_ref.py).
"""
from __future__ import annotations

import numpy as np
import pytest

import metalkv
from metalkv._core import ops

from . import kv_quant_ref as qr
from .attention_ref import attention
from .test_attention import ATOL, RTOL
from .test_kv_quant import inputs, quant_pool
from devices import test_device  # tests/ is on sys.path

B = qr.B
R = 64  # the residual window of these tests
PAIRS = [("q8", "q8"), ("q4", "q4"), ("q2", "q2"), ("f16", "q4"), ("q8", "q2")]


def window_start(pos: int, residual: int, ring_lo: int) -> int:
    """The first key position a query at pos reads from the ring (attn_ring_start, restated)."""
    return max(ring_lo, max(0, (pos + 1 - residual) // B * B))


def ring_rows(k, v, ring_slots, ring_lo):
    """The ring as the store leaves it: f16 rows of positions ring_lo.. (the last
    ring_slots of them) at slot p % ring_slots; every other slot NaN."""
    n = len(k)
    ring = np.full((2, ring_slots) + k.shape[1:], np.nan, np.float16)
    for p in range(max(ring_lo, n - ring_slots), n):
        ring[0, p % ring_slots], ring[1, p % ring_slots] = k[p], v[p]
    return ring


def pool_and_ring(k, v, kv_k, kv_v, ring_slots, ring_lo):
    pool, table, slots = quant_pool(k, v, qr.section_format(kv_k, 0), qr.section_format(kv_v, 1), spare=1)
    return pool, table, slots, ring_rows(k, v, ring_slots, ring_lo)


def reference(q, k, v, kv_k, kv_v, q_pos0, ring_lo, **kw):
    """Per query: the pool's dequantized keys before its window start, f16 from it on."""
    kq, vq = qr.roundtrip(k, qr.section_format(kv_k, 0)), qr.roundtrip(v, qr.section_format(kv_v, 1))
    out = []
    for i in range(len(q)):
        p = q_pos0 + i
        s = window_start(p, R, ring_lo)
        kk = np.concatenate([kq[:s], qr.half(k[s:p + 1])])
        vv = np.concatenate([vq[:s], qr.half(v[s:p + 1])])
        out.append(attention(q[i:i + 1], kk, vv, p, **kw)[0])
    return np.stack(out)


def decode(dev, q, pool, table, slots, ring, n, kv_k, kv_v, ring_lo, **kw):
    n_q_heads, d = q.shape
    out = dev.buffer(n_q_heads * d * 4)
    ops.attention_decode(dev, dev.buffer_from(q), dev.buffer_from(pool), dev.buffer_from(table), out,
                         n_q_heads=n_q_heads, n_kv_heads=ring.shape[2], head_dim=d, n_tokens=n, slots=slots,
                         kv_k=kv_k, kv_v=kv_v, ring=dev.buffer_from(ring), residual=R, ring_slots=ring.shape[1],
                         ring_lo=ring_lo, **kw)
    return out.numpy().view(np.float32).reshape(n_q_heads, d).copy()


def prefill(dev, q, pool, table, slots, ring, q_pos0, kv_k, kv_v, ring_lo, **kw):
    n_q, n_q_heads, d = q.shape
    out = dev.buffer(q.nbytes)
    ops.attention_prefill(dev, dev.buffer_from(q), dev.buffer_from(pool), dev.buffer_from(table), out,
                          n_q_heads=n_q_heads, n_kv_heads=ring.shape[2], head_dim=d, n_queries=n_q, q_pos0=q_pos0,
                          slots=slots, kv_k=kv_k, kv_v=kv_v, ring=dev.buffer_from(ring), residual=R,
                          ring_slots=ring.shape[1], ring_lo=ring_lo, **kw)
    return out.numpy().view(np.float32).reshape(q.shape).copy()


@pytest.mark.parametrize("kv_k,kv_v", PAIRS)
@pytest.mark.parametrize("d", [64, 128])  # groups of 3: the 4-row kernels at 64
@pytest.mark.parametrize("n,split,lossy", [(40, "never", False), (301, "never", False), (700, "always", False),
                                           (301, "never", True)])
def test_decode_reads_the_window_from_the_ring(shape, kv_k, kv_v, d, n, split, lossy):
    dev = test_device()
    q, k, v = inputs(d + n, 1, 6, 2, d, n)
    ring_slots = 2 * R + B
    ring_lo = n - 20 if lossy else max(0, n - ring_slots)  # lossy: a prefix the ring never held
    pool, table, slots, ring = pool_and_ring(k, v, kv_k, kv_v, ring_slots, ring_lo)
    got = decode(dev, q[0], pool, table, slots, ring, n, kv_k, kv_v, ring_lo, split=split, variant=shape)
    ref = reference(q, k, v, kv_k, kv_v, n - 1, ring_lo, scale=d ** -0.5)[0]
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("kv_k,kv_v", PAIRS)
@pytest.mark.parametrize("d", [32, 64])
def test_decode_with_eight_query_heads_a_kv_head(shape, kv_k, kv_v, d):
    """The 8-row kernels (a group of 8; groups <= 4 take the 4-row ones above)."""
    dev = test_device()
    n = 333
    q, k, v = inputs(d + 1, 1, 16, 2, d, n)
    ring_slots = 2 * R + B
    pool, table, slots, ring = pool_and_ring(k, v, kv_k, kv_v, ring_slots, n - ring_slots)
    for split in ("never", "always"):
        got = decode(dev, q[0], pool, table, slots, ring, n, kv_k, kv_v, n - ring_slots, split=split,
                     variant=shape)
        ref = reference(q, k, v, kv_k, kv_v, n - 1, n - ring_slots, scale=d ** -0.5)[0]
        np.testing.assert_allclose(got, ref, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("kv_k,kv_v", PAIRS)
@pytest.mark.parametrize("d", [32, 64, 256])
def test_prefill_gives_each_query_its_own_window(prefill_shape, kv_k, kv_v, d):
    dev = test_device()
    n_q, q_pos0 = 70, 90
    n = q_pos0 + n_q
    q, k, v = inputs(3 * d, n_q, 4, 2, d, n)
    ring_slots = R + n_q + B - 1 + (-(R + n_q + B - 1)) % B  # what a cache of max_chunk n_q keeps
    ring_lo = max(0, n - ring_slots)
    pool, table, slots, ring = pool_and_ring(k, v, kv_k, kv_v, ring_slots, ring_lo)
    got = prefill(dev, q, pool, table, slots, ring, q_pos0, kv_k, kv_v, ring_lo, variant=prefill_shape)
    # prefill stages the pool's dequantized values as half
    kq = qr.half(qr.roundtrip(k, qr.section_format(kv_k, 0)))
    vq = qr.half(qr.roundtrip(v, qr.section_format(kv_v, 1)))
    ref = []
    for i in range(n_q):
        p = q_pos0 + i
        s = window_start(p, R, ring_lo)
        kk, vv = np.concatenate([kq[:s], qr.half(k[s:p + 1])]), np.concatenate([vq[:s], qr.half(v[s:p + 1])])
        ref.append(attention(q[i:i + 1], kk, vv, p, scale=d ** -0.5)[0])
    np.testing.assert_allclose(got, np.stack(ref), atol=ATOL, rtol=RTOL)
    # chunk invariance: the same queries in two calls give the same bits
    a = prefill(dev, q[:33], pool, table, slots, ring, q_pos0, kv_k, kv_v, ring_lo, variant=prefill_shape)
    b = prefill(dev, q[33:], pool, table, slots, ring, q_pos0 + 33, kv_k, kv_v, ring_lo, variant=prefill_shape)
    np.testing.assert_array_equal(np.concatenate([a, b]), got)


def test_window_with_sliding_mask_sinks_and_softcap(shape):
    dev = test_device()
    d, n, window = 64, 260, 100
    q, k, v = inputs(5, 1, 4, 1, d, n)
    ring_slots = 2 * R + B
    ring_lo = n - ring_slots
    pool, table, slots, ring = pool_and_ring(k, v, "q4", "q8", ring_slots, ring_lo)
    sinks = np.linspace(-1, 1, 4).astype(np.float32)
    kw = dict(window=window, softcap=25.0)
    got = decode(dev, q[0], pool, table, slots, ring, n, "q4", "q8", ring_lo, sinks=dev.buffer_from(sinks),
                 variant=shape, **kw)
    ref = reference(q, k, v, "q4", "q8", n - 1, ring_lo, scale=d ** -0.5, sinks=sinks, **kw)[0]
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=RTOL)


def test_window_arguments_are_checked():
    dev = test_device()
    buf = dev.buffer(1 << 16)
    kw = dict(n_q_heads=2, n_kv_heads=1, head_dim=64, n_tokens=200, slots=256, kv_k="q4", kv_v="q4")
    with pytest.raises(metalkv.GpuError, match="residual 48 is not a multiple of the block size 32"):
        ops.attention_decode(dev, buf, buf, buf, buf, **kw, ring=buf, residual=48, ring_slots=160)
    with pytest.raises(metalkv.GpuError, match="the ring's 64 slots cannot hold the window of positions from 128"):
        ops.attention_decode(dev, buf, buf, buf, buf, **kw, ring=buf, residual=64, ring_slots=64)
    with pytest.raises(metalkv.GpuError, match="ring, ring_slots and ring_lo need a residual window"):
        ops.attention_decode(dev, buf, buf, buf, buf, **kw, ring_slots=64)
