"""The prefix store (metalkv.prefix_store): prefix blocks kept in host memory and on
disk beyond the device pool. A prompt's blocks saved by one engine and taken back by
another (a restart) give the reply computing them gives, bit for bit, and its prompt
comes from the cache; the host tier serves blocks the device pool evicted; a damaged
entry is refused and dropped; caches of another model or KV format never read them;
the directory stays under its size."""
from __future__ import annotations

import numpy as np
import pytest

import metalkv
from metalkv import prefix_store
from metalkv.prefix_store import PrefixStore

from .conftest import TEST_DEVICE

TEXT = open(__file__.rsplit("/tests/", 1)[0] + "/README.md").read()[:1300]  # a 419-token prompt: 13 blocks


def load(path, context=1024, **kw):
    return metalkv.Engine.load(path, device=TEST_DEVICE, context=context, progress=False, **kw)


@pytest.fixture(scope="module")
def prompt(default_gguf):
    e = load(default_gguf)
    return e.chat_ids([{"role": "system", "content": TEXT}, {"role": "user", "content": "What is this about?"}])


@pytest.fixture(scope="module")
def first(default_gguf, prompt):
    """(an engine whose prefix cache holds the prompt, its greedy 8-token reply): the
    tests that save the prompt's blocks share its prefill (each is ~4 s on the host)."""
    e = load(default_gguf)
    return e, e.generate_ids(prompt, max_tokens=8)


@pytest.mark.parametrize("kv", [{}, {"kv_k": "q8", "kv_v": "q8"}, {"kv_k": "q4", "kv_v": "q4"}],
                         ids=["f16", "q8", "q4-window"])  # (q4: the 128-token residual window, its rows stored too)
def test_a_restart_takes_the_prompt_from_disk_and_replies_the_same(default_gguf, prompt, tmp_path, kv):
    first = load(default_gguf, **kv)
    want = first.generate_ids(prompt, max_tokens=12)
    store = PrefixStore(first, tmp_path)
    saved = store.save(prompt)
    assert saved == (len(prompt) - 2) // 32 and store.save(prompt) == 0  # once
    assert len(list(store.dir.glob("*.blk"))) == saved
    again = load(default_gguf, **kv)  # a new process would see the same directory
    store2 = PrefixStore(again, tmp_path)
    assert store2.dir == store.dir
    assert store2.warm(prompt) == saved * 32
    assert store2.stats["loaded_disk"] == saved * 32
    assert again.generate_ids(prompt, max_tokens=12) == want
    assert again.last_stats["prompt_tokens_cached"] == saved * 32


def test_the_host_tier_serves_blocks_the_pool_evicted(default_gguf, prompt):
    small = load(default_gguf, context=512, kv_memory=512 * 23040)  # 16 blocks: one sequence of the context
    want = small.generate_ids(prompt, max_tokens=8)
    store = PrefixStore(small)  # no directory: host memory only
    assert store.save(prompt) > 0
    rng = np.random.default_rng(0)
    for _ in range(2):  # other prompts take the pool's blocks: the prompt's cached ones are evicted
        small.generate_ids(rng.integers(100, 40000, 260).tolist(), max_tokens=1)
    assert small._core.cached_prefix(prompt) == 0
    assert store.warm(prompt) > 0 and store.stats["loaded_host"] > 0
    assert small.generate_ids(prompt, max_tokens=8) == want
    assert small.last_stats["prompt_tokens_cached"] > 0


@pytest.mark.parametrize("run", [8, 64], ids=["in-runs", "at-once"])
def test_a_warm_the_pool_cannot_hold_stops_where_it_is_full(default_gguf, prompt, first, tmp_path, monkeypatch,
                                                           run):
    """warm() puts blocks into the pool in runs as they are read (IMPORT_BLOCKS): where
    the pool runs out, the chain's first blocks stay, none evicted by its later ones."""
    monkeypatch.setattr(prefix_store, "IMPORT_BLOCKS", run)
    first, want = first
    assert PrefixStore(first, tmp_path).save(prompt) == (len(prompt) - 2) // 32
    small = load(default_gguf, context=512, kv_memory=512 * 23040)  # 16 blocks
    hold = small.new_cache()  # a kept conversation holds 5 of them
    small.generate_ids(np.random.default_rng(1).integers(100, 40000, 130).tolist(), cache=hold, max_tokens=1,
                       stop_ids=[])
    free = small.kv_pool["groups"][0]["free_blocks"]
    assert 0 < free < (len(prompt) - 2) // 32
    store = PrefixStore(small, tmp_path)
    assert store.warm(prompt) == free * 32
    assert store.stats["warm_short"] == 1 and store.stats["loaded_disk"] == free * 32
    hold.reset()
    assert small.generate_ids(prompt, max_tokens=8) == want
    assert small.last_stats["prompt_tokens_cached"] == free * 32


def test_a_damaged_entry_is_refused_and_dropped(default_gguf, prompt, first, tmp_path):
    e, want = first
    PrefixStore(e, tmp_path).save(prompt)
    fresh = load(default_gguf)
    store = PrefixStore(fresh, tmp_path, host_bytes=0)
    files = sorted(store.dir.glob("*.blk"))
    victim = files[3]
    blob = bytearray(victim.read_bytes())
    blob[-100] ^= 0xFF  # one flipped byte in the data
    victim.write_bytes(bytes(blob))
    warmed = store.warm(prompt)
    assert warmed < len(files) * 32 and store.stats["corrupt"] == 1 and not victim.exists()
    assert fresh.generate_ids(prompt, max_tokens=8) == want


def test_other_formats_and_models_keep_apart(default_gguf, tiny_gguf, prompt, first, tmp_path):
    f16 = PrefixStore(first[0], tmp_path)  # its prefix cache holds the prompt
    q8 = PrefixStore(load(default_gguf, kv_k="q8"), tmp_path)
    tiny = PrefixStore(metalkv.Engine.load(tiny_gguf, device=TEST_DEVICE, context=64, progress=False), tmp_path)
    assert len({f16.dir, q8.dir, tiny.dir}) == 3
    assert f16.save(prompt) > 0
    assert q8.warm(prompt) == 0 and q8.stats["loaded_disk"] == 0


def test_the_directory_stays_under_its_size(prompt, first, tmp_path):
    e = first[0]  # its prefix cache holds the prompt
    block = PrefixStore(e, tmp_path / "probe")
    block.save(prompt)
    one = max(p.stat().st_size for p in block.dir.glob("*.blk"))
    store = PrefixStore(e, tmp_path, disk_bytes=10 * one, host_bytes=0)
    store.save(prompt)
    assert sum(p.stat().st_size for p in store.dir.glob("*.blk")) <= 10 * one
    assert store.stats["evicted_disk"] > 0
    assert store.warm(prompt) >= 0  # the first blocks went first: what is left is not a prefix of the prompt


def test_what_it_refuses(default_gguf, tiny_sliding_dir, tmp_path):
    with pytest.raises(metalkv.ArgumentError, match=r"no shared KV pool"):
        PrefixStore(load(default_gguf, kv_memory=None), tmp_path)
    sliding = metalkv.Engine.load(tiny_sliding_dir, device=TEST_DEVICE, context=64, progress=False)
    with pytest.raises(metalkv.ArgumentError, match=r"sliding-window layers"):
        PrefixStore(sliding, tmp_path)
    with pytest.raises(metalkv.ArgumentError, match=r"disk_bytes='lots'"):
        PrefixStore(load(default_gguf), tmp_path, disk_bytes="lots")
