"""kv_memory as a hard cap, and Engine.memory() (issue 36, docs/KV_CACHE.md "Every byte
counted"): the engine's KV bytes on the device (the shared pool, and each running
sequence's own buffers: its residual ring, a checkpoint's copy of it, its block-table
mirrors) are charged to one budget that never passes kv_memory. Calls that find no room
for their own buffers wait, as they wait for blocks; a lone call that cannot fit is a clear
error. The checks: the device's own count of live buffer bytes (Device.memory_use), and
the rings' sizes restated here from the layout (docs/KV_QUANT.md, "Residual window")."""
from __future__ import annotations

import math

import numpy as np
import pytest

import metalkv
from metalkv import _core
from devices import TEST_DEVICE  # tests/ is on sys.path

B = 32  # _core.BLOCK_TOKENS
CONTEXT, CHUNK, RESIDUAL = 256, 16, 32
KV = dict(kv_k="q4", kv_v="q4", kv_residual=RESIDUAL)


def load(path, **kw):
    return metalkv.Engine.load(path, device=TEST_DEVICE, context=CONTEXT, prefill_chunk=CHUNK, progress=False,
                               **{**KV, **kw})


def ring_bytes(eng) -> int:
    """One sequence's ring: every layer (all are q4), K and V, max_chunk + residual +
    a block less one positions in whole blocks, f16 rows."""
    slots = math.ceil((CHUNK + RESIDUAL + B - 1) / B) * B
    return eng.config.n_layers * 2 * slots * eng.config.n_kv_heads * eng.config.head_dim * 2


def own_bytes(eng) -> int:
    """What a sequence holds beside its blocks: its ring and a uint32 mirror entry per block."""
    return ring_bytes(eng) + math.ceil(CONTEXT / B) * 4


def prompts(n: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 60, int(rng.integers(40, 90))).tolist() for _ in range(n)]


@pytest.fixture(scope="module")
def capped(tiny_gguf):
    """(a roomy engine, one whose kv_memory holds 40 blocks and the own buffers of 3
    sequences: half of it, as the engine keeps for max_seqs=64 when they would take more)."""
    roomy = load(tiny_gguf)
    block = roomy.kv_pool["groups"][0]["block_bytes"]
    one = own_bytes(roomy)
    kv_memory = 6 * one
    small = load(tiny_gguf, kv_memory=kv_memory)
    assert small.kv_pool["nbytes"] <= kv_memory - 3 * one and small.kv_pool["nbytes"] >= 10 * block
    return roomy, small


def test_the_cap_holds_every_kv_byte_and_calls_wait_for_room(capped):
    roomy, small = capped
    ps = prompts(12, seed=1)
    kw = dict(max_tokens=30, stop_ids=[], temperature=0.0)
    alone = [roomy.generate_ids(p, **kw) for p in ps]
    small.generate_ids(ps, **kw)  # once, so the steps' own scratch has reached its size
    dev = small.device
    before = dev.memory_use["live"]
    dev.reset_memory_peak()
    assert small.generate_ids(ps, **kw) == alone
    stats = small.last_stats
    pool = small.kv_pool
    room = pool["kv_memory"] - pool["nbytes"]
    # the device's count: what the calls added never passed the room beside the pool
    assert dev.memory_use["peak"] - before <= room
    assert dev.memory_use["live"] == before
    # at most 3 sequences' own buffers at once: the batch never grew past them
    assert stats["max_batch"] <= room // own_bytes(small) == 3 and stats["max_batch"] >= 2
    assert pool["peak_bytes"] <= pool["kv_memory"] and pool["used_bytes"] == pool["nbytes"]
    assert pool["sequence_bytes"] == 0


def test_a_lone_call_the_cap_cannot_hold_is_a_clear_error(capped):
    """Caches a caller keeps hold their rings; with the room gone and nothing running,
    a new call fails at once, by kv_memory's name, and its cache is untouched."""
    _, small = capped
    kept = [small.new_cache() for _ in range(3)]
    for c, p in zip(kept, prompts(3, seed=2)):
        small.generate_ids(p, cache=c, max_tokens=1, stop_ids=[])
        assert c.ring_nbytes == ring_bytes(small)
    pool = small.kv_pool
    assert pool["sequence_bytes"] == 3 * own_bytes(small)
    cache = small.new_cache()
    with pytest.raises(metalkv.ArgumentError, match=r"the engine's kv_memory \(\d+ bytes\) has \d+ free and this "
                                                    r"call's own buffers \(residual ring, block tables\) need \d+"):
        small.generate_ids(prompts(1, seed=3)[0], cache=cache, max_tokens=4, stop_ids=[])
    assert cache.ring_nbytes == 0 and len(cache.tokens) == 0
    del kept, c
    assert small.generate_ids(prompts(1, seed=3)[0], cache=cache, max_tokens=4, stop_ids=[])  # room again
    cache.reset()
    assert small.kv_pool["sequence_bytes"] == 0


def test_a_cache_waiting_in_the_queue_holds_no_buffer(capped):
    """Over a shared pool a new or emptied cache holds nothing of its own: its ring and
    mirrors are made by its first store (and charged), given back by reset()."""
    _, small = capped
    c = small.new_cache()
    assert c.nbytes == 0 and c.ring_nbytes == 0
    small.generate_ids([5, 6, 7], cache=c, max_tokens=2, stop_ids=[])
    assert c.ring_nbytes == ring_bytes(small) and small.kv_pool["sequence_bytes"] == own_bytes(small)
    c.reset()
    assert c.nbytes == 0 and small.kv_pool["sequence_bytes"] == 0


def test_memory_reports_the_device_the_pool_and_the_tiers(capped, tmp_path):
    _, small = capped
    m = small.memory()
    pool = small.kv_pool
    blocks = sum(g["blocks"] * g["block_bytes"] for g in pool["groups"])
    assert m["kv"]["pool"]["bytes"] == blocks == pool["nbytes"]
    assert m["kv"]["pool"]["used"] + m["kv"]["pool"]["free"] == blocks
    assert m["kv"]["used"] == pool["nbytes"] and m["kv"]["kv_memory"] == pool["kv_memory"]
    assert m["weights"] == small.weights_nbytes
    assert m["device"]["live"] >= m["weights"] + m["kv"]["used"]
    assert "tiers" not in m
    plain = metalkv.Engine.load(small.model_path, device=TEST_DEVICE, context=CONTEXT, progress=False)
    from metalkv.prefix_store import PrefixStore

    store = PrefixStore(plain, tmp_path, host_bytes="1MB")
    ids = prompts(1, seed=4)[0]
    plain.generate_ids(ids, max_tokens=1)
    store.save(ids)
    tiers = plain.memory()["tiers"]
    assert tiers["host"]["blocks"] == tiers["disk"]["blocks"] == len(ids) // B
    assert tiers["host"]["bytes"] > tiers["host"]["blocks"] * plain._core.prefix_record_bytes()
