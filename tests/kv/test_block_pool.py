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


@pytest.mark.parametrize("window", [0, 1, 45, 64, 100])
@pytest.mark.parametrize("seed", range(6))
def test_random_operations_keep_every_table_whole(window, seed):
    rng = np.random.default_rng(seed * 7 + window)
    pool = BlockPool(64)
    mem = Memory()
    tables, expected = [], {}
    counter = iter(range(10**9))
    for _ in range(300):
        t = src = None  # names from an iteration that ended early (continue)
        op = rng.choice(["append", "append", "append", "share", "truncate", "drop"])
        if op == "append" or not tables:
            if not tables or rng.random() < 0.1:
                tables.append(BlockTable(pool, window))
                expected[id(tables[-1])] = []
            t = tables[rng.integers(len(tables))]
            n = int(rng.choice([1, 1, 3, B - 1, B, B + 5, 70]))
            values = [next(counter) for _ in range(n)]
            need, free, before = t.blocks_needed(n), pool.free_count, (t.length, list(t.blocks))
            try:
                mem.store(t, values)
            except metalkv.GpuError as e:
                assert "are free" in str(e)
                assert (t.length, list(t.blocks)) == before and pool.free_count == free  # all or nothing
                continue
            assert pool.free_count >= free - need
            expected[id(t)] += values
        elif op == "share":
            src = tables[rng.integers(len(tables))]
            n = int(rng.integers(0, src.length + 1))
            if lost_at(src, n):
                with pytest.raises(metalkv.GpuError, match="has left the window"):
                    BlockTable(pool, window).share_prefix(src, n)
                continue
            t = BlockTable(pool, window)
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
    with pytest.raises(metalkv.GpuError, match=r"\[block_pool\] asked for 3 blocks, 2 of 2 are free"):
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
