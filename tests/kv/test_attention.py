"""Attention kernels (metal/attention_*.metal) through metalkv._core.ops against
the float64 numpy reference in attention_ref.py, in every fiber order.

Tolerance. The reference gets the very same f16 K/V values (exact in float64)
and the same f32 q, so the only differences are the kernel's f32 arithmetic:
the q.k sums (D terms, |terms| <~ 4), exp, and the weighted sums of V (weights
<= 1, |v| <~ 4). Rounding errors of ~2^-24 per operation add up like a random
walk: ~sqrt(D) * 2^-24 * 4 <~ 1e-6 per score, and the output is a convex
combination, so its error is of the same order. We allow ATOL = 2e-5 (10-20x
the ~1e-6 we measure) but no more: dropping one key out of 4096 moves the
output by ~1e-4, so a masking or chunking bug cannot hide inside it. Results
of two kernel paths (split vs single pass, prefill vs decode) differ only in
summation order and are held to CLOSE = 2e-6.

Caches are paged: the pool's blocks are in random order, and every slot that
holds no visible position (the tail of the last block, spare blocks, blocks a
sliding window left behind) is NaN (build_cache(poison=True)), so a kernel
that reads a slot it should not would turn its output into NaN.
"""
from __future__ import annotations

import numpy as np
import pytest

from metalkv._core import ops

from .attention_ref import B, Paged, attention, build_cache
from devices import host_only, test_device  # tests/ is on sys.path

ATOL = 2e-5
RTOL = 1e-5
CLOSE = 2e-6
N_KV = 2  # KV heads for the GQA ratios below; MQA has 1

# Every head_dim the kernels take (the op owns the list). Lane layouts differ
# by D (metal/attention.h): 64, 128, 256 are the vector-load paths of before
# and keep the full sweeps; the others get a smaller one per test, each still
# covering every kernel (decode single and split, reduce, prefill).
HEAD_DIMS = ops.attention_head_dims()
CLASSIC = (64, 128, 256)
RATIOS = [1, 3, 8, "mqa"]


def ratio_for(d: int):
    """One GQA ratio per head_dim, rotating, for tests that do not sweep both."""
    return RATIOS[HEAD_DIMS.index(d) % len(RATIOS)]


def test_head_dims_cover_real_models():
    """llama.cpp covers 40..256, MLX's fast path 64/96/128/256; these are the
    sizes real checkpoints use."""
    assert {32, 64, 80, 96, 112, 128, 160, 192, 256} <= set(HEAD_DIMS)
    assert HEAD_DIMS == sorted(HEAD_DIMS)


def heads(ratio) -> tuple[int, int]:
    """(n_q_heads, n_kv_heads) for a GQA ratio; 'mqa' shares one KV head among 8."""
    return (8, 1) if ratio == "mqa" else (N_KV * ratio, N_KV)


def make_inputs(rng, n_q: int, n_q_heads: int, n_kv: int, d: int, n: int):
    """q (n_q, n_q_heads, d) f32 scaled so softmax is peaked (score std ~2),
    k, v (n, n_kv, d) f16."""
    q = (2.0 * rng.standard_normal((n_q, n_q_heads, d))).astype(np.float32)
    k = rng.standard_normal((n, n_kv, d)).astype(np.float16)
    v = rng.standard_normal((n, n_kv, d)).astype(np.float16)
    return q, k, v


def decode(dev, q, cache: Paged, *, n_tokens, window=0, softcap=0.0, sinks=None,
           split="auto", chunks=0, variant=""):
    n_q_heads, d = q.shape[-2], q.shape[-1]
    out = dev.buffer(n_q_heads * d * 4)
    ops.attention_decode(
        dev, dev.buffer_from(np.ascontiguousarray(q.reshape(n_q_heads, d))), dev.buffer_from(cache.pool),
        dev.buffer_from(cache.table), out, n_q_heads=n_q_heads, n_kv_heads=cache.pool.shape[2], head_dim=d,
        n_tokens=n_tokens, slots=cache.slots, window=window, softcap=softcap,
        sinks=None if sinks is None else dev.buffer_from(sinks.astype(np.float32)),
        split=split, chunks=chunks, variant=variant)
    return out.numpy().view(np.float32).reshape(n_q_heads, d).copy()


def prefill(dev, q, cache: Paged, *, q_pos0, window=0, softcap=0.0, sinks=None, variant="", blocks=(),
            half_operands=False):
    n_q, n_q_heads, d = q.shape
    out = dev.buffer(q.nbytes)
    ops.attention_prefill(
        dev, dev.buffer_from(q), dev.buffer_from(cache.pool), dev.buffer_from(cache.table), out,
        n_q_heads=n_q_heads, n_kv_heads=cache.pool.shape[2], head_dim=d, n_queries=n_q, q_pos0=q_pos0,
        slots=cache.slots,
        window=window, softcap=softcap,
        sinks=None if sinks is None else dev.buffer_from(sinks.astype(np.float32)), variant=variant,
        blocks=list(blocks), half_operands=half_operands)
    return out.numpy().view(np.float32).reshape(q.shape).copy()


# ---- decode ---------------------------------------------------------------

def rule_chunks(n_keys: int, base: int, wave: int) -> int:
    """The op's chunk rule (cpp/ops/attention.h), spelled out: one wave of
    chunks of >= 128 keys, split only from 512 keys and 2 chunks on."""
    fill = min(wave // base, n_keys // 128, 512)
    return fill if n_keys >= 512 and fill >= 2 else 1


CONTEXTS = [1, 31, 33, 257, 4096]  # 4096: ~0.1-0.2 s per case on the host executor


def decode_sweep():
    """D x GQA x context: all of it at the classic D; elsewhere every ratio at
    the short contexts and one ratio at 4096 (which the heuristic splits)."""
    for d in HEAD_DIMS:
        for ratio in RATIOS:
            for n in CONTEXTS:
                if d in CLASSIC or n < 4096 or ratio == ratio_for(d):
                    yield d, ratio, n


@pytest.mark.parametrize("d,ratio,n", list(decode_sweep()))
def test_decode_matches_reference(dev, shape, d, ratio, n):
    rng = np.random.default_rng(1000 * d + n)
    n_q_heads, n_kv = heads(ratio)
    plan = ops.attention_decode_plan(n_q_heads=n_q_heads, n_kv_heads=n_kv, head_dim=d,
                                     n_tokens=n, slots=-(-n // B) * B, device=dev, variant=shape)
    assert plan["n_chunks"] == rule_chunks(n, n_kv * plan["head_blocks"], plan["wave"])
    # The host's wave (its thread count) rarely asks for a split: the long
    # context runs split-K as a GPU's wave would cut it (33 chunks: 264 / 8).
    split, chunks = ("always", 33) if n == 4096 else ("auto", 0)
    q, k, v = make_inputs(rng, 1, n_q_heads, n_kv, d, n)
    cache = build_cache(k, v, spare=2)  # the tail of the last block and 2 spare blocks are poison
    got = decode(dev, q, cache, n_tokens=n, split=split, chunks=chunks, variant=shape)
    ref = attention(q, k, v, n - 1, scale=d ** -0.5)[0]
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=RTOL)


# More query heads per KV head than one threadgroup holds: head blocks, the
# last one partial when they do not divide evenly (9 = 5 + 4).
@pytest.mark.parametrize("d,n_q_heads,n_kv", [(64, 9, 1), (128, 32, 1), (256, 10, 2), (256, 40, 1),
                                               (32, 12, 1), (80, 17, 1), (112, 24, 2), (160, 10, 2),
                                               (192, 9, 1)])
def test_many_query_heads_per_kv_head(dev, shape, d, n_q_heads, n_kv):
    n, n_q = 70, 12
    rng = np.random.default_rng(n_q_heads)
    q, k, v = make_inputs(rng, n_q, n_q_heads, n_kv, d, n)
    cache = build_cache(k, v)
    for split in ["never", "always"]:
        got = decode(dev, q[-1], cache, n_tokens=n, split=split, variant=shape)
        np.testing.assert_allclose(got, attention(q[-1:], k, v, n - 1, scale=d ** -0.5)[0],
                                   atol=ATOL, rtol=RTOL)
    got = prefill(dev, q, cache, q_pos0=n - n_q, variant=shape)
    np.testing.assert_allclose(got, attention(q, k, v, n - n_q, scale=d ** -0.5), atol=ATOL,
                               rtol=RTOL)


# (n_tokens, window, split): windows below and above the context; the blocks
# before the window's first block are gone (their table entries name a poison
# block) and the positions of its first block before the window are poison.
SLIDING = [
    (100, 16, "auto"),     # window inside one block, several blocks left behind
    (100, 40, "auto"),     # window across a block boundary
    (40, 64, "auto"),      # window larger than the context: nothing masked
    (64, 64, "auto"),      # context == window
    (1000, 300, "never"),
    (1000, 300, "always"),
    (2100, 700, "auto"),   # long enough to split by itself
]


def sliding_sweep():
    """Every case at (64, 3) and (128, 8); at every other D a window inside one
    block, one across blocks, and split chunks over a window."""
    for d in HEAD_DIMS:
        for case in SLIDING:
            if d in (64, 128):
                yield (d, 3 if d == 64 else 8) + case
            elif case in (SLIDING[0], SLIDING[1], SLIDING[5]):
                yield (d, ratio_for(d)) + case


@pytest.mark.parametrize("d,ratio,n,window,split", list(sliding_sweep()))
def test_decode_sliding_window(dev, shape, d, ratio, n, window, split):
    rng = np.random.default_rng(n + window)
    n_q_heads, n_kv = heads(ratio)
    q, k, v = make_inputs(rng, 1, n_q_heads, n_kv, d, n)
    cache = build_cache(k, v, first=max(0, n - window))
    got = decode(dev, q, cache, n_tokens=n, window=window, split=split,
                 chunks=5 if split == "always" else 0, variant=shape)
    ref = attention(q, k, v, n - 1, scale=d ** -0.5, window=window)[0]
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("d", [64, 80])
def test_decode_reads_only_visible_slots(dev, shape, d):
    """Everything but the window's positions is NaN — the earlier positions of
    its first block, the blocks before it (their entries name a NaN block), the
    tail: never read, in one pass or split."""
    n, window = 90, 20
    rng = np.random.default_rng(7)
    q, k, v = make_inputs(rng, 1, 6, 2, d, n)
    cache = build_cache(k, v, first=n - window)
    assert np.isnan(cache.pool).sum() > cache.pool.size // 2
    for split in ["never", "always"]:
        got = decode(dev, q, cache, n_tokens=n, window=window, split=split, variant=shape)
        np.testing.assert_allclose(got, attention(q, k, v, n - 1, scale=d ** -0.5, window=window)[0],
                                   atol=ATOL, rtol=RTOL)


def test_decode_through_a_table_of_any_order(dev, shape):
    """The same keys in pools of several block orders (a reversed pool, shuffles,
    blocks sharing nothing) give the same output, equal to the reference."""
    d, n = 64, 300
    rng = np.random.default_rng(3)
    q, k, v = make_inputs(rng, 1, 6, 2, d, n)
    ref = attention(q, k, v, n - 1, scale=d ** -0.5)[0]
    base = build_cache(k, v, shuffle=False, spare=0)
    outs = []
    for order in [np.arange(10)[::-1], rng.permutation(10), rng.permutation(13)[:10]]:
        pool = np.full((2, (order.max() + 1) * B) + k.shape[1:], np.nan, np.float16)
        for i, b in enumerate(order):
            pool[:, b * B:(b + 1) * B] = base.pool[:, i * B:(i + 1) * B]
        cache = Paged(pool, order.astype(np.uint32))
        outs.append(decode(dev, q, cache, n_tokens=n, split="never", variant=shape))
        np.testing.assert_allclose(outs[-1], ref, atol=ATOL, rtol=RTOL)
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])  # the same sums in the same order


@pytest.mark.parametrize("d", HEAD_DIMS)
def test_reads_stay_inside_rows(dev, shape, d):
    """The cache sits in a buffer between NaN halfs (16 bytes before, a row
    after): a lane that loads past its row's D elements, as the idle lanes of
    D = 80 and 112 would on the last KV head of the last slot, turns the output
    into NaN (even against q = 0). Decode single and split, and prefill."""
    n, n_q = 2 * B, 6  # two whole blocks in order: the last position is the pool's last slot
    rng = np.random.default_rng(d)
    q, k, v = make_inputs(rng, n_q, 3, 1, d, n)
    paged = build_cache(k, v, spare=0, shuffle=False)
    table = dev.buffer_from(paged.table)
    cache = paged.pool.reshape(-1)
    padded = np.concatenate([np.full(8, np.nan, np.float16), cache,
                             np.full(d, np.nan, np.float16)])
    kv = dev.buffer_from(padded)
    ref = attention(q, k, v, n - n_q, scale=d ** -0.5)
    for split in ["never", "always"]:
        out = dev.buffer(3 * d * 4)
        ops.attention_decode(dev, dev.buffer_from(np.ascontiguousarray(q[-1])), kv, table, out,
                             n_q_heads=3, n_kv_heads=1, head_dim=d, n_tokens=n, slots=n,
                             split=split, kv_offset=16, variant=shape)
        got = out.numpy().view(np.float32).reshape(3, d)
        np.testing.assert_allclose(got, ref[-1], atol=ATOL, rtol=RTOL, err_msg=split)
    out = dev.buffer(q.nbytes)
    ops.attention_prefill(dev, dev.buffer_from(q), kv, table, out, n_q_heads=3, n_kv_heads=1, head_dim=d,
                          n_queries=n_q, q_pos0=n - n_q, slots=n, kv_offset=16, variant=shape)
    np.testing.assert_allclose(out.numpy().view(np.float32).reshape(q.shape), ref, atol=ATOL,
                               rtol=RTOL)


def split_sweep():
    """Chunk counts 2..257 at the classic D; 3 (uneven chunks) and 64 elsewhere."""
    classic = {64: 3, 128: 1, 256: "mqa"}
    for d in HEAD_DIMS:
        for chunks in [2, 3, 7, 64, 257]:
            if d in classic:
                yield d, classic[d], chunks
            elif chunks in (3, 64):
                yield d, ratio_for(d), chunks


@pytest.mark.parametrize("d,ratio,chunks", list(split_sweep()))
def test_split_equals_single_pass(dev, shape, d, ratio, chunks):
    n = 257
    rng = np.random.default_rng(chunks)
    n_q_heads, n_kv = heads(ratio)
    q, k, v = make_inputs(rng, 1, n_q_heads, n_kv, d, n)
    cache = build_cache(k, v)
    single = decode(dev, q, cache, n_tokens=n, split="never", variant=shape)
    split = decode(dev, q, cache, n_tokens=n, split="always", chunks=chunks, variant=shape)
    np.testing.assert_allclose(split, single, atol=CLOSE, rtol=CLOSE)
    np.testing.assert_allclose(split, attention(q, k, v, n - 1, scale=d ** -0.5)[0], atol=ATOL,
                               rtol=RTOL)


@pytest.mark.parametrize("d,n_q_heads,n_kv,kernel", [
    (32, 8, 2, "attn_decode_split_f16_d32_r4"), (64, 12, 4, "attn_decode_split_f16_d64_r4"),
    (64, 16, 2, "attn_decode_split_f16_d64"), (64, 9, 1, "attn_decode_split_f16_d64"),
    (128, 32, 8, "attn_decode_split_f16_d128"), (256, 8, 1, "attn_decode_split_f16_d256")])
def test_decode_kernel_by_rows(d, n_q_heads, n_kv, kernel):
    """8-row kernels (D <= 64) only where a head block needs more than 4 rows."""
    p = ops.attention_decode_plan(n_q_heads=n_q_heads, n_kv_heads=n_kv, head_dim=d, n_tokens=4096,
                                  slots=4096, split="always", wave=264)
    assert p["kernel"] == kernel


def test_host_shape_plan():
    """The host's shape: every name the op picks, '_h' appended (fixed-format
    pairs read by kvq), one SIMD-group a threadgroup; the GPU shape otherwise."""
    def plan(**kw):
        base = dict(n_q_heads=9, n_kv_heads=3, head_dim=64, n_tokens=4096, slots=4096, wave=264)
        return ops.attention_decode_plan(**dict(base, **kw))
    assert (plan()["kernel"], plan()["threads"]) == ("attn_decode_split_f16_d64_r4", 128)
    assert (plan(split="never")["kernel"], plan(split="never")["threads"]) == ("attn_decode_f16_d64_r4", 256)
    h = plan(variant="host")
    assert (h["kernel"], h["threads"]) == ("attn_decode_split_f16_d64_r4_h", 32)
    # The same chunks, head blocks and bytes: only the kernels' insides differ.
    assert {k: v for k, v in h.items() if k not in ("kernel", "threads")} == \
        {k: v for k, v in plan().items() if k not in ("kernel", "threads")}
    assert plan(variant="gpu")["kernel"] == plan()["kernel"]
    assert plan(kv_k="q8", kv_v="q8")["kernel"] == "attn_decode_split_q8q8_d64_r4"
    assert plan(kv_k="q8", kv_v="q8", variant="host")["kernel"] == "attn_decode_split_kvq_d64_r4_h"
    assert plan(n_q_heads=24, head_dim=32, split="never", variant="host")["kernel"] == "attn_decode_f16_d32_h"
    assert plan(n_q_heads=24, n_kv_heads=8, head_dim=128, variant="host")["kernel"] == \
        "attn_decode_split_f16_d128_h"


@host_only
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_host_picks_its_shape(d):
    dev = test_device()
    p = ops.attention_decode_plan(n_q_heads=8, n_kv_heads=2, head_dim=d, n_tokens=300, slots=320, device=dev)
    # f16 in one pass: the rows form, a threadgroup of one thread per (head block, part of the lane groups)
    assert p["kernel"] == f"attn_decode_f16_d{d}_rows_h" and p["threads"] == 1
    assert p["heads_per_block"] in (2, 4) and p["threadgroups"] == 2 * p["head_blocks"] * 2
    h = ops.attention_decode_plan(n_q_heads=8, n_kv_heads=2, head_dim=d, n_tokens=300, slots=320, device=dev,
                                  variant="host")
    assert h["kernel"].endswith("_h") and h["threads"] == 32
    g = ops.attention_decode_plan(n_q_heads=8, n_kv_heads=2, head_dim=d, n_tokens=300, slots=320, device=dev,
                                  variant="gpu")
    assert not g["kernel"].endswith("_h") and g["threads"] in (128, 256)


@host_only
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("n", [5, 200, 1500])
def test_host_shape_equals_gpu_shape(d, n):
    """Both shapes sum the same terms, grouped differently: equal to CLOSE."""
    dev = test_device()
    rng = np.random.default_rng(d * n)
    n_q_heads, n_kv = heads(ratio_for(d))
    q, k, v = make_inputs(rng, 1, n_q_heads, n_kv, d, n)
    cache = build_cache(k, v)
    for split in ("never", "always"):
        host = decode(dev, q, cache, n_tokens=n, split=split, variant="host")
        gpu = decode(dev, q, cache, n_tokens=n, split=split, variant="gpu")
        np.testing.assert_allclose(host, gpu, atol=CLOSE, rtol=CLOSE, err_msg=split)


@pytest.mark.parametrize("n,window,split,chunks", [
    (1, 0, "never", 0), (257, 0, "never", 0), (700, 0, "always", 9),
    (900, 300, "always", 4), (4096, 0, "always", 33)])
def test_no_prefetch_variant(dev, n, window, split, chunks):
    """The 'nopf' kernels (the bench's variant) against the reference and the default."""
    rng = np.random.default_rng(n)
    q, k, v = make_inputs(rng, 1, 12, 3, 128, n)
    cache = build_cache(k, v, first=max(0, n - window) if window else 0)
    got = decode(dev, q, cache, n_tokens=n, window=window, split=split,
                 chunks=chunks, variant="nopf")
    ref = attention(q, k, v, n - 1, scale=128 ** -0.5, window=window)[0]
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=RTOL)
    default = decode(dev, q, cache, n_tokens=n, window=window, split=split, chunks=chunks)
    np.testing.assert_allclose(got, default, atol=CLOSE, rtol=CLOSE)
    p = ops.attention_decode_plan(n_q_heads=12, n_kv_heads=3, head_dim=128, n_tokens=n, slots=cache.slots,
                                  window=window, split=split, chunks=chunks, device=dev, variant="nopf")
    assert p["kernel"].endswith("_nopf")


def test_split_plan_from_the_wave():
    H200 = 264  # 132 SMs x 2 resident threadgroups of the split kernel

    def plan(**kw):
        return ops.attention_decode_plan(**kw)
    # Short context: one pass, one threadgroup per KV head, K/V read once.
    p = plan(n_q_heads=9, n_kv_heads=3, head_dim=64, n_tokens=257, slots=288, wave=H200)
    assert (p["split"], p["threadgroups"], p["scratch_bytes"]) == (False, 3, 0)
    assert p["kv_bytes_read"] == p["kv_bytes_visible"] == 3 * 257 * 64 * 4
    # Long context, few KV heads: one wave of chunks.
    p = plan(n_q_heads=32, n_kv_heads=8, head_dim=128, n_tokens=32768, slots=32768, wave=H200)
    assert p["split"] and p["n_chunks"] == 33 and p["threadgroups"] == 264 and p["wave"] == H200
    assert p["scratch_bytes"] == 32 * 33 * (128 + 2) * 4 <= p["scratch_bound"]
    p = plan(n_q_heads=32, n_kv_heads=8, head_dim=128, n_tokens=4096, slots=4096, wave=H200)
    assert (p["n_chunks"], p["chunk_keys"], p["threadgroups"]) == (32, 128, 256)
    # ... but no chunk under 128 keys, and no split under 512 keys.
    p = plan(n_q_heads=9, n_kv_heads=3, head_dim=64, n_tokens=1024, slots=1024, wave=H200)
    assert p["n_chunks"] == 8 and p["chunk_keys"] == 128
    assert not plan(n_q_heads=9, n_kv_heads=3, head_dim=64, n_tokens=511, slots=512, wave=H200)["split"]
    # A device that the heads fill already (or a small one): no split however long the context.
    assert not plan(n_q_heads=64, n_kv_heads=64, head_dim=64, n_tokens=32768, slots=32768, wave=64)["split"]
    assert not plan(n_q_heads=32, n_kv_heads=8, head_dim=128, n_tokens=32768, slots=32768, wave=8)["split"]
    p = plan(n_q_heads=32, n_kv_heads=8, head_dim=128, n_tokens=32768, slots=32768, wave=16)
    assert p["n_chunks"] == 2
    # A sliding layer sees only its window.
    p = plan(n_q_heads=9, n_kv_heads=3, head_dim=64, n_tokens=10000, slots=608, window=512, wave=H200)
    assert p["n_keys"] == 512 and p["n_chunks"] == 4
    # Forced split: at least 2 chunks, at most 512.
    p = plan(n_q_heads=9, n_kv_heads=3, head_dim=64, n_tokens=100, slots=128, split="always", wave=H200)
    assert p["split"] and p["n_chunks"] == 2
    # Scratch grows with the context, and the device-free bound covers every wave.
    for wave in (1, 2, 16, H200, 1000):
        sizes = [plan(n_q_heads=32, n_kv_heads=8, head_dim=128, n_tokens=n, slots=40000, wave=wave)
                 for n in range(1, 40000, 997)]
        assert [x["scratch_bytes"] for x in sizes] == sorted(x["scratch_bytes"] for x in sizes)
        assert all(x["scratch_bytes"] <= x["scratch_bound"] for x in sizes)
        bounds = [x["scratch_bound"] for x in sizes]
        assert bounds == sorted(bounds)
    # More query heads per KV head than a SIMD-group holds (4 rows above D = 64,
    # 8 up to it): K/V read once per head block.
    p = plan(n_q_heads=32, n_kv_heads=1, head_dim=128, n_tokens=100, slots=128, wave=H200)
    assert p["head_blocks"] == 8 and p["kv_bytes_read"] == 8 * p["kv_bytes_visible"]
    p = plan(n_q_heads=32, n_kv_heads=1, head_dim=64, n_tokens=100, slots=128, wave=H200)
    assert p["head_blocks"] == 4 and p["heads_per_block"] == 8
    # The device's own plan: its wave, and the rule.
    dev = test_device()
    p = plan(n_q_heads=32, n_kv_heads=8, head_dim=128, n_tokens=32768, slots=32768, device=dev)
    assert p["wave"] >= 1 and p["n_chunks"] == rule_chunks(32768, 8, p["wave"])
    with pytest.raises(ValueError, match=r"give exactly one of device"):
        plan(n_q_heads=8, n_kv_heads=2, head_dim=64, n_tokens=10, slots=16)


# ---- prefill --------------------------------------------------------------

# (n_queries, q_pos0): a whole prompt, a chunk after earlier chunks, several
# query tiles per threadgroup grid.
PREFILL_CASES = [(1, 0), (33, 0), (70, 30), (5, 200)]


def prefill_sweep():
    """All cases x ratios at the classic D; elsewhere every ratio over several
    query tiles (70 queries after 30) and every case at one ratio."""
    for d in HEAD_DIMS:
        for ratio in RATIOS:
            for n_q, q_pos0 in PREFILL_CASES:
                if d in CLASSIC or (n_q, q_pos0) == (70, 30) or ratio == ratio_for(d):
                    yield d, ratio, n_q, q_pos0


@pytest.mark.parametrize("d,ratio,n_q,q_pos0", list(prefill_sweep()))
def test_prefill_matches_reference(dev, prefill_shape, d, ratio, n_q, q_pos0):
    n = q_pos0 + n_q
    rng = np.random.default_rng(n * d)
    n_q_heads, n_kv = heads(ratio)
    q, k, v = make_inputs(rng, n_q, n_q_heads, n_kv, d, n)
    got = prefill(dev, q, build_cache(k, v, spare=2), q_pos0=q_pos0, variant=prefill_shape)
    np.testing.assert_allclose(got, attention(q, k, v, q_pos0, scale=d ** -0.5), atol=ATOL,
                               rtol=RTOL)


# (n_queries, q_pos0, window): chunked prefill of a sliding layer whose first
# blocks are gone; windows below and above n.
@pytest.mark.parametrize("n_q,q_pos0,window", [(24, 100, 16), (40, 0, 8), (9, 50, 64), (64, 0, 100)])
@pytest.mark.parametrize("d,ratio", [(64, 3), (256, 8)] + [(d, ratio_for(d)) for d in HEAD_DIMS
                                                         if d not in (64, 256)])
def test_prefill_sliding_window(dev, prefill_shape, d, ratio, n_q, q_pos0, window):
    n = q_pos0 + n_q
    rng = np.random.default_rng(n_q + q_pos0 + window)
    n_q_heads, n_kv = heads(ratio)
    q, k, v = make_inputs(rng, n_q, n_q_heads, n_kv, d, n)
    got = prefill(dev, q, build_cache(k, v, first=max(0, q_pos0 - window + 1)), q_pos0=q_pos0,
                  window=window, variant=prefill_shape)
    np.testing.assert_allclose(got, attention(q, k, v, q_pos0, scale=d ** -0.5, window=window),
                               atol=ATOL, rtol=RTOL)


def repeated_decode_sweep():
    """40 steps at D = 64 with and without a window; 17 steps elsewhere, the
    window alternating."""
    for i, d in enumerate(HEAD_DIMS):
        if d == 64:
            yield d, 0, 40
            yield d, 12, 40
        else:
            yield d, 12 if i % 2 else 0, 17


@pytest.mark.parametrize("d,window,n", list(repeated_decode_sweep()))
def test_prefill_equals_repeated_decode(dev, prefill_shape, d, window, n):
    """Prefill of n queries == n decode steps, the cache growing one token each."""
    q_pos0 = 0
    rng = np.random.default_rng([window, d])
    q, k, v = make_inputs(rng, n, 9, 3, d, n)
    pre = prefill(dev, q, build_cache(k, v), q_pos0=q_pos0, window=window, variant=prefill_shape)
    for t in range(1, n + 1):
        first = max(0, t - window) if window else 0
        step = decode(dev, q[t - 1], build_cache(k[:t], v[:t], first=first), n_tokens=t, window=window)
        # Matrix units sum Q·K 8 at a time and update the softmax per 8 keys: the reference's tolerance.
        mma = prefill_shape == "mma" or (not prefill_shape and dev.properties["matrix_units"])
        close = ATOL if mma else CLOSE
        np.testing.assert_allclose(pre[t - 1], step, atol=close, rtol=close, err_msg=f"step {t}")


# ---- sinks and soft-capping -----------------------------------------------

# Sinks around, far above and far below the scores; a softcap that saturates.
SINKS_SOFTCAP = [(1.0, 0.0), (20.0, 0.0), (-30.0, 0.0), (0.0, 1.0), (1.0, 5.0)]


def sinks_sweep():
    """Every combination at (64, 3) and (128, MQA); elsewhere a sink far above
    the scores, and a sink with a softcap."""
    for d in HEAD_DIMS:
        for sink_scale, softcap in SINKS_SOFTCAP:
            if d in (64, 128):
                yield d, 3 if d == 64 else "mqa", sink_scale, softcap
            elif (sink_scale, softcap) in [(20.0, 0.0), (1.0, 5.0)]:
                yield d, ratio_for(d), sink_scale, softcap


@pytest.mark.parametrize("d,ratio,sink_scale,softcap", list(sinks_sweep()))
def test_sinks_and_softcap(dev, shape, d, ratio, sink_scale, softcap):
    rng = np.random.default_rng([int(abs(sink_scale)), int(softcap)])
    n_q_heads, n_kv = heads(ratio)
    sinks = None if sink_scale == 0.0 else sink_scale * np.abs(rng.standard_normal(n_q_heads)) + \
        (rng.standard_normal(n_q_heads) if sink_scale == 1.0 else 0.0)
    n, n_q = 300, 20
    q, k, v = make_inputs(rng, n_q, n_q_heads, n_kv, d, n)
    cache = build_cache(k, v)
    opts = dict(scale=d ** -0.5, softcap=softcap, sinks=sinks)
    for split in ["never", "always"]:
        got = decode(dev, q[-1], cache, n_tokens=n, softcap=softcap, sinks=sinks,
                     split=split, variant=shape)
        np.testing.assert_allclose(got, attention(q[-1:], k, v, n - 1, **opts)[0], atol=ATOL,
                                   rtol=RTOL)
    got = prefill(dev, q, cache, q_pos0=n - n_q, softcap=softcap, sinks=sinks, variant=shape)
    np.testing.assert_allclose(got, attention(q, k, v, n - n_q, **opts), atol=ATOL, rtol=RTOL)
