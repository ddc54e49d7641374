"""The prefix cache (cpp/kv/prefix_cache.h, docs/KV_CACHE.md "Prefix cache"): a
new call whose prompt starts like an earlier one takes that prefix's blocks
from the shared pool instead of computing them, and gets exactly what it gets
without the cache: the reference is an engine with no shared pool (each cache
its own, nothing cached), compared bit for bit on the logits every id was
sampled from."""
from __future__ import annotations

import numpy as np
import pytest

import metalkv
from devices import TEST_DEVICE  # tests/ is on sys.path

B = 32  # metalkv._core.BLOCK_TOKENS, restated


def load(path, **kw):
    kw = {"context": 256, "prefill_chunk": 16, **kw}
    return metalkv.Engine.load(path, device=TEST_DEVICE, progress=False, **kw)


@pytest.fixture(scope="module", params=["tiny", "sliding"])
def pair(request, tiny_gguf, tiny_sliding_dir):
    """(an engine with the default shared pool, the same model with none)."""
    path = tiny_gguf if request.param == "tiny" else tiny_sliding_dir
    return load(path), load(path, kv_memory=None)


def run(engine, ids, **kw):
    """(ids, logits each id was sampled from, stats) of one greedy call in a fresh cache."""
    opts = dict(max_tokens=12, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0, seed=0,
                stop_ids=[])
    opts.update(kw)
    r = engine._core.submit(engine.new_cache(), np.asarray(ids, np.int64), keep_logits=True, ephemeral=True, **opts)
    return r.result(), r.logits(), r.stats


def cached_tokens(n_prompt: int) -> int:
    """Whole blocks of the prompt, leaving at least two tokens to compute."""
    return (n_prompt - 2) // B * B


def test_a_repeated_prompt_takes_its_prefix_from_the_cache(pair):
    engine, plain = pair
    ids = np.random.default_rng(0).integers(1, 64, 100).tolist()
    first = run(engine, ids)
    again = run(engine, ids)
    assert first[2]["prompt_tokens_cached"] == 0 and again[2]["prompt_tokens_cached"] == cached_tokens(100) == 96
    ref = run(plain, ids)
    for got in (first, again):
        assert got[0] == ref[0]
        np.testing.assert_array_equal(got[1], ref[1])


def test_different_continuations_of_one_prefix(pair):
    """A shared system prompt: later calls take it from the cache, each call's own
    ending is computed; sampled calls too (same seed, same draws)."""
    engine, plain = pair
    rng = np.random.default_rng(1)
    system = rng.integers(1, 64, 70).tolist()
    kw = dict(temperature=0.9, top_k=30, seed=8)
    for i in range(4):
        ids = system + rng.integers(1, 64, int(rng.integers(3, 30))).tolist()
        got, ref = run(engine, ids, **kw), run(plain, ids, **kw)
        assert got[2]["prompt_tokens_cached"] == (0 if i == 0 else 64)
        assert got[0] == ref[0]
        np.testing.assert_array_equal(got[1], ref[1])


def test_generated_tokens_are_not_taken_from_the_cache(tiny_gguf):
    """A reply was computed by one-token steps (other kernels, other bits than a
    prefill of the same tokens): a prompt that repeats it gets only the blocks of
    the earlier prompt, so it still matches the call without the cache."""
    engine, plain = load(tiny_gguf), load(tiny_gguf, kv_memory=None)
    prompt = np.random.default_rng(2).integers(1, 64, 40).tolist()
    reply, _, _ = run(engine, prompt, max_tokens=60)
    ids = prompt + reply + [3, 4, 5]
    got, ref = run(engine, ids), run(plain, ids)
    assert got[2]["prompt_tokens_cached"] == 32  # the first prompt's one whole block
    np.testing.assert_array_equal(got[1], ref[1])


def test_concurrent_calls_share_the_prefix_blocks(tiny_gguf):
    engine = load(tiny_gguf)
    system = np.random.default_rng(3).integers(1, 64, 96).tolist()
    run(engine, system + [1, 2, 3])  # publishes 3 blocks
    caches = [engine.new_cache() for _ in range(3)]
    for i, c in enumerate(caches):
        engine.generate_ids(system + [10 + i, 20 + i, 30 + i], cache=c, max_tokens=4, stop_ids=())
        assert engine.last_stats["prompt_tokens_cached"] == 96
    pool = engine.kv_pool["groups"][0]
    used = pool["blocks"] - pool["free_blocks"]
    held = sum(c.held_nbytes for c in caches) // pool["block_bytes"]
    assert held == 3 * 4 and used == 3 + 3  # the 3 prefix blocks once, each cache's own tail block


def test_the_least_recently_used_prefix_is_evicted_first(tiny_gguf):
    probe = load(tiny_gguf, kv_memory=None)
    block = 2 * B * probe.config.n_kv_heads * probe.config.head_dim * 2 * probe.config.n_layers
    engine = load(tiny_gguf, kv_memory=12 * block, context=128)  # 12 blocks
    rng = np.random.default_rng(4)
    a, b = (rng.integers(1, 64, 66).tolist() for _ in range(2))  # 2 whole blocks each (64 of 66)
    for ids in (a, b):
        run(engine, ids, max_tokens=2)
    assert engine.kv_pool["groups"][0]["cached_blocks"] == 4
    assert run(engine, a, max_tokens=2)[2]["prompt_tokens_cached"] == 64  # a used again: b is now the oldest
    # each filler takes 4 blocks and publishes 3: the third finds 2 free blocks and evicts 2
    filler = [rng.integers(1, 64, 100).tolist() for _ in range(3)]
    for ids in filler:
        run(engine, ids, max_tokens=2)
    pool = engine.kv_pool["groups"][0]
    assert pool["cached_blocks"] <= pool["blocks"] and pool["free_blocks"] == pool["blocks"]
    assert run(engine, b, max_tokens=2)[2]["prompt_tokens_cached"] == 0   # evicted, oldest first
    # b's run needed 3 blocks, found 1 free and evicted the next oldest: a's two
    assert run(engine, filler[2], max_tokens=2)[2]["prompt_tokens_cached"] == 96  # the newest is still there
    assert run(engine, a, max_tokens=2)[2]["prompt_tokens_cached"] == 0
    np.testing.assert_array_equal(run(engine, b, max_tokens=4)[1], run(probe, b, max_tokens=4)[1])


def test_the_prefix_cache_can_be_turned_off_per_call(tiny_gguf):
    engine = load(tiny_gguf)
    ids = np.random.default_rng(5).integers(1, 64, 80).tolist()
    run(engine, ids)
    assert run(engine, ids, prefix_cache=False)[2]["prompt_tokens_cached"] == 0
    assert run(engine, ids)[2]["prompt_tokens_cached"] == 64


def test_chat_turns_sent_again_take_the_system_prompt_and_earlier_turns_from_the_cache(engine):
    """A stateless client (a server request) sends the whole conversation every turn:
    the system prompt and the earlier user turn come from the cache, and the reply is
    what the same turn gets in a cache of its own (kv_memory=None)."""
    system = "You are a careful assistant. " * 12
    first = engine.generate("Say one word.", system=system, max_tokens=4)
    first_prompt = engine.last_stats["prompt_tokens"]  # its whole blocks were computed by prefill: published
    assert first_prompt >= 64
    conversation = engine.new_cache()
    conversation.messages = [{"role": "system", "content": system}, {"role": "user", "content": "Say one word."},
                             {"role": "assistant", "content": first}]
    second = engine.generate("And another.", cache=conversation, max_tokens=4)
    assert engine.last_stats["prompt_tokens_cached"] == first_prompt // B * B
    plain = metalkv.Engine.load(engine._loaded.path, device=TEST_DEVICE, context=512, kv_memory=None, progress=False)
    alone = plain.new_cache()
    alone.messages = list(conversation.messages[:3])
    assert plain.generate("And another.", cache=alone, max_tokens=4) == second
