"""metalkv.KVCache: per-layer pools of BLOCK_TOKENS-slot blocks behind a block
table per window group, sliding layers that let blocks go and reuse them, both
store paths (compute and blit), RoPE on K, truncate, errors and byte
accounting. Every layer is read back by position against a numpy reference of
the rows stored at each position (kvcache_ref.py); sliding layers, truncate and
pool sizes are in test_kvcache_sliding.py."""
from __future__ import annotations

import numpy as np
import pytest

import metalkv
from metalkv._core import BLOCK_TOKENS as B, ops

from .kvcache_ref import F16_BYTES, TABLE_ENTRY_BYTES, Reference, append_all, check, rope_rows, rows
from .test_rope import inv_freq_default_ref, rope_ref, run_rope
from devices import host_only  # tests/ is on sys.path

# ---- storing ----------------------------------------------------------------


@pytest.mark.parametrize("store", ["compute", "blit"])
@pytest.mark.parametrize("style,rotary_dim", [(None, 0), ("neox", 64), ("interleaved", 64), ("neox", 32),
                                              ("interleaved", 16)])
def test_store_is_half_conversion_with_k_roped_at_its_positions(dev, store, style, rotary_dim):
    """No rope: exactly numpy's round-to-nearest-even. Rope: K rotated at its
    positions (continuing across calls and blocks), V never. Other layers untouched."""
    rng = np.random.default_rng(rotary_dim + 1)
    n_kv, d = 3, 64
    cache = metalkv.KVCache(dev, 3, n_kv, d, 64, max_chunk=8, store=store)
    rope = style and dict(style=style, inv_freq=inv_freq_default_ref(rotary_dim, 100000.0), rotary_dim=rotary_dim)
    ref = Reference(n_kv, d)
    for n in [5, 1, 8, 3, 20, 2]:  # 39 tokens: a chunk crosses into the second block
        k, v = rows(rng, n, n_kv, d), rows(rng, n, n_kv, d)
        cache.append(1, k, v, rope=rope)
        ref.append(rope_rows(k, ref.n, rope), v)
        check(cache, 1, ref, rotary_dim)
    assert cache.length(0) == cache.length(2) == 0 and not cache.keys(0).any() and not cache.keys(2).any()
    assert (cache.positions(0) == -1).all() and (cache.positions(2) == -1).all()


@pytest.mark.parametrize("store", ["compute", "blit"])
@pytest.mark.parametrize("style,rotary_dim", [("neox", 64), ("interleaved", 32)])
def test_store_rotates_the_queries_in_the_same_dispatch(dev, store, style, rotary_dim):
    """append(q=...) rotates Q (more heads than K, GQA) at the positions K goes
    to, in the store's one dispatch, as a model step does: the same values as
    the standalone rope kernel, bit for bit, and the reference within float32."""
    rng = np.random.default_rng(5)
    n_kv, n_q, d = 2, 6, 64
    cache = metalkv.KVCache(dev, 1, n_kv, d, 64, max_chunk=16, store=store)
    inv = inv_freq_default_ref(rotary_dim, 10000.0)
    rope = dict(style=style, inv_freq=inv, rotary_dim=rotary_dim)
    ref = Reference(n_kv, d)
    for n in [5, 1, 3, 16, 9]:
        k, v, q = rows(rng, n, n_kv, d), rows(rng, n, n_kv, d), rows(rng, n, n_q, d)
        got = cache.append(0, k, v, rope=rope, q=q)
        positions = range(ref.n, ref.n + n)
        np.testing.assert_array_equal(got, run_rope(dev, q, positions, inv, style, rotary_dim))
        np.testing.assert_allclose(got, rope_ref(q, positions, inv, style, rotary_dim), rtol=0, atol=1e-6)
        assert cache.last_append_counters["dispatches"] == 1
        ref.append(rope_rows(k, ref.n, rope), v)
    check(cache, 0, ref, rotary_dim)  # K still goes in rotated and V as is, as without q


@pytest.mark.parametrize("store", ["compute", "blit"])
@pytest.mark.parametrize("d", ops.attention_head_dims())
def test_store_at_every_attention_head_dim(dev, d, store):
    """At each head_dim the attention kernels take: a full layer with neox rope over
    the whole head, and a sliding one (window 5, chunks of up to 3: 2 blocks, reused
    from position 64 on) with interleaved rope over half of it (partial rotary)."""
    rng = np.random.default_rng(d)
    n_kv, window, max_chunk = 2, 5, 3
    cache = metalkv.KVCache(dev, 2, n_kv, d, 128, windows=[0, window], max_chunk=max_chunk, store=store)
    assert (cache.slots(0), cache.slots(1), cache.wraps(1)) == (128, 2 * B, True)
    ropes = [dict(style="neox", inv_freq=inv_freq_default_ref(d, 10000.0), rotary_dim=d),
             dict(style="interleaved", inv_freq=inv_freq_default_ref(d // 2, 10000.0), rotary_dim=d // 2)]
    refs = [Reference(n_kv, d), Reference(n_kv, d, window, max_chunk)]
    for n in [3, 1, 3, 2, 3] * 6:  # 72 tokens; positions 31, 32 come in one chunk
        k, v = rows(rng, n, n_kv, d), rows(rng, n, n_kv, d)
        for layer, (rope, ref) in enumerate(zip(ropes, refs)):
            cache.append(layer, k, v, rope=rope)
            ref.append(rope_rows(k, ref.n, rope), v)
    for layer, (rope, ref) in enumerate(zip(ropes, refs)):
        check(cache, layer, ref, rope["rotary_dim"])
    assert refs[1].first_held == B and refs[1].n > cache.slots(1)  # block 0 let go and reused


@pytest.mark.parametrize("windows", [None, [0, 7, 0]])
def test_blit_and_compute_caches_are_bit_identical(dev, windows):
    rng = np.random.default_rng(4)
    n_kv, d = 3, 64
    caches = [metalkv.KVCache(dev, 3, n_kv, d, 200, windows=windows, max_chunk=5, store=s) for s in ("compute", "blit")]
    refs = [Reference(n_kv, d, w, 5) for w in (windows or [0, 0, 0])]
    inv = inv_freq_default_ref(48, 10000.0)
    for step, n in enumerate([5, 1, 4, 5, 2, 5, 1, 3] * 4):  # 104 tokens: the sliding layer reuses blocks
        k, v = rows(rng, n, n_kv, d), rows(rng, n, n_kv, d)
        rope = None if step % 3 == 2 else dict(style=("neox", "interleaved")[step % 2], inv_freq=inv)
        for layer, ref in enumerate(refs):
            ref.append(rope_rows(k, ref.n, rope), v)
            for c in caches:
                c.append(layer, k, v, rope=rope)
    for layer, ref in enumerate(refs):
        for c in caches:
            check(c, layer, ref, rotary_dim=48)
        assert caches[0].block_table(layer) == caches[1].block_table(layer)  # so the pools match slot for slot
        for get in ("keys", "values"):
            a, b = (getattr(c, get)(layer) for c in caches)
            assert np.array_equal(a.view(np.uint16), b.view(np.uint16)), (layer, get)


def test_encoders_per_store(host):
    """compute: the one compute encoder, no blit; blit: one compute (the staging
    kernel) + one blit encoder copying K and V of each block's run: the chunk's
    bytes, however many blocks it touches (here 63 | 64, 65, into a reused block)."""
    n_kv, d, rng = 2, 8, np.random.default_rng(3)
    row = n_kv * d * F16_BYTES
    compute = metalkv.KVCache(host, 1, n_kv, d, 1000, windows=[4], max_chunk=3, store="compute")
    compute.append(0, rows(rng, 3, n_kv, d), rows(rng, 3, n_kv, d))
    c = compute.last_append_counters
    assert (c["compute_encoders"], c["blit_encoders"], c["dispatches"], c["blit_bytes_copied"]) == (1, 0, 1, 0)
    blit = metalkv.KVCache(host, 1, n_kv, d, 1000, windows=[4], max_chunk=3, store="blit")
    assert blit.slots(0) == 2 * B
    ref = Reference(n_kv, d, 4, 3)
    for n in [3] * 22:  # positions 0..65
        k, v = rows(rng, n, n_kv, d), rows(rng, n, n_kv, d)
        blit.append(0, k, v)
        ref.append(k, v)
        c = blit.last_append_counters
        assert (c["compute_encoders"], c["blit_encoders"], c["dispatches"]) == (1, 1, 1)
        assert c["blit_bytes_copied"] == 2 * n * row
        check(blit, 0, ref)
    assert ref.first_held == B and blit.block_table(0)[1:] == [1, 0]


@pytest.mark.parametrize("store", ["compute", "blit"])
def test_one_step_across_layers_in_one_command_buffer(dev, store):
    """A model step stores into every layer in one command buffer. compute: the
    caller's single compute encoder serves all layers; blit: each layer costs a
    blit encoder and a fresh compute encoder, and layers share one staging buffer."""
    rng = np.random.default_rng(6)
    n_layers, n_kv, d = 4, 2, 32
    cache = metalkv.KVCache(dev, n_layers, n_kv, d, 128, windows=[0, 3, 0, 3], max_chunk=2, store=store)
    rope = dict(style="neox", inv_freq=inv_freq_default_ref(d, 10000.0))
    refs = [Reference(n_kv, d, w, 2) for w in cache.windows]
    for n in [2, 1, 2, 2] * 11:  # 77 tokens: the sliding layers (2 blocks) reuse theirs
        k, v = rows(rng, n_layers, n, n_kv, d), rows(rng, n_layers, n, n_kv, d)
        append_all(cache, refs, k, v, rope)
        c = cache.last_append_counters
        want = (1, 0) if store == "compute" else (n_layers, n_layers)
        assert (c["compute_encoders"], c["blit_encoders"], c["dispatches"]) == want + (n_layers,)
    for layer, ref in enumerate(refs):
        check(cache, layer, ref, rotary_dim=d)
    assert refs[1].first_held == 2 * B


def test_step_across_layers_is_all_or_nothing(host):
    cache = metalkv.KVCache(host, 3, 1, 4, 16, windows=[0, 0, 4], max_chunk=2)
    three = np.ones((3, 3, 1, 4), np.float32)
    with pytest.raises(metalkv.GpuError, match=r"layer 2 is sliding \(window 4, 32 slots\)"):
        cache.append_all_layers(three, three)
    assert [cache.length(l) for l in range(3)] == [0, 0, 0]  # layers 0 and 1 did not move
    assert cache.block_table(0) == [] and cache.block_table(2) == []
    with pytest.raises(ValueError, match=r"k has shape \(2, 3, 1, 4\); expected \(n_layers=3, n, n_kv_heads=1"):
        cache.append_all_layers(three[:2], three[:2])


# ---- views and bookkeeping --------------------------------------------------


@host_only  # zero-copy views need CPU-visible memory (a discrete GPU returns copies)
def test_views_are_copy_free(host):
    cache = metalkv.KVCache(host, 2, 2, 8, 16)
    keys_before = cache.keys(1)
    values_before = cache.values(1)
    k = np.full((2, 2, 8), 0.5, np.float32)
    cache.append(1, k, 2 * k)
    slots = [cache.block_table(1)[0] * B + p for p in range(2)]
    assert (keys_before[slots] == 0.5).all() and (values_before[slots] == 1.0).all()  # the store is visible
    assert np.shares_memory(keys_before, cache.keys(1))
    assert not np.shares_memory(cache.keys(1), cache.values(1))
    assert cache.keys(1).shape == (B, 2, 8) and cache.keys(1).dtype == np.float16
    keys_before[5, 1, 3] = 7.0  # writes through the view reach the cache
    assert cache.keys(1)[5, 1, 3] == 7.0


@host_only  # reads the layout through the views' addresses
def test_layer_layout_is_k_block_then_v_block(host):
    """The documented layout (2, slots, n_kv_heads, head_dim): V starts slots rows after K."""
    cache = metalkv.KVCache(host, 1, 2, 4, 8)
    k = np.arange(16, dtype=np.float32).reshape(2, 2, 4)
    cache.append(0, k, -k)
    slot = cache.block_table(0)[0] * B
    region = np.concatenate([cache.keys(0).ravel(), cache.values(0).ravel()]).reshape(2, B, 2, 4)
    np.testing.assert_array_equal(region[0, slot:slot + 2], k.astype(np.float16))
    np.testing.assert_array_equal(region[1, slot:slot + 2], (-k).astype(np.float16))
    base = cache.keys(0).__array_interface__["data"][0]
    assert cache.values(0).__array_interface__["data"][0] - base == B * 2 * 4 * F16_BYTES


@pytest.mark.parametrize("store", ["compute", "blit"])
def test_byte_accounting(host, store):
    n_kv, d, cap, max_chunk = 3, 64, 100, 4
    windows = [0, 10, 0, 200, 10]  # full, sliding (2 blocks), full, no smaller than full, sliding
    cache = metalkv.KVCache(host, 5, n_kv, d, cap, windows=windows, max_chunk=max_chunk, store=store)
    row = n_kv * d * F16_BYTES  # one token's K (or V) row
    slots = [4 * B, 2 * B, 4 * B, 4 * B, 2 * B]  # ceil(100/32) = 4; ceil(17/32) + 1 = 2; min(4, ceil(207/32) + 1)
    assert [cache.slots(l) for l in range(5)] == slots
    assert [cache.layer_nbytes(l) for l in range(5)] == [2 * s * row for s in slots]
    staging = 2 * max_chunk * row if store == "blit" else 0
    assert cache.staging_nbytes == staging
    tables = 3 * 4 * TABLE_ENTRY_BYTES  # one table per window (0, 10, 200), ceil(100/32) entries each
    assert cache.table_nbytes == tables
    assert cache.nbytes == sum(2 * s * row for s in slots) + staging + tables
    # one more context token costs a K and a V row in each layer that does not wrap
    assert cache.bytes_per_token == 3 * 2 * row
    for _ in range(25):  # 100 tokens: nothing grows
        cache.append_all_layers(np.ones((5, 4, n_kv, d), np.float32), np.ones((5, 4, n_kv, d), np.float32))
    assert cache.nbytes == sum(2 * s * row for s in slots) + staging + tables


def test_blit_staging_grows_for_big_full_layer_chunks(host):
    cache = metalkv.KVCache(host, 2, 1, 8, 64, windows=[0, 4], max_chunk=2, store="blit")
    row = 8 * F16_BYTES
    assert cache.staging_nbytes == 2 * 2 * row
    k = np.random.default_rng(0).uniform(-1, 1, (40, 1, 8)).astype(np.float32)
    cache.append(0, k, -k)  # a full layer takes chunks past max_chunk (this one over 2 blocks)
    ref = Reference(1, 8)
    ref.append(k, -k)
    check(cache, 0, ref)
    assert cache.staging_nbytes == 2 * 40 * row
    # layer 0: 2 blocks; layer 1: min(2, ceil(7/32) + 1) = 2 blocks; 2 tables of ceil(64/32) entries
    assert cache.nbytes == 2 * 64 * row + 2 * 64 * row + 2 * 40 * row + 2 * 2 * TABLE_ENTRY_BYTES


def test_reset(host):
    cache = metalkv.KVCache(host, 2, 1, 4, 256, windows=[0, 3])
    x = np.ones((2, 1, 1, 4), np.float32)
    for _ in range(100):
        cache.append_all_layers(x, x)
    cache.reset()
    assert cache.length(0) == cache.length(1) == 0 and cache.block_table(0) == cache.block_table(1) == []
    assert (cache.positions(0) == -1).all() and (cache.positions(1) == -1).all()
    refs = [Reference(1, 4), Reference(1, 4, 3)]
    for step in range(100):  # the pools are whole again
        append_all(cache, refs, (step + 3) * x, x)
        for layer, ref in enumerate(refs):
            check(cache, layer, ref)


def test_properties(host):
    cache = metalkv.KVCache(host, 2, 3, 16, 32, windows=[0, 8], max_chunk=4, store="blit")
    assert B == 32
    assert (cache.n_layers, cache.n_kv_heads, cache.head_dim, cache.capacity) == (2, 3, 16, 32)
    assert (cache.max_chunk, cache.store, cache.windows) == (4, "blit", [0, 8])
    assert (cache.window(0), cache.window(1)) == (0, 8)
    assert (cache.slots(0), cache.slots(1), cache.wraps(0), cache.wraps(1)) == (B, B, False, False)


# ---- errors -----------------------------------------------------------------


def test_full_layer_overflow_raises_and_keeps_state(host):
    cache = metalkv.KVCache(host, 4, 1, 4, 4096, max_chunk=4096)
    big = np.zeros((4096, 1, 4), np.float32)
    cache.append(3, big, big)
    five = np.ones((5, 1, 4), np.float32)
    with pytest.raises(metalkv.GpuError,
                       match=r"^\[kv_cache\] layer 3 holds 4096 tokens; storing 5 more needs 4101 > capacity 4096"):
        cache.append(3, five, five)
    assert cache.length(3) == 4096 and not cache.keys(3).any()
    assert len(cache.block_table(3)) == 4096 // B


def test_bad_shapes_dtypes_and_layers(host):
    cache = metalkv.KVCache(host, 2, 2, 8, 16)
    ok = np.zeros((1, 2, 8), np.float32)
    with pytest.raises(ValueError, match=r"\[kv_cache\] k has dtype float64; expected float32"):
        cache.append(0, ok.astype(np.float64), ok)
    with pytest.raises(ValueError, match=r"\[kv_cache\] v has dtype float16; expected float32"):
        cache.append(0, ok, ok.astype(np.float16))
    with pytest.raises(ValueError, match=r"k has shape \(1, 3, 8\); expected \(n, n_kv_heads=2, head_dim=8\)"):
        cache.append(0, np.zeros((1, 3, 8), np.float32), ok)
    with pytest.raises(ValueError, match=r"v has shape \(2, 8\); expected"):
        cache.append(0, ok, np.zeros((2, 8), np.float32))
    with pytest.raises(ValueError, match=r"k has shape \(0, 2, 8\)"):
        cache.append(0, ok[:0], ok[:0])
    with pytest.raises(ValueError, match=r"k has 1 tokens but v has 2"):
        cache.append(0, ok, np.zeros((2, 2, 8), np.float32))
    with pytest.raises(metalkv.GpuError, match=r"\[kv_cache\] layer 2 is out of range; the cache has 2 layers \(0..1\)"):
        cache.append(2, ok, ok)
    for call in (cache.keys, cache.values, cache.positions, cache.length, cache.layer_nbytes, cache.slots,
                 cache.window, cache.wraps, cache.block_table):
        with pytest.raises(metalkv.GpuError, match="layer 5 is out of range"):
            call(5)
    assert cache.length(0) == 0 and cache.block_table(0) == []


def test_bad_rope(host):
    cache = metalkv.KVCache(host, 1, 1, 8, 16)
    x = np.zeros((1, 1, 8), np.float32)
    inv = inv_freq_default_ref(8, 10000.0)
    with pytest.raises(ValueError, match=r"\[rope\] unknown style 'gptj'; expected 'neox'"):
        cache.append(0, x, x, rope=dict(style="gptj", inv_freq=inv))
    with pytest.raises(metalkv.GpuError, match=r"\[kv_cache\] rotary_dim 7 must be even and between 2 and head_dim 8"):
        cache.append(0, x, x, rope=dict(style="neox", inv_freq=inv[:3], rotary_dim=7))
    with pytest.raises(metalkv.GpuError, match=r"rotary_dim 10 must be even and between 2 and head_dim 8"):
        cache.append(0, x, x, rope=dict(style="neox", inv_freq=inv_freq_default_ref(10, 1e4)))
    with pytest.raises(ValueError, match=r"inv_freq has 4 frequencies; rotary_dim 4 needs 2"):
        cache.append(0, x, x, rope=dict(style="neox", inv_freq=inv, rotary_dim=4))
    with pytest.raises(ValueError, match=r"rope inv_freq has dtype float64"):
        cache.append(0, x, x, rope=dict(style="neox", inv_freq=inv.astype(np.float64)))
    with pytest.raises(ValueError, match=r"unknown rope key 'theta'"):
        cache.append(0, x, x, rope=dict(style="neox", inv_freq=inv, theta=1e4))
    with pytest.raises(ValueError, match=r"q= is rotated with k's rope; pass rope= too"):
        cache.append(0, x, x, q=np.zeros((1, 4, 8), np.float32))
    with pytest.raises(ValueError, match=r"q has shape \(2, 4, 8\); expected \(n=1, n_heads >= 1, head_dim=8\)"):
        cache.append(0, x, x, rope=dict(style="neox", inv_freq=inv), q=np.zeros((2, 4, 8), np.float32))
    assert cache.length(0) == 0


def test_bad_construction(host):
    with pytest.raises(ValueError, match=r"unknown store path 'copy'; expected 'compute'"):
        metalkv.KVCache(host, 1, 1, 8, 16, store="copy")
    with pytest.raises(metalkv.GpuError, match=r"windows has 1 entries; expected one per layer \(2\)"):
        metalkv.KVCache(host, 2, 1, 8, 16, windows=[0])
    with pytest.raises(metalkv.GpuError, match=r"must be positive"):
        metalkv.KVCache(host, 2, 1, 8, 0)
    with pytest.raises(metalkv.GpuError, match=r"max_chunk must be at least 1"):
        metalkv.KVCache(host, 2, 1, 8, 16, max_chunk=0)