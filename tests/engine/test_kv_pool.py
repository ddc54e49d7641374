"""One KV pool for every cache of an engine (Engine.load(kv_memory=...)): sized
from the budget by the documented rule, caches holding only the blocks they
use, generation identical to caches with pools of their own, and a full pool a
clear error that leaves the cache as it was."""
from __future__ import annotations

import math

import numpy as np
import pytest

import metalkv
from metalkv.kv_options import kv_options
from devices import TEST_DEVICE  # tests/ is on sys.path

B = 32  # metalkv._core.BLOCK_TOKENS, restated


def greedy(engine, ids, cache=None, n=8):
    return engine.generate_ids(ids, cache=cache, max_tokens=n, temperature=0.0, stop_ids=())


def sequence_blocks(window: int, capacity: int, max_chunk: int) -> int:
    """docs/KV_CACHE.md: a full layer's pool, or a sliding one's (window, chunk, history)."""
    full = math.ceil(capacity / B)
    return full if window == 0 else min(full, math.ceil((window + 2 * max_chunk - 1) / B) + 1)


@pytest.fixture(scope="module")
def tiny_paths(tiny_gguf, tiny_sliding_dir):
    return {"tiny": tiny_gguf, "sliding": tiny_sliding_dir}


def load(path, **kw):
    return metalkv.Engine.load(path, device=TEST_DEVICE, context=64, prefill_chunk=4, progress=False, **kw)


def own_room(n_groups: int, max_seqs: int = 64) -> int:
    """docs/KV_CACHE.md: what kv_memory keeps beside the blocks for max_seqs sequences'
    own buffers (no residual window: a uint32 table mirror entry per block of each group)."""
    return max_seqs * n_groups * math.ceil(64 / B) * 4


@pytest.mark.parametrize("model", ["tiny", "sliding"])
def test_pool_size_follows_the_budget(tiny_paths, model):
    own = load(tiny_paths[model], kv_memory=None)
    windows = own.new_cache().windows
    layer_block = 2 * B * own.config.n_kv_heads * own.config.head_dim * 2  # K+V rows of one block, one layer
    groups = list(dict.fromkeys(windows))
    one = {w: sequence_blocks(w, 64, 4) for w in groups}
    one_seq = sum(one[w] * layer_block for w in windows)
    budget = 10 * one_seq + own_room(len(groups)) + 100
    engine = load(tiny_paths[model], kv_memory=budget)
    pool = engine.kv_pool
    assert pool["kv_memory"] == budget and pool["used_bytes"] == pool["nbytes"] and pool["sequence_bytes"] == 0
    assert [g["window"] for g in pool["groups"]] == groups
    for g in pool["groups"]:
        w = g["window"]
        assert g["layers"] == [l for l, x in enumerate(windows) if x == w]
        bounded = w != 0 and one[w] < math.ceil(64 / B)
        # a bounded sliding group: at least its window twice and a block (a call's checkpoint keeps one)
        assert g["blocks"] == max(2 * one[w] + 1, 10 * one[w]) if bounded else g["blocks"] == 10 * one[w]
        assert g["free_blocks"] == g["blocks"] and g["block_bytes"] == layer_block * len(g["layers"])
    assert pool["nbytes"] == sum(g["blocks"] * g["block_bytes"] for g in pool["groups"]) <= 10 * one_seq + 100
    assert own.kv_pool is None


@pytest.mark.parametrize("model", ["tiny", "sliding"])
def test_caches_share_the_pool_and_give_blocks_back(tiny_paths, model):
    own = load(tiny_paths[model], kv_memory=None)
    engine = load(tiny_paths[model], kv_memory="1MB")
    prompts = [list(range(1, 14)), [7, 3, 9, 2, 2, 5], list(range(20, 50))]
    caches = [engine.new_cache() for _ in prompts]
    assert all(c.shares_pool for c in caches) and not own.new_cache().shares_pool
    for ids, cache in zip(prompts, caches):
        # the same ids as a cache with a pool of its own (the reference path)
        assert greedy(engine, ids, cache) == greedy(own, ids)
    held = sum(c.held_nbytes for c in caches)
    pool = engine.kv_pool
    used = sum((g["blocks"] - g["free_blocks"]) * g["block_bytes"] for g in pool["groups"])
    assert held == used > 0
    # what a cache holds of a shared pool: its blocks, and its own tables' mirrors beside them
    assert all(c.nbytes == c.held_nbytes + c.table_nbytes + c.staging_nbytes + c.ring_nbytes for c in caches)
    assert all(c.held_nbytes > 0 for c in caches)
    del caches, cache
    assert all(g["free_blocks"] == g["blocks"] for g in engine.kv_pool["groups"])


def test_a_continued_conversation_in_a_shared_cache_matches_its_own(tiny_paths):
    own, shared = load(tiny_paths["sliding"], kv_memory=None), load(tiny_paths["sliding"], kv_memory="1MB")
    a, b = own.new_cache(), shared.new_cache()
    for ids in ([1, 2, 3, 4, 5, 6, 7, 8, 9], [11, 12], [30, 31, 32, 33, 34, 35]):
        assert greedy(own, ids, a) == greedy(shared, ids, b)
    assert list(a.tokens) == list(b.tokens)


def test_a_call_the_pool_cannot_hold_is_a_clear_error_and_changes_nothing(tiny_paths):
    """With nothing else running, a call whose blocks the pool cannot reserve fails at
    once (waiting would never help), before its cache changes."""
    probe = load(tiny_paths["tiny"], kv_memory=None)
    layer_block = 2 * B * probe.config.n_kv_heads * probe.config.head_dim * 2
    n_layers = probe.config.n_layers
    engine = load(tiny_paths["tiny"], kv_memory=3 * layer_block * n_layers + own_room(1))  # 3 blocks: 96 tokens
    assert engine.kv_pool["groups"][0]["blocks"] == 3
    first = engine.new_cache()
    greedy(engine, list(range(1, 41)), first, n=1)  # 40 tokens: 2 blocks
    second = engine.new_cache()
    before = engine.kv_pool["groups"][0]["free_blocks"]
    other = list(range(2, 42))  # (not the first's prompt, whose cached block it would share)
    with pytest.raises(metalkv.GpuError, match=r"\[engine\] the KV pool is full: this call may store 40 tokens after 0 "
                                               r"and needs 2 blocks of 32 tokens in the layers of window 0; 1 of 3 are "
                                               r"free, the rest held by other caches"):
        greedy(engine, other, second, n=1)
    assert second.length(0) == 0 and list(second.tokens) == []
    assert engine.kv_pool["groups"][0]["free_blocks"] == before
    del first
    assert greedy(engine, other, second, n=1) == greedy(probe, other, n=1)


def test_a_call_reserves_only_what_its_cached_prefix_does_not_hold(tiny_paths):
    """The same prompt again, while the first cache still holds it: its first block
    comes from the prefix cache, so the call needs one block, not two, and fits."""
    probe = load(tiny_paths["tiny"], kv_memory=None)
    layer_block = 2 * B * probe.config.n_kv_heads * probe.config.head_dim * 2
    engine = load(tiny_paths["tiny"], kv_memory=3 * layer_block * probe.config.n_layers + own_room(1))
    first = engine.new_cache()
    greedy(engine, list(range(1, 41)), first, n=1)
    second = engine.new_cache()
    assert greedy(engine, list(range(1, 41)), second, n=1) == greedy(probe, list(range(1, 41)), n=1)
    assert engine.last_stats["prompt_tokens_cached"] == 32


def test_a_call_waits_for_blocks_a_running_call_gives_back(tiny_paths):
    """The pool holds one call at a time: a second one queues (it is not refused,
    and nothing is preempted) and runs once the first has finished and its
    ephemeral cache gave its blocks back; both get what they get alone."""
    import threading
    import time

    probe = load(tiny_paths["tiny"], kv_memory=None)
    layer_block = 2 * B * probe.config.n_kv_heads * probe.config.head_dim * 2
    engine = load(tiny_paths["tiny"], kv_memory=3 * layer_block * probe.config.n_layers + own_room(1))  # 3 blocks
    a, b = list(range(1, 41)), list(range(5, 45))
    first = engine._core.submit(engine.new_cache(), np.asarray(a, np.int64), max_tokens=8, stop_ids=[],
                                hold_at_step=3, ephemeral=True)
    while not first.held:
        pass
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("b", greedy(engine, b)))
    t.start()
    deadline = time.monotonic() + 30
    while not (engine._core.running == 1 and engine._core.queued == 1) and time.monotonic() < deadline:
        pass
    assert engine._core.running == 1 and engine._core.queued == 1  # b waits for a's blocks
    first.resume()
    t.join()
    assert first.result() == greedy(probe, a) and out["b"] == greedy(probe, b)
    assert engine.kv_pool["groups"][0]["free_blocks"] == 3


@pytest.mark.parametrize("value,expected", [
    (None, 0), (0, 0), ("auto", None), ("AUTO", None), (4096, 4096), ("4GB", 4 * 10**9), ("512 MiB", 512 * 2**20), ("1.5gb", 1_500_000_000),
    ("64kib", 65536), (" 7 ", 7)])
def test_kv_memory_sizes(value, expected):
    assert kv_options(kv_memory=value).given["kv_memory"] == ("auto" if expected is None else expected)


@pytest.mark.parametrize("value", [-5, True, "4 parsecs", "GB", "", 3.5, "0MB"])
def test_bad_kv_memory(tiny_paths, value):
    with pytest.raises(metalkv.ArgumentError, match=r"kv_memory"):
        load(tiny_paths["tiny"], kv_memory=value)


def test_a_budget_below_one_block_says_what_one_takes(tiny_paths):
    with pytest.raises(metalkv.ArgumentError, match=r"\[kv_pool\] kv_memory 1000 bytes \(500 of them kept for "
                                               r"sequences' own buffers\) holds no block of the layers of "
                                               r"window 0 \(one block: \d+ bytes in each of their layers"):
        load(tiny_paths["tiny"], kv_memory=1000)
