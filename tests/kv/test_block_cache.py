"""BlockPool's reservations and prefix-cache blocks, and what BlockTable does
with them (cpp/kv/block_pool.h), against plain models of what they promise:
- reservations: others' allocations leave reserved blocks alone; a table
  spends its own first; a sliding table reserves again what its window frees;
- cached blocks: found by key (tokens and parent verified), kept when their
  last owner lets go (evictable, counted as free), evicted least recently used
  first when the free stack runs out, never written (copy-on-write);
- adopt: a table over cached blocks, owners taken, the window's only for a
  sliding table."""
from __future__ import annotations

import pytest

import metalkv
from metalkv._core import BLOCK_TOKENS as B, BlockPool, BlockTable


def key(i: int, parent: int = 0) -> tuple[int, int, list[int]]:
    """A made-up (hash, parent, tokens) key; the pool treats the hash as opaque."""
    return 1000 + i, parent, [i] * B


def test_reservations_hold_blocks_for_their_owner():
    pool = BlockPool(6)
    t = BlockTable(pool)
    assert t.reserve(4) and pool.reserved_count == 4 and pool.available == 2
    other = BlockTable(pool)
    with pytest.raises(metalkv.GpuError, match=r"asked for 3 blocks, 2 of 6 are available \(4 reserved"):
        other.append(3 * B)  # others may take only the unreserved two
    assert other.length == 0 and pool.free_count == 6  # all or nothing
    other.append(2 * B)
    assert not BlockTable(pool).reserve(1)  # nothing left to reserve
    t.append(3 * B)  # from its own reservation
    assert t.reserved == 1 and pool.reserved_count == 1 and pool.free_count == 1
    t.unreserve()
    assert pool.reserved_count == 0 and pool.available == 1
    del t
    assert pool.free_count == 4 and pool.reserved_count == 0


def test_a_sliding_table_reserves_again_what_its_window_frees():
    pool = BlockPool(8)
    t = BlockTable(pool, window=40, history=1)
    assert t.reserve(3)
    grab = BlockTable(pool)
    grab.append(5 * B)  # everything unreserved is taken by another table
    assert pool.available == 0
    for _ in range(12):  # 12 * 16 = 192 positions: many blocks pass through its window
        t.append(16)
    assert t.held_blocks <= 3 and pool.reserved_count == t.reserved
    assert t.held_blocks + t.reserved == 3  # what it freed came back as reservation, not to `grab`


def test_cached_blocks_are_found_kept_and_evicted_least_recently_used():
    pool = BlockPool(4)
    tables = [BlockTable(pool) for _ in range(3)]
    ids = []
    for i, t in enumerate(tables):
        t.append(B)
        ids.append(t.blocks[0])
        h, p, toks = key(i)
        assert pool.register_block(ids[-1], h, p, toks)
        assert not pool.register_block(ids[-1], *key(9))  # one key per block
    assert not pool.register_block(ids[1], *key(0))  # one block per key
    assert pool.find(*key(1)) == ids[1]
    h, p, toks = key(1)
    assert pool.find(h, p, toks[:-1] + [5]) == -1 and pool.find(h, 77, toks) == -1  # verified, not just hashed
    del tables, t  # last owners go: the blocks stay, evictable, in the order they were let go (0, 1, 2)
    assert pool.cached_count == 3 and pool.evictable_count == 3 and pool.free_count == 4 and pool.used_count == 0
    pool.retain(ids[0])  # a hit takes block 0 out of the LRU; 1 is now the oldest
    assert pool.evictable_count == 2 and pool.owners(ids[0]) == 1
    got = pool.allocate(2)  # the free block, then the oldest evictable (block 1) leaves the cache
    assert ids[1] in got and ids[2] not in got
    assert pool.find(*key(1)) == -1 and pool.find(*key(2)) == ids[2] and pool.cached_count == 2
    pool.release(ids[0])
    assert pool.evictable_count == 2


def test_a_cached_tail_block_is_copied_before_a_write():
    pool = BlockPool(4)
    t = BlockTable(pool)
    t.append(B)
    b = t.blocks[0]
    pool.register_block(b, *key(0))
    t.truncate(B - 5)  # back into the cached block (one owner: the table)
    assert pool.owners(b) == 1 and t.blocks_needed(1) == 1
    copies = t.append(1)
    assert copies == [(b, t.blocks[0])] and t.blocks[0] != b
    assert pool.find(*key(0)) == b  # the cached rows are untouched


@pytest.mark.parametrize("window", [0, 40])
def test_adopt_takes_owners_on_the_blocks_it_needs(window):
    pool = BlockPool(8)
    src = BlockTable(pool)
    src.append(4 * B)
    blocks = list(src.blocks)
    need = blocks if window == 0 else [-1, -1] + blocks[2:]  # a window of 40 at 128 needs positions 89..127
    t = BlockTable(pool, window=window, history=0)
    t.adopt(need, 4 * B)
    assert t.length == 4 * B and list(t.blocks) == need
    for i, b in enumerate(blocks):
        assert pool.owners(b) == (2 if need[i] >= 0 else 1)
    t.append(1)  # a fresh block: the adopted ones are full
    assert list(t.blocks)[:4] == need
    with pytest.raises(metalkv.GpuError, match=r"adopt needs an empty table"):
        t.adopt(need, 4 * B)
    with pytest.raises(metalkv.GpuError, match=r"block 3 is missing"):
        BlockTable(pool).adopt(blocks[:3] + [-1], 4 * B)
