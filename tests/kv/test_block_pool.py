"""The paged cache's block bookkeeping (cpp/kv/block_pool.h): BlockPool and
BlockTable against a plain model of what they promise. Each table writes its
own values into a simulated slot memory through slot(), making the copies that
append() asks for first; whatever several tables do (grow, share a prefix,
truncate, slide, go away), every position a table still holds must read back
its own value, and the pool's counts must equal the owners the tables hold."""
from __future__ import annotations

import numpy as np
import pytest

import metalkv
from metalkv._core import BLOCK_TOKENS as B, BlockPool, BlockTable


class Memory:
    """Slot -> value, written and read only through a table's slots."""

    def __init__(self):
        self.slots = {}

    def store(self, table, values):
        for src, dst in table.append(len(values)):  # copy-on-write first
            for i in range(B):
                if src * B + i in self.slots:
                    self.slots[dst * B + i] = self.slots[src * B + i]
        start = table.length - len(values)
        for i, v in enumerate(values):
            self.slots[table.slot(start + i)] = v


def first_needed(n, window):
    """The lowest position the queries from position n on can see."""
    return 0 if window == 0 or n < window else n - window + 1


def first_held(table):
    return first_needed(table.length, table.window)


def lost_at(table, n):
    """Whether the window at n needs a stored position whose block the table let go."""
    first = first_needed(n, table.window)
    return first < n and table.blocks[first // B] < 0


def check(pool, tables, expected, mem):
    owners = {}
    for t in tables:
        held = [b for b in t.blocks if b >= 0]
        assert len(held) == len(set(held)) == t.held_blocks  # a block once per table
        for b in held:
            owners[b] = owners.get(b, 0) + 1
        assert len(t.blocks) == -(-t.length // B)
        for pos in range(first_held(t), t.length):
            assert mem.slots[t.slot(pos)] == expected[id(t)][pos], (pos, t.window)
    assert pool.used_count == len(owners)
    for b, n in owners.items():
        assert pool.owners(b) == n


@pytest.mark.parametrize("window,history", [(0, 0), (1, 0), (45, 0), (64, 0), (100, 0), (45, 7), (1, 33)])
@pytest.mark.parametrize("seed", range(6))
def test_random_operations_keep_every_table_whole(window, history, seed):
    rng = np.random.default_rng(seed * 7 + window + history)
    pool = BlockPool(64)
    mem = Memory()
    tables, expected = [], {}
    counter = iter(range(10**9))
    for _ in range(300):
        t = src = None  # names from an iteration that ended early (continue)
        op = rng.choice(["append", "append", "append", "share", "truncate", "drop"])
        if op == "append" or not tables:
            if not tables or rng.random() < 0.1:
                tables.append(BlockTable(pool, window, history))
                expected[id(tables[-1])] = []
            t = tables[rng.integers(len(tables))]
            n = int(rng.choice([1, 1, 3, B - 1, B, B + 5, 70]))
            values = [next(counter) for _ in range(n)]
            need, free, before = t.blocks_needed(n), pool.free_count, (t.length, list(t.blocks))
            fits = t.can_append(n)
            try:
                mem.store(t, values)
            except metalkv.GpuError as e:
                assert "are free" in str(e) and not fits
                assert (t.length, list(t.blocks)) == before and pool.free_count == free  # all or nothing
                continue
            assert fits and pool.free_count >= free - need
            expected[id(t)] += values
        elif op == "share":
            src = tables[rng.integers(len(tables))]
            n = int(rng.integers(0, src.length + 1))
            if lost_at(src, n):
                with pytest.raises(metalkv.GpuError, match="has left the window"):
                    BlockTable(pool, window, history).share_prefix(src, n)
                continue
            t = BlockTable(pool, window, history)
            t.share_prefix(src, n)
            tables.append(t)
            expected[id(t)] = list(expected[id(src)][:n])
        elif op == "truncate":
            t = tables[rng.integers(len(tables))]
            n = int(rng.integers(0, t.length + 1))
            if lost_at(t, n):
                with pytest.raises(metalkv.GpuError, match="has left the pool"):
                    t.truncate(n)
                continue
            t.truncate(n)
            del expected[id(t)][n:]
        else:
            t = tables.pop(int(rng.integers(len(tables))))
            del expected[id(t)]
        t = src = None  # a dropped table's blocks go back now (no name keeps it alive)
        check(pool, tables, expected, mem)
    t = src = None
    tables.clear()
    assert pool.used_count == 0 and pool.free_count == 64


def test_full_table_grows_block_by_block():
    pool = BlockPool(8)
    t = BlockTable(pool)
    assert t.append(1) == [] and t.blocks == [0] and pool.used_count == 1
    t.append(B - 1)
    assert t.blocks == [0] and t.blocks_needed(1) == 1
    t.append(1)
    assert t.blocks == [0, 1] and t.slot(B) == B and t.slot(3) == 3
    t.truncate(B)
    assert t.blocks == [0] and pool.free_count == 7
    t.truncate(0)
    assert t.blocks == [] and pool.used_count == 0
    other = BlockPool(4)
    assert other.allocate(3) == [0, 1, 2]
    other.release(0)
    other.release(2)
    assert other.allocate(1) == [2]  # the most recently freed first (its memory is the warmest)


def test_sliding_table_memory_stays_flat():
    """A window of 100 decoded token by token holds at most ceil(100 / B) + 1 blocks."""
    pool = BlockPool(8)
    t = BlockTable(pool, 100)
    peak = 0
    for _ in range(5000):
        t.append(1)
        peak = max(peak, pool.used_count)
        assert t.slot(t.length - 1) >= 0 and t.slot(max(0, t.length - 100)) >= 0
    assert peak == -(-100 // B) + 1
    with pytest.raises(metalkv.GpuError, match="left the sliding window of 100"):
        t.slot(t.length - 200)


def test_shared_prefix_copies_its_tail_on_write():
    pool = BlockPool(8)
    a = BlockTable(pool)
    a.append(B + 5)
    b = BlockTable(pool)
    b.share_prefix(a, B + 5)
    assert b.blocks == a.blocks and pool.owners(a.blocks[1]) == 2 and pool.used_count == 2
    assert b.blocks_needed(1) == 1
    copies = b.append(1)
    assert copies == [(a.blocks[1], b.blocks[1])] and b.blocks[0] == a.blocks[0] != b.blocks[1]
    assert pool.owners(a.blocks[1]) == 1 and pool.owners(a.blocks[0]) == 2
    assert a.append(1) == []  # a owns its tail alone again: writes in place
    c = BlockTable(pool)
    c.share_prefix(a, B)  # a whole block: nothing to copy later
    assert c.append(1) == [] and c.blocks[0] == a.blocks[0] and pool.owners(a.blocks[0]) == 3


def test_errors_say_what_and_how_much():
    pool = BlockPool(2)
    t = BlockTable(pool)
    with pytest.raises(metalkv.GpuError, match=r"\[block_pool\] asked for 3 blocks, 2 of 2 are available"):
        t.append(2 * B + 1)
    assert t.length == 0 and pool.free_count == 2
    t.append(3)
    with pytest.raises(metalkv.GpuError, match=r"\[block_table\] position 3 is not stored \(length 3\)"):
        t.slot(3)
    with pytest.raises(metalkv.GpuError, match="cannot truncate to 4 tokens: the table holds 3"):
        t.truncate(4)
    with pytest.raises(metalkv.GpuError, match="needs an empty table"):
        t.share_prefix(t, 1)
    with pytest.raises(metalkv.GpuError, match="one pool and one window"):
        BlockTable(pool, 8).share_prefix(t, 1)
    with pytest.raises(metalkv.GpuError, match=r"releasing block 1, which is free"):
        pool.release(1)
    with pytest.raises(metalkv.GpuError, match="at least one block"):
        BlockPool(0)


def test_history_keeps_positions_for_truncate():
    """A sliding table lets a block go only once it lies wholly before the window
    of the append's first query less `history` positions. Window 40, 300 one-token
    appends: the last started at 299, whose window starts at 260 (block 8); going
    back 9 tokens to 291 needs 252 (block 7), which history 8 kept and 0 let go."""
    kept, plain = BlockTable(BlockPool(16), 40, history=8), BlockTable(BlockPool(16), 40)
    for t in (kept, plain):
        for _ in range(300):
            t.append(1)
    assert kept.blocks[7] >= 0 and all(b < 0 for b in kept.blocks[:7])
    assert plain.blocks[7] < 0 and plain.blocks[8] >= 0
    kept.truncate(291)
    assert kept.length == 291
    with pytest.raises(metalkv.GpuError, match="position 252, which the window at 291 needs, has left the pool"):
        plain.truncate(291)


def test_skip_to_starts_a_sliding_table_later():
    pool = BlockPool(4)
    t = BlockTable(pool, 10)
    t.skip_to(70)
    assert (t.length, t.first_valid, t.held_blocks, len(t.blocks)) == (70, 70, 0, 3)
    t.append(3)
    assert t.held_blocks == 1 and t.slot(72) == t.blocks[2] * B + 72 % B
    with pytest.raises(metalkv.GpuError, match="not stored|left the sliding window"):
        t.slot(50)
    with pytest.raises(metalkv.GpuError, match="a full table cannot start at position 5"):
        BlockTable(pool).skip_to(5)
    with pytest.raises(metalkv.GpuError, match="skip_to needs an empty table"):
        t.skip_to(100)


def test_state_and_restore_take_the_same_blocks_back():
    pool = BlockPool(8)
    t = BlockTable(pool, 0)
    t.append(70)
    state = t.state()
    t.truncate(10)
    t.append(100)  # takes other blocks too
    t.restore(*state)
    assert t.state() == state and pool.used_count == 3
    t.truncate(0)
    other = BlockTable(pool)
    other.append(B)  # takes a block t gave back
    taken = other.blocks[0]
    assert taken in state[2]  # the free stack hands out what t gave back last: its first block
    with pytest.raises(metalkv.GpuError, match=f"acquiring block {taken}, which is not free"):
        t.restore(*state)
    assert t.length == 0 and pool.owners(taken) == 1  # refused whole: nothing taken
