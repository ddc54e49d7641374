"""metalkv.KVCache's sliding layers: pool sizes, blocks let go and reused as the
window moves (memory stays bounded), truncate within the kept history, and the
errors of a table that let go of what a store or a truncate needs; read back by
position against the numpy reference (kvcache_ref.py)."""
from __future__ import annotations

import numpy as np
import pytest

import metalkv
from metalkv._core import BLOCK_TOKENS as B

from .kvcache_ref import F16_BYTES, TABLE_ENTRY_BYTES, Reference, append_all, check, pool_blocks, rows


@pytest.mark.parametrize("window,capacity,max_chunk", [(6, 100, 1), (31, 100, 1), (32, 100, 1), (64, 100, 1),
                                                       (10, 1000, 4), (5, 64, 3), (16, 8, 2)])
def test_pool_sizes(host, window, capacity, max_chunk):
    """Pools follow the spec. A sliding layer wraps (never overflows) only when
    its pool is smaller than a full layer's; else it overflows at capacity."""
    cache = metalkv.KVCache(host, 2, 1, 4, capacity, windows=[0, window], max_chunk=max_chunk)
    full, sliding = pool_blocks(0, capacity, max_chunk), pool_blocks(window, capacity, max_chunk)
    assert (cache.slots(0), cache.slots(1)) == (full * B, sliding * B)
    assert not cache.wraps(0) and cache.wraps(1) == (sliding < full) and cache.window(1) == window
    if not cache.wraps(1):
        one = np.ones((1, 1, 4), np.float32)
        for _ in range(capacity):
            cache.append(1, one, one)
        with pytest.raises(metalkv.GpuError, match=rf"layer 1 holds {capacity} tokens; storing 1 more needs "
                                                   rf"{capacity + 1} > capacity {capacity}"):
            cache.append(1, one, one)
        assert cache.length(1) == capacity


@pytest.mark.parametrize("store", ["compute", "blit"])
@pytest.mark.parametrize("window,max_chunk", [(5, 3), (40, 7), (33, 16)])
def test_sliding_layers_through_random_chunks_and_truncates(dev, store, window, max_chunk):
    """Two sliding layers (one table) and a full one take ~300 tokens in random
    chunks of at most max_chunk, with truncates of up to max_chunk between. After
    every call each layer holds what the reference does: each chunk's windows, and
    max_chunk more positions after an append that starts past all earlier ones."""
    rng = np.random.default_rng(window * 100 + max_chunk)
    n_kv, d, windows = 1, 8, [window, 0, window]
    cache = metalkv.KVCache(dev, 3, n_kv, d, 1024, windows=windows, max_chunk=max_chunk, store=store)
    refs = [Reference(n_kv, d, w, max_chunk) for w in windows]
    slots = pool_blocks(window, 1024, max_chunk) * B
    assert cache.slots(0) == cache.slots(2) == slots and cache.wraps(0)
    top = 0  # the latest start of an append
    while refs[0].n < 300:
        n = refs[0].n
        if n and rng.random() < 0.3:
            to = max(0, n - int(rng.integers(1, max_chunk + 1)))
            ok = to < window or to - window + 1 >= refs[0].first_held  # the window at `to` is held
            assert ok or to < top - max_chunk  # always ok from (latest append start) - max_chunk on
            if ok:
                cache.truncate(to)
                for r in refs:
                    r.truncate(to)
            else:
                with pytest.raises(metalkv.GpuError, match=rf"cannot truncate layer 0 \(window {window}\) to {to} "
                                                           rf"tokens: .*position {to - window + 1}, which the window"):
                    cache.truncate(to)
        else:
            c = int(rng.integers(1, max_chunk + 1))
            k, v = rows(rng, 3, c, n_kv, d), rows(rng, 3, c, n_kv, d)
            append_all(cache, refs, k, v)
            held = set(check(cache, 0, refs[0]))
            assert set(range(max(0, n - window + 1), n + c)) <= held  # every query of the chunk: its window
            if n >= top:
                assert set(range(max(0, n + c - window + 1 - max_chunk), n + c)) <= held
            top = max(top, n)
        for layer, r in enumerate(refs):
            check(cache, layer, r)
        assert cache.block_table(0) == cache.block_table(2)
    assert refs[0].n > slots and cache.slots(0) == slots  # blocks were reused; the pool did not grow


def test_sliding_memory_stays_bounded(host):
    """2000 tokens through a window of 6: the pool keeps its 2 blocks; only the
    table's device mirror grows (4 bytes per 32 tokens, doubling from ceil(capacity/32))."""
    n_kv, d, cap, mc = 2, 8, 100, 4
    cache = metalkv.KVCache(host, 1, n_kv, d, cap, windows=[6], max_chunk=mc)
    layer_bytes, mirror = 2 * 2 * B * n_kv * d * F16_BYTES, -(-cap // B)
    ref, x = Reference(n_kv, d, 6, mc), np.ones((mc, n_kv, d), np.float32)
    for step in range(500):
        cache.append(0, x * step, -x * step)
        ref.append(x * step, -x * step)
        used = -(-ref.n // B)
        mirror = max(used, 2 * mirror) if used > mirror else mirror
        assert cache.table_nbytes == mirror * TABLE_ENTRY_BYTES and cache.layer_nbytes(0) == layer_bytes
    check(cache, 0, ref)
    assert mirror == 64 and cache.nbytes == layer_bytes + 64 * TABLE_ENTRY_BYTES and cache.bytes_per_token == 0


def test_truncate(host):
    # layer 0 full, layer 1 window 3 with max_chunk 2 (a pool of 2 blocks)
    cache = metalkv.KVCache(host, 2, 1, 4, 256, windows=[0, 3], max_chunk=2)
    refs = [Reference(1, 4), Reference(1, 4, 3, 2)]
    for p in range(37):  # the append at 36 lets block 0 go: 36 - 3 + 1 - 2 = 32
        append_all(cache, refs, np.full((2, 1, 1, 4), p, np.float32), np.full((2, 1, 1, 4), -p, np.float32))
    assert cache.block_table(1)[0] == -1 and refs[1].first_held == B
    with pytest.raises(metalkv.GpuError, match=r"^\[kv_cache\] cannot truncate layer 1 \(window 3\) to 33 tokens: "
                                               r".*from 37 to 33 tokens: position 31, which the window at 33 needs, "
                                               r"has left the pool \(it keeps 2 positions more than the window\)"):
        cache.truncate(33)
    with pytest.raises(metalkv.GpuError, match=r"cannot truncate layer 0 to 38 tokens: it holds only 37"):
        cache.truncate(38)
    for layer, ref in enumerate(refs):  # nothing changed
        check(cache, layer, ref)
    cache.truncate(34)  # 3 > max_chunk tokens: position 32 (the window at 34) is still held
    for ref in refs:
        ref.truncate(34)
    append_all(cache, refs, np.full((2, 2, 1, 4), 40, np.float32), np.zeros((2, 2, 1, 4), np.float32))
    for layer, ref in enumerate(refs):  # positions 34, 35 again, new rows
        check(cache, layer, ref)
    full, ref = metalkv.KVCache(host, 1, 1, 4, 256), Reference(1, 4)  # a full layer truncates anywhere
    for n, to in [(40, 5), (30, 0), (50, 33)]:
        x = np.random.default_rng(n).uniform(-1, 1, (n, 1, 4)).astype(np.float32)
        full.append(0, x, x)
        ref.append(x, x)
        full.truncate(to)
        ref.truncate(to)
        check(full, 0, ref)


def test_chunk_larger_than_max_chunk_on_sliding_layer(host):
    cache = metalkv.KVCache(host, 2, 1, 4, 1000, windows=[0, 8], max_chunk=2)
    three = np.ones((3, 1, 4), np.float32)
    with pytest.raises(metalkv.GpuError, match=r"layer 1 is sliding \(window 8, 64 slots\); storing 3 tokens "
                                              r"in one call exceeds max_chunk 2"):
        cache.append(1, three, three)
    assert cache.length(1) == 0
    cache.append(0, three, three)  # a full layer does not care
    assert cache.length(0) == 3


@pytest.mark.parametrize("store", ["compute", "blit"])
def test_layer_behind_a_sliding_group_that_let_go_raises(host, store):
    """Two layers share a window's table; storing into the one left behind,
    whose positions the table let go, is refused before anything is encoded."""
    cache = metalkv.KVCache(host, 2, 1, 4, 1000, windows=[5, 5], max_chunk=1, store=store)
    one = np.ones((1, 1, 4), np.float32)
    for _ in range(100):
        cache.append(0, one, one)
    with pytest.raises(metalkv.GpuError, match=r"\[kv_cache\] layer 1 holds 0 tokens, behind the 100 of its "
                                               r"window group \(window 5\), which has let go of position 0"):
        cache.append(1, one, one)
    assert cache.length(1) == 0 and (cache.positions(1) == -1).all()


def test_window_of_one_truncated_into_a_let_go_block_holds_only_what_it_stored(host):
    """Window 1 needs no history, so truncating into a block it let go is
    allowed; the fresh tail block's earlier rows were never stored."""
    cache = metalkv.KVCache(host, 1, 1, 4, 1000, windows=[1], max_chunk=2)
    for i in range(100):
        cache.append(0, np.full((1, 1, 4), i, np.float32), np.full((1, 1, 4), i, np.float32))
    cache.truncate(40)
    cache.append(0, np.full((1, 1, 4), 1000, np.float32), np.full((1, 1, 4), 1000, np.float32))
    pos = cache.positions(0)
    assert sorted(pos[pos >= 0]) == [40]
    assert cache.keys(0)[np.flatnonzero(pos == 40)[0], 0, 0] == 1000
