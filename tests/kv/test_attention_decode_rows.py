"""The host executor's collective-free decode (metal/attention_decode_rows.h,
the _rows_h kernels): what the host picks by default in one pass, for f16 K/V
and for quantized K/V with or without a residual window. It replays the host
shape's SIMD-group (_h kernels, variant "host") value for value, so the two
must be bit-identical (assert_array_equal); the decode tests of
test_attention.py, test_kv_quant.py and test_kv_residual.py hold the default
shape to the float64 reference.
"""
from __future__ import annotations

import numpy as np
import pytest

from metalkv._core import ops

from . import kv_quant_ref as qr
from .attention_ref import B, build_cache
from .test_attention import ATOL, HEAD_DIMS, RTOL, decode, heads, make_inputs
from .test_kv_quant import QUANT_DIMS, inputs as kvq_inputs, quant_pool
from .test_kv_residual import R as RESIDUAL, pool_and_ring, reference as kvq_residual_reference
import metalkv
from devices import host_only, test_device  # tests/ is on sys.path

pytestmark = host_only
PARTS = 2  # mkv_params::kAttnDecodeRowsParts: threadgroups per head block, each a part of the lane groups


def rows_heads(d: int) -> int:
    """Query heads a thread takes (mkv_params::attn_decode_rows_heads): 4 while
    their G lane-group states of d floats fit 16 KiB, else 2."""
    el = d // 4 if (d // 4) % (4 if d <= 64 else 8) == 0 else 16
    kl = 1
    while kl * el < d:
        kl *= 2
    return 4 if (32 // kl) * d * 4 * 4 <= 16384 else 2


@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("ratio", [1, 3, 8, "mqa"])
@pytest.mark.parametrize("n", [1, 5, 33, 200, 1500])
def test_rows_equal_the_host_shape(d, ratio, n):
    dev = test_device()
    rng = np.random.default_rng([d, n])
    n_q_heads, n_kv = heads(ratio)
    q, k, v = make_inputs(rng, 1, n_q_heads, n_kv, d, n)
    cache = build_cache(k, v, spare=1)
    plan = ops.attention_decode_plan(n_q_heads=n_q_heads, n_kv_heads=n_kv, head_dim=d, n_tokens=n,
                                     slots=cache.slots, device=dev, split="never")
    group, most = n_q_heads // n_kv, rows_heads(d)
    blocks = -(-group // most)
    assert plan["kernel"] == f"attn_decode_f16_d{d}_rows_h" and plan["threads"] == 1
    assert plan["heads_per_block"] == -(-group // blocks) and plan["threadgroups"] == n_kv * blocks * PARTS
    assert plan["scratch_bytes"] == n_q_heads * PARTS * (d + 2) * 4 <= plan["scratch_bound"]
    assert plan["kv_bytes_read"] == plan["kv_bytes_visible"] * blocks
    rows = decode(dev, q, cache, n_tokens=n, split="never")
    simd = decode(dev, q, cache, n_tokens=n, split="never", variant="host")
    assert np.isfinite(simd).all()
    np.testing.assert_array_equal(rows, simd)


@pytest.mark.parametrize("d", [32, 64, 112, 128, 160, 256])
@pytest.mark.parametrize("n_q_heads,n_kv", [(10, 2), (12, 2), (14, 2), (7, 1), (16, 1)])
@pytest.mark.parametrize("n", [2, 31, 777])
def test_rows_uneven_head_blocks(d, n_q_heads, n_kv, n):
    """GQA ratios 5, 6, 7, 7 and 16: head blocks of unequal size (a last block
    with fewer heads than the others) and more blocks than one per KV head."""
    dev = test_device()
    rng = np.random.default_rng([d, n_q_heads, n])
    q, k, v = make_inputs(rng, 1, n_q_heads, n_kv, d, n)
    cache = build_cache(k, v, spare=2)
    plan = ops.attention_decode_plan(n_q_heads=n_q_heads, n_kv_heads=n_kv, head_dim=d, n_tokens=n,
                                     slots=cache.slots, device=dev, split="never")
    assert plan["kernel"] == f"attn_decode_f16_d{d}_rows_h"
    rows = decode(dev, q, cache, n_tokens=n, split="never")
    simd = decode(dev, q, cache, n_tokens=n, split="never", variant="host")
    assert np.isfinite(simd).all()
    np.testing.assert_array_equal(rows, simd)


@pytest.mark.parametrize("d", [64, 128, 80, 256])
@pytest.mark.parametrize("n,window", [(300, 17), (1000, 256), (40, 64)])
@pytest.mark.parametrize("softcap,sinks", [(0.0, False), (30.0, True), (5.0, False)])
def test_rows_with_window_softcap_sinks(d, n, window, softcap, sinks):
    dev = test_device()
    rng = np.random.default_rng([d, n, window])
    q, k, v = make_inputs(rng, 1, 9, 3, d, n)
    cache = build_cache(k, v, first=max(0, n - window))
    sk = rng.standard_normal(9).astype(np.float32) if sinks else None
    kw = dict(n_tokens=n, window=window, softcap=softcap, sinks=sk, split="never")
    np.testing.assert_array_equal(decode(dev, q, cache, **kw), decode(dev, q, cache, variant="host", **kw))


@pytest.mark.parametrize("d,n_q_heads,n_kv", [(64, 9, 3), (128, 8, 1), (256, 4, 2), (80, 10, 2)])
@pytest.mark.parametrize("n,window,softcap", [(1, 0, 0.0), (300, 0, 30.0), (777, 100, 0.0)])
def test_rows_write_the_policy_logits(d, n_q_heads, n_kv, n, window, softcap):
    """With a policy's logits (h2o, snapkv) the rows form still runs, and its
    logits and output are the _lg_h kernel's to the bit; keys the window hides
    are not written (the buffer keeps its NaN there, as with the _lg_h kernel)."""
    dev = metalkv.Device("host", profile=True)
    rng = np.random.default_rng([d, n, window])
    q, k, v = make_inputs(rng, 1, n_q_heads, n_kv, d, n)
    cache = build_cache(k, v, first=max(0, n - window) if window else 0, spare=1)

    def run(variant):
        out, logits = dev.buffer(n_q_heads * d * 4), dev.buffer_from(np.full((n_q_heads, n), np.nan, np.float32))
        ops.attention_decode(dev, dev.buffer_from(q[0]), dev.buffer_from(cache.pool), dev.buffer_from(cache.table),
                             out, n_q_heads=n_q_heads, n_kv_heads=n_kv, head_dim=d, n_tokens=n, slots=cache.slots,
                             window=window, softcap=softcap, split="never", variant=variant, logits=logits)
        return out.numpy().view(np.float32).copy(), logits.numpy().view(np.float32).reshape(n_q_heads, n).copy()

    rows_out, rows_logits = run("")
    assert set(dev.kernel_times()) == {f"attn_decode_f16_d{d}_rows_h", f"attn_decode_rows_merge_d{d}_h"}
    dev.reset_counters()
    simd_out, simd_logits = run("host")
    (simd,) = dev.kernel_times()
    assert simd.startswith(f"attn_decode_f16_d{d}") and simd.endswith("_lg_h")
    seen = np.arange(n) >= (n - window if window and n > window else 0)
    assert np.isfinite(rows_logits[:, seen]).all() and np.isnan(rows_logits[:, ~seen]).all()
    np.testing.assert_array_equal(rows_logits, simd_logits)
    np.testing.assert_array_equal(rows_out, simd_out)


def test_rows_form_only_where_it_applies():
    """Split or a variant asked for keep the _h kernels; quantized K/V and a
    residual window take the kvq rows kernel."""
    dev = test_device()
    kw = dict(n_q_heads=9, n_kv_heads=3, head_dim=64, n_tokens=700, slots=704, device=dev)
    assert ops.attention_decode_plan(**kw)["kernel"] == "attn_decode_f16_d64_rows_h"
    assert ops.attention_decode_plan(**kw, split="always")["kernel"] == "attn_decode_split_f16_d64_r4_h"
    assert ops.attention_decode_plan(**kw, kv_k="q8")["kernel"] == "attn_decode_kvq_d64_rows_h"
    assert ops.attention_decode_plan(**kw, kv_k="q8", split="always")["kernel"] == "attn_decode_split_kvq_d64_r4_h"
    assert ops.attention_decode_plan(**kw, variant="host")["kernel"] == "attn_decode_f16_d64_r4_h"
    assert ops.attention_decode_plan(**kw, variant="gpu")["kernel"] == "attn_decode_f16_d64_r4"
    assert all(f"attn_decode_f16_d{d}_rows_h" in ops.kernel_names(dev) for d in HEAD_DIMS)
    assert all(f"attn_decode_kvq_d{d}_rows_h" in ops.kernel_names(dev) for d in QUANT_DIMS)


# ---- quantized K/V and the residual window (the kvq rows kernel) ---------------------
# (q2 seals a block's K per channel once it is full: its caches always keep a residual window,
# whose ring holds the open block; test_rows_read_the_window_from_the_ring runs it)
QUANT_PAIRS = [("q8", "q8"), ("q4", "q4"), ("q8", "q4"), ("q4", "q8"), ("f16", "q4"), ("q4", "f16"), ("q8", "f16")]


def kvq_run(dev, q, pool, table, slots, n_kv, n, kv_k, kv_v, variant, ring=None, ring_lo=0, logits=None, **kw):
    n_q_heads, d = q.shape
    out = dev.buffer(n_q_heads * d * 4)
    if ring is not None:
        kw.update(ring=dev.buffer_from(ring), residual=RESIDUAL, ring_slots=ring.shape[1], ring_lo=ring_lo)
    ops.attention_decode(dev, dev.buffer_from(q), dev.buffer_from(pool), dev.buffer_from(table), out,
                         n_q_heads=n_q_heads, n_kv_heads=n_kv, head_dim=d, n_tokens=n, slots=slots, kv_k=kv_k,
                         kv_v=kv_v, split="never", variant=variant, logits=logits, **kw)
    return out.numpy().view(np.float32).reshape(n_q_heads, d).copy()


@pytest.mark.parametrize("kv_k,kv_v", QUANT_PAIRS)
@pytest.mark.parametrize("d,n_q_heads,n_kv", [(64, 9, 3), (128, 8, 2), (32, 16, 2), (256, 4, 1), (192, 6, 2)])
@pytest.mark.parametrize("n", [1, 45, 700])
def test_quantized_rows_equal_the_host_shape(kv_k, kv_v, d, n_q_heads, n_kv, n):
    """Format pairs without a residual window, through the kvq rows kernel and
    the kvq _h kernel: the same bits."""
    dev = metalkv.Device("host", profile=True)
    q, k, v = kvq_inputs(d + n, 1, n_q_heads, n_kv, d, n)
    pool, table, slots = quant_pool(k, v, qr.section_format(kv_k, 0), qr.section_format(kv_v, 1), spare=2)
    rows = kvq_run(dev, q[0], pool, table, slots, n_kv, n, kv_k, kv_v, "")
    assert set(dev.kernel_times()) == {f"attn_decode_kvq_d{d}_rows_h", f"attn_decode_rows_merge_d{d}_h"}
    simd = kvq_run(dev, q[0], pool, table, slots, n_kv, n, kv_k, kv_v, "host")
    assert np.isfinite(simd).all()
    np.testing.assert_array_equal(rows, simd)


@pytest.mark.parametrize("kv_k,kv_v", [("q8", "q8"), ("q4", "q4"), ("q2", "q2"), ("f16", "q4"), ("q8", "q2")])
@pytest.mark.parametrize("d,n_q_heads,n_kv", [(64, 6, 2), (128, 16, 2)])
@pytest.mark.parametrize("n,lossy", [(40, False), (301, False), (777, False), (301, True)])
def test_rows_read_the_window_from_the_ring(kv_k, kv_v, d, n_q_heads, n_kv, n, lossy):
    """A residual window: the pool's keys before it, then the ring's f16 rows
    (lossy: a prefix the ring never held), as the kvq _res_h kernel reads them."""
    dev = metalkv.Device("host", profile=True)
    q, k, v = kvq_inputs(d + n, 1, n_q_heads, n_kv, d, n)
    ring_slots = 2 * RESIDUAL + 32
    ring_lo = n - 20 if lossy else max(0, n - ring_slots)
    pool, table, slots, ring = pool_and_ring(k, v, kv_k, kv_v, ring_slots, ring_lo)
    rows = kvq_run(dev, q[0], pool, table, slots, n_kv, n, kv_k, kv_v, "", ring=ring, ring_lo=ring_lo)
    assert set(dev.kernel_times()) == {f"attn_decode_kvq_d{d}_rows_h", f"attn_decode_rows_merge_d{d}_h"}
    simd = kvq_run(dev, q[0], pool, table, slots, n_kv, n, kv_k, kv_v, "host", ring=ring, ring_lo=ring_lo)
    np.testing.assert_array_equal(rows, simd)
    ref = kvq_residual_reference(q, k, v, kv_k, kv_v, n - 1, ring_lo, scale=d ** -0.5)[0]
    np.testing.assert_allclose(rows, ref, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("kv_k,kv_v", [("q8", "q8"), ("q4", "q2")])
@pytest.mark.parametrize("n,window,softcap", [(300, 0, 30.0), (777, 100, 0.0)])
def test_quantized_rows_with_a_window_softcap_and_the_policy_logits(kv_k, kv_v, n, window, softcap):
    dev = metalkv.Device("host", profile=True)
    d, n_q_heads, n_kv = 64, 9, 3
    q, k, v = kvq_inputs(d + n, 1, n_q_heads, n_kv, d, n)
    pool, table, slots = quant_pool(k, v, qr.section_format(kv_k, 0), qr.section_format(kv_v, 1), spare=1)

    def run(variant):
        logits = dev.buffer_from(np.full((n_q_heads, n), np.nan, np.float32))
        out = kvq_run(dev, q[0], pool, table, slots, n_kv, n, kv_k, kv_v, variant, logits=logits, window=window,
                      softcap=softcap)
        return out, logits.numpy().view(np.float32).reshape(n_q_heads, n).copy()

    rows_out, rows_logits = run("")
    assert set(dev.kernel_times()) == {f"attn_decode_kvq_d{d}_rows_h", f"attn_decode_rows_merge_d{d}_h"}
    simd_out, simd_logits = run("host")
    np.testing.assert_array_equal(rows_logits, simd_logits)
    np.testing.assert_array_equal(rows_out, simd_out)
