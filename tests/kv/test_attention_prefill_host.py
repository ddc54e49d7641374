"""The host executor's prefill shape (metal/attention_prefill_host.h, the _h
kernels): bit-identical to the GPU shape run on the host, which the other
prefill tests hold to the float64 reference (they run both shapes through the
`shape` fixture). It sums each score as the GPU shape sums it on the host (lane
partials, then lane order), visits the same 4-key blocks in the same order and
updates the softmax state element by element as attention.h does, so any
difference at all is a bug: assert_array_equal, not a tolerance.

Swept: every head_dim, GQA 1 / 3 / 8 (8: two head blocks of 4 at D <= 128) and
MQA, more queries than a threadgroup's 32 lanes, sliding windows over a paged
cache whose early blocks are poison, softcap and sinks, quantized K/V, the
residual window's ring, and an eviction policy's logits and scores.
"""
from __future__ import annotations

import numpy as np
import pytest

from metalkv._core import ops

from .attention_ref import build_cache
from .test_attention import HEAD_DIMS, heads, make_inputs, prefill
from .test_kv_quant import inputs, quant_pool
from .test_kv_residual import R, pool_and_ring
from devices import host_only, test_device  # tests/ is on sys.path

pytestmark = host_only


def both(run):
    """run(variant) in the host's shape and the GPU's; both results."""
    return run("host"), run("gpu")


def assert_same(host, gpu):
    assert np.isfinite(gpu).all()
    np.testing.assert_array_equal(host, gpu)


@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("ratio", [1, 3, 8, "mqa"])
@pytest.mark.parametrize("n_q,q_pos0", [(1, 0), (5, 40), (70, 30), (33, 200)])
def test_f16_equals_gpu_shape(d, ratio, n_q, q_pos0):
    dev = test_device()
    rng = np.random.default_rng([d, n_q, q_pos0])
    n_q_heads, n_kv = heads(ratio)
    q, k, v = make_inputs(rng, n_q, n_q_heads, n_kv, d, q_pos0 + n_q)
    cache = build_cache(k, v, spare=2)
    assert_same(*both(lambda s: prefill(dev, q, cache, q_pos0=q_pos0, variant=s)))


@pytest.mark.parametrize("d", [64, 128, 256, 80])
@pytest.mark.parametrize("n_q,q_pos0,window", [(24, 100, 16), (40, 0, 8), (9, 50, 64), (70, 130, 37)])
@pytest.mark.parametrize("softcap,sinks", [(0.0, False), (30.0, True)])
def test_sliding_softcap_sinks_equal_gpu_shape(d, n_q, q_pos0, window, softcap, sinks):
    dev = test_device()
    rng = np.random.default_rng([d, window, n_q])
    q, k, v = make_inputs(rng, n_q, 9, 3, d, q_pos0 + n_q)
    cache = build_cache(k, v, first=max(0, q_pos0 - window + 1))
    sk = rng.standard_normal(9).astype(np.float32) if sinks else None
    assert_same(*both(lambda s: prefill(dev, q, cache, q_pos0=q_pos0, window=window, softcap=softcap,
                                        sinks=sk, variant=s)))


def run(dev, q, pool, table, slots, n_kv, q_pos0, variant, **kw):
    n_q, n_q_heads, d = q.shape
    out = dev.buffer(q.nbytes)
    ops.attention_prefill(dev, dev.buffer_from(q), dev.buffer_from(pool), dev.buffer_from(table), out,
                          n_q_heads=n_q_heads, n_kv_heads=n_kv, head_dim=d, n_queries=n_q, q_pos0=q_pos0,
                          slots=slots, variant=variant, **kw)
    return out.numpy().view(np.float32).reshape(q.shape).copy()


@pytest.mark.parametrize("kv_k,kv_v", [("q8", "q8"), ("q4", "q8"), ("q4", "q4"), ("f16", "q4"), ("q8", "f16")])
@pytest.mark.parametrize("d", [32, 64, 128, 256])
def test_quantized_equals_gpu_shape(kv_k, kv_v, d):
    dev = test_device()
    n_q, q_pos0, n_kv = 45, 60, 2
    q, k, v = inputs(d, n_q, 6, n_kv, d, q_pos0 + n_q)
    pool, table, slots = quant_pool(k, v, kv_k, kv_v)
    assert_same(*both(lambda s: run(dev, q, pool, table, slots, n_kv, q_pos0, s, kv_k=kv_k, kv_v=kv_v)))


# The kvq kernels stage the pool's rows a threadgroup at a time, over the
# threadgroup's key range (attn_prefill_host_staged): windows narrower and wider
# than a tile over blocks a window let go (poison: staging must read none of
# them), queries in several threadgroups, the last one partial, 16-key tiles (D
# 192 and 256), soft-capping with sinks, and a policy's logits over them.
@pytest.mark.parametrize("kv_k,kv_v", [("q8", "q8"), ("q4", "q8"), ("f16", "q4")])
@pytest.mark.parametrize("d", [64, 192, 256])
@pytest.mark.parametrize("n_q,q_pos0,window", [(24, 100, 16), (70, 130, 37), (77, 40, 0)])
def test_quantized_sliding_equals_gpu_shape(kv_k, kv_v, d, n_q, q_pos0, window):
    dev = test_device()
    n_kv, n = 2, q_pos0 + n_q
    q, k, v = inputs(d + window, n_q, 6, n_kv, d, n)
    pool, table, slots = quant_pool(k, v, kv_k, kv_v, first=max(0, q_pos0 - window + 1) if window else 0)
    sk = np.random.default_rng(d).standard_normal(6).astype(np.float32)
    kw = dict(kv_k=kv_k, kv_v=kv_v, window=window, softcap=30.0, sinks=dev.buffer_from(sk))
    assert_same(*both(lambda s: run(dev, q, pool, table, slots, n_kv, q_pos0, s, **kw)))


# Bidirectional spans (an image's tokens see each other): a row's last key can
# lie past its position and past the threadgroup's last query, which the staged
# tiles' key range must cover.
@pytest.mark.parametrize("blocks", [[(40, 90)], [(30, 64), (64, 90)], [(25, 45)]])
def test_quantized_bidirectional_blocks_equal_gpu_shape(blocks):
    dev = test_device()
    n_q, q_pos0, n_kv, d = 70, 20, 2, 64
    q, k, v = inputs(11, n_q, 4, n_kv, d, q_pos0 + n_q)
    pool, table, slots = quant_pool(k, v, "q8", "q4")
    kw = dict(kv_k="q8", kv_v="q4", blocks=blocks)
    assert_same(*both(lambda s: run(dev, q, pool, table, slots, n_kv, q_pos0, s, **kw)))


@pytest.mark.parametrize("kv_k,kv_v", [("q8", "q8"), ("q4", "q4")])
def test_quantized_policy_logits_equal_gpu_shape(kv_k, kv_v):
    dev = test_device()
    n_q, q_pos0, n_kv, d = 40, 110, 3, 64
    q, k, v = inputs(7, n_q, 9, n_kv, d, q_pos0 + n_q)
    pool, table, slots = quant_pool(k, v, kv_k, kv_v)

    def go(variant):
        logits = dev.buffer_from(np.full((n_q, 9, q_pos0 + n_q), np.nan, np.float32))
        out = run(dev, q, pool, table, slots, n_kv, q_pos0, variant, kv_k=kv_k, kv_v=kv_v, logits=logits)
        return out, logits.numpy().view(np.float32).copy()

    (out_h, logits_h), (out_g, logits_g) = both(go)
    assert_same(out_h, out_g)
    np.testing.assert_array_equal(logits_h, logits_g)  # (NaN where masked, in both)


@pytest.mark.parametrize("kv_k,kv_v", [("q4", "q8"), ("q2", "q2"), ("q8", "q8")])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("lossy", [False, True])
def test_residual_window_equals_gpu_shape(kv_k, kv_v, d, lossy):
    dev = test_device()
    n_q, q_pos0, n_kv = 70, 90, 2
    n = q_pos0 + n_q
    q, k, v = inputs(d + 1, n_q, 4, n_kv, d, n)
    ring_slots = R + n_q + 31 + (-(R + n_q + 31)) % 32  # what a cache of max_chunk n_q keeps
    ring_lo = q_pos0 - 10 if lossy else max(0, n - ring_slots)  # lossy: a prefix the ring never held
    pool, table, slots, ring = pool_and_ring(k, v, kv_k, kv_v, ring_slots, ring_lo)
    kw = dict(kv_k=kv_k, kv_v=kv_v, ring=dev.buffer_from(ring), residual=R, ring_slots=ring_slots,
              ring_lo=ring_lo)
    assert_same(*both(lambda s: run(dev, q, pool, table, slots, n_kv, q_pos0, s, **kw)))


@pytest.mark.parametrize("d,n_q_heads,n_kv", [(64, 9, 3), (128, 16, 2)])
def test_policy_logits_and_scores_equal_gpu_shape(d, n_q_heads, n_kv):
    dev = test_device()
    rng = np.random.default_rng(d)
    n, n_q = 150, 40
    q, k, v = make_inputs(rng, n_q, n_q_heads, n_kv, d, n)
    c = build_cache(k, v)

    def go(variant):
        logits = dev.buffer_from(np.full((n_q, n_q_heads, n), np.nan, np.float32))
        scores = dev.buffer(n_kv * n * 4)
        out = run(dev, q, c.pool, c.table, c.slots, n_kv, n - n_q, variant, logits=logits, scores=scores,
                  score_rows_from=7)
        return out, logits.numpy().view(np.float32).copy(), scores.numpy().view(np.float32).copy()

    (out_h, logits_h, scores_h), (out_g, logits_g, scores_g) = both(go)
    np.testing.assert_array_equal(out_h, out_g)
    np.testing.assert_array_equal(logits_h, logits_g)  # (NaN where masked, in both)
    # The scores' softmax sums run in each shape's own stats kernel (one thread
    # on the host, 256 on GPUs: attention_scores.metal), in different orders.
    np.testing.assert_allclose(scores_h, scores_g, rtol=1e-6, atol=1e-7)


def test_the_host_picks_its_shape_and_names_it():
    dev = test_device()
    names = ops.kernel_names(dev)
    assert "attn_prefill_f16_d64_h" in names and "attn_prefill_kvq_d64_h" in names
    assert "attn_prefill_f16_d80_h" in names and "attn_prefill_kvq_d80_h" not in names
    buf = dev.buffer(1 << 16)
    with pytest.raises(Exception, match=r"\[attention_prefill\] prefill_variant 'fast' is not one of"):
        ops.attention_prefill(dev, buf, buf, dev.buffer_from(np.zeros(1, np.uint32)), buf, n_q_heads=2,
                              n_kv_heads=1, head_dim=64, n_queries=4, q_pos0=0, slots=32, variant="fast")
