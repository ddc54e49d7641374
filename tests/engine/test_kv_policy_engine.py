"""Eviction policies through the whole engine (issue 15). The reference is
tests/engine/reference.py's float64 forward with each query seeing only the
positions the policy keeps (kv/kv_policy_ref.py steps the same budget through
the same chunks), and its attention probabilities for the scores h2o and
snapkv add up in the attention kernels."""
from __future__ import annotations

import numpy as np
import pytest

import metalkv
from metalkv import _core
from devices import TEST_DEVICE  # tests/ is on sys.path
from kv import kv_policy_ref as pref
from metalkv.models import load_model
from models.tiny import write_gguf

from .conftest import TINY
from .reference import llama_logits
from .test_cache_state import generate_core, held, submit

IDS = [int(i) for i in np.random.default_rng(3).integers(0, 64, 150)]
CHUNK = 8


def load(path, **kw):
    kw = {"context": 96, "prefill_chunk": CHUNK, "kv_memory": None, **kw}
    return metalkv.Engine.load(path, device=TEST_DEVICE, progress=False, **kw)


def visible_by_chunks(n: int, policy: dict, budget: int) -> np.ndarray:
    """(n, n) bool for streaming: query p sees the positions held once its chunk was stored."""
    st = pref.HeadState(policy, budget)
    vis = np.zeros((n, n), bool)
    for a in range(0, n, CHUNK):
        st.store(min(CHUNK, n - a))
        vis[a:a + CHUNK, st.held] = True
    return vis


@pytest.fixture(scope="module")
def soft_gguf(tmp_path_factory):
    """The tiny model with its Q and K weights drawn 8 times smaller: scores of
    about unit size, a softmax that spreads over keys. The plain tiny model's
    scores are about a hundred: most rows put all their weight on one key, and
    a row where two keys nearly tie (position 137 of IDS under streaming) moves
    8 % of the logit range for a 1e-6 change in the weights, more than any
    float32 device can promise (the cuda device's TF32 products missed by 3 %
    there). Here that change moves no row more than 3e-4."""
    f = tmp_path_factory.mktemp("soft_gguf") / "soft.gguf"
    write_gguf(f, gains={"attn_q.weight": 0.125, "attn_k.weight": 0.125}, **TINY)
    return f


def test_streaming_logits_match_the_reference(soft_gguf):
    """150 tokens through a budget of 64 in chunks of 8: every query sees the 4
    sinks and the latest tokens the budget holds, at their true positions."""
    m = load_model(soft_gguf, progress=False)
    policy = {"policy": "streaming", "sinks": 4}
    eng = load(soft_gguf, kv_policy="streaming", kv_budget=64)
    cache = eng.new_cache()
    got = eng.logits(IDS, cache=cache)
    assert cache.count(0) <= 64 and cache.evicted == len(IDS) - cache.count(0)
    vis = visible_by_chunks(len(IDS), policy, 64)
    ref = llama_logits(m, IDS, visible=lambda layer, g: vis)
    whole = llama_logits(m, IDS)  # the full cache: what eviction changes
    scale = np.abs(ref).max()
    err, off = np.abs(got - ref).max() / scale, np.abs(got - whole).max() / scale
    assert err < 4e-3, err
    assert off > 4 * err, (off, err)


@pytest.mark.parametrize("name,window,prompt", [("h2o", 32, None), ("snapkv", 32, "stream"), ("snapkv", 8, "stream"),
                                                ("snapkv", 32, "whole"), ("snapkv", 8, "whole")])
def test_attention_scores_are_the_reference_probabilities(tiny_gguf, name, window, prompt):
    """Before any eviction each key's score is the attention it received, summed
    over the query heads of its KV head and the queries that count: every
    query (h2o) or those in an observation window (snapkv): streamed, the last
    `window` indices before the budget; held whole, each call's prompt's last
    `window` (every call here is one: 110 tokens, then 14 of one token).
    Prefill and one-token queries both add."""
    m = load_model(tiny_gguf, progress=False)
    budget = 128
    observes = _core.KV_POLICY_TRAITS[name]["observes"]  # (kv_window is refused where it does nothing)
    eng = load(tiny_gguf, kv_policy=name, kv_budget=budget, kv_window=window if observes else None, context=160,
               kv_prompt=prompt)
    cache = eng.new_cache()
    eng.logits(IDS[:110], cache=cache)
    for t in IDS[110:124]:  # 14 decode steps
        eng.logits([t], cache=cache)
    n = 124
    assert cache.evicted == 0 and cache.count(0) == n
    probs = {}
    llama_logits(m, IDS[:n], probs=probs)
    first = 0 if name == "h2o" else budget - window if prompt == "stream" else 110 - window
    for layer in range(m.config.n_layers):
        want = sum(probs[layer, hq][first:].sum(0) for hq in range(m.config.n_heads))  # 1 KV head
        # (the engine's float32 over f16 rows against float64: a sharp softmax moves a few
        # probabilities by up to ~1 %; a wrong row or head set moves them by far more)
        np.testing.assert_allclose(cache.scores(layer)[0, :n], want, rtol=1e-2, atol=2e-3)
        other = sum(probs[layer, hq][budget - window if name == "h2o" else 0:].sum(0) for hq in range(2))
        assert np.abs(other - want).max() > 0.1


@pytest.mark.parametrize("name", ["snapkv", "pyramidkv"])
@pytest.mark.parametrize("kv_memory", [None, "auto"])
def test_a_prompt_held_whole_is_compressed_by_its_last_queries(tiny_gguf, name, kv_memory):
    """SnapKV as published: a 150-token prompt into a budget of 96 is held
    whole (nothing evicted while it is read, the cache's capacity its context);
    the first decode step compresses each layer to its budget (pyramidkv: the
    first layer's more, the last's less) by the rule's pick from the attention
    of the prompt's last 8 queries, and its logits are the reference's with
    each query seeing what was kept then. The blocks past the budget go back."""
    m = load_model(tiny_gguf, progress=False)
    window, n, budget = 8, 140, 96
    policy = {"policy": name, "sinks": 4, "window": window, "budget": budget}
    eng = load(tiny_gguf, kv_policy=name, kv_budget=budget, kv_window=window, context=200, kv_memory=kv_memory)
    cache = eng.new_cache()
    assert cache.capacity == 200 and cache.budget == budget and cache.policy_options["prompt"] == "whole"
    budgets = pref.layer_budgets(policy, [0] * m.config.n_layers)
    assert [cache.layer_budget(l) for l in range(m.config.n_layers)] == budgets
    assert (budgets[0] > budgets[-1]) == (name == "pyramidkv")
    eng.logits(IDS[:n], cache=cache)
    assert cache.evicted == 0 and cache.count(0) == n
    probs = {}
    llama_logits(m, IDS[:n], probs=probs)
    kept = {}
    for layer in range(m.config.n_layers):
        want = sum(probs[layer, hq][n - window:].sum(0) for hq in range(m.config.n_heads))
        np.testing.assert_allclose(cache.scores(layer)[0, :n], want, rtol=1e-2, atol=2e-3)
        scores = cache.scores(layer)[0, :n].copy()  # (the engine's own: near ties pick as it does)
        kept[layer] = sorted(pref.select_kept(policy, np.arange(n), scores,
                                              pref.keep_after_eviction(budgets[layer], 1)))
    held_prompt = cache.held_nbytes
    got = eng.logits(IDS[n:n + 1], cache=cache)
    for layer in range(m.config.n_layers):
        assert sorted(cache.kept_positions(layer)) == kept[layer] + [n]
        assert cache.count(layer) == len(kept[layer]) + 1
    assert cache.held_nbytes < held_prompt / 1.4  # the prompt's blocks past the budget went back
    vis = np.ones((n + 1, n + 1), bool)
    ref = llama_logits(m, IDS[:n + 1], visible=lambda layer, g: np.vstack(
        [vis[:n], np.isin(np.arange(n + 1), kept[layer] + [n])[None]]))
    np.testing.assert_allclose(got[-1], ref[-1], atol=4e-3 * np.abs(ref).max())
    assert np.abs(got[-1] - llama_logits(m, IDS[:n + 1])[-1]).max() > 1e-2 * np.abs(ref).max()


@pytest.mark.parametrize("name", ["h2o", "snapkv", "keynorm"])
def test_an_eviction_keeps_what_the_rule_picks_from_the_scores(tiny_gguf, name):
    """A cache at its budget of 64 takes one more token: per layer the kept
    positions are the rule's pick (kv_policy_ref.py) from the scores as they
    stood, and the new token; the count falls to a block boundary plus it.
    (Prompts streamed: held whole, the one-token prompt would be held too and
    the next call's compress; the test above has that.)"""
    eng = load(tiny_gguf, kv_policy=name, kv_budget=64, kv_sinks=2, kv_prompt="stream")
    cache = eng.new_cache()
    eng.logits(IDS[:64], cache=cache)
    policy = {"policy": name, "sinks": 2}
    before = [(np.array(cache.kept_positions(l)), cache.scores(l)[0, :64].copy()) for l in range(cache.n_layers)]
    eng.logits(IDS[64:65], cache=cache)
    keep = pref.keep_after_eviction(64, 1)
    for l, (pos, s) in enumerate(before):
        want = sorted(pos[pref.select_kept(policy, pos, s, keep)].tolist() + [64])
        assert sorted(cache.kept_positions(l)) == want
        assert cache.count(l) == keep + 1


@pytest.mark.parametrize("name", ["streaming", "h2o"])
@pytest.mark.parametrize("kv_memory", [None, "auto"])
def test_generation_never_stops_and_memory_stays_at_the_budget(tiny_gguf, name, kv_memory):
    """300 tokens through a budget of 64 (a context of 96): no context_full, the
    held blocks never pass the budget's; without a policy the same call stops."""
    eng = load(tiny_gguf, kv_policy=name, kv_budget=64, kv_memory=kv_memory)
    cache = eng.new_cache()
    ids = eng.generate_ids(IDS[:20], max_tokens=300, cache=cache, temperature=0.0)
    assert len(ids) == 300 and eng.last_stats["finish_reason"] == "length"
    assert cache.length(0) == 319 and cache.count(0) <= 64  # (the last id is not fed)
    assert cache.held_nbytes <= 2 * 2 * (64 // 32) * 32 * 64 * 2  # layers x K,V x budget's rows x head_dim x f16
    plain = load(tiny_gguf, kv_memory=kv_memory)
    plain.generate_ids(IDS[:20], max_tokens=300, temperature=0.0)
    assert plain.last_stats["finish_reason"] == "context_full"


@pytest.mark.parametrize("name", ["streaming", "h2o"])
def test_a_shared_pool_evicts_as_a_cache_of_its_own(tiny_gguf, name):
    """A conversation of two calls over the engine's shared pool (where a
    call's checkpoint holds the block the cache ended in, and blocks an
    eviction lets go need not come back with the same id) generates what the
    same calls give over a pool of the cache's own. (The prompt held whole
    above is the case where the ids did differ: its auto-pool run failed
    before the moves read through move_table.)"""
    outs = []
    for kv_memory in ("auto", None):
        eng = load(tiny_gguf, kv_policy=name, kv_budget=64, kv_memory=kv_memory)
        cache = eng.new_cache()
        first = eng.generate_ids(IDS[:40], max_tokens=10, cache=cache, temperature=0.0)  # holds 49
        outs.append(first + eng.generate_ids(IDS[40:60], max_tokens=100, cache=cache, temperature=0.0))
    assert outs[0] == outs[1]


def by_index(cache) -> dict:
    """Everything a policy cache holds: per layer its count, kept positions,
    scores, and the K/V rows of every index."""
    out = {"tokens": list(cache.tokens), "evicted": cache.evicted}
    for l in range(cache.n_layers):
        table, n = cache.block_table(l), cache.count(l)
        slots = [table[i // 32] * 32 + i % 32 for i in range(n)]
        s = cache.scores(l)
        out[l] = (n, cache.length(l), cache.kept_positions(l), None if s is None else s[:, :n].copy(),
                  np.array(cache.keys(l))[slots], np.array(cache.values(l))[slots])
    return out


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(key, int):
            for x, y in zip(a[key], b[key]):
                np.testing.assert_array_equal(x, y) if isinstance(x, np.ndarray) else (x == y or pytest.fail(key))
        else:
            assert a[key] == b[key], key


@pytest.mark.parametrize("name", ["h2o", "streaming"])
@pytest.mark.parametrize("kv_memory", [None, "auto"])
def test_a_call_that_fails_after_evicting_leaves_the_cache_as_it_was(tiny_gguf, name, kv_memory):
    """An aborted call that evicted puts back the rows, positions, scores and
    count, bit for bit, and the cache goes on as one that never saw it."""
    eng = load(tiny_gguf, kv_policy=name, kv_budget=64, kv_memory=kv_memory)
    cache, clean = eng.new_cache(), eng.new_cache()
    first = generate_core(eng, cache, IDS[:50], max_tokens=20)
    assert cache.evicted > 0
    assert generate_core(eng, clean, IDS[:50], max_tokens=20) == first
    before = by_index(cache)
    r = held(submit(eng, cache, IDS[50:70], hold_at_step=6, max_tokens=40))  # past 2 evictions
    r.abort()
    r.result()
    assert r.finish_reason == "aborted"
    assert_same(by_index(cache), before)
    assert generate_core(eng, cache, IDS[70:80], max_tokens=30) == generate_core(eng, clean, IDS[70:80], max_tokens=30)


def test_a_batch_gives_each_sequence_what_it_gets_alone(tiny_gguf):
    eng = load(tiny_gguf, kv_policy="h2o", kv_budget=64, kv_memory="auto")
    rng = np.random.default_rng(1)
    ps = [rng.integers(0, 64, int(rng.integers(10, 80))).tolist() for _ in range(5)]
    together = eng.generate_ids(ps, max_tokens=60, temperature=0.0)
    assert eng.last_stats["max_batch"] > 1
    assert together == [eng.generate_ids(p, max_tokens=60, temperature=0.0) for p in ps]


def test_policy_arguments_are_checked(tiny_gguf):
    with pytest.raises(metalkv.ArgumentError, match="kv_policy='lru'"):
        load(tiny_gguf, kv_policy="lru")
    with pytest.raises(metalkv.ArgumentError, match="kv_budget=1.5"):
        load(tiny_gguf, kv_policy="h2o", kv_budget=1.5)
    with pytest.raises(metalkv.ArgumentError, match="kv_prompt='all': expected None, 'whole' or 'stream'"):
        load(tiny_gguf, kv_policy="snapkv", kv_prompt="all")
    with pytest.raises(metalkv.ArgumentError, match="kv_budget=20: expected at least"):
        load(tiny_gguf, kv_policy="h2o", kv_budget=20).new_cache()
    eng = load(tiny_gguf, kv_policy="streaming", kv_budget=0.5)  # half the context of 96
    c = eng.new_cache()
    assert c.policy == "streaming" and c.budget == 48 and c.slots(0) == 64  # 48 in whole blocks
    own = eng.new_cache(kv_policy="snapkv", kv_budget=64)
    assert own.policy == "snapkv"


def test_pyramidkv_caches_own_their_pools(tiny_gguf):
    """pyramidkv keeps a group of blocks per layer: its caches never take the
    engine's shared pool (whose full layers share one table), so an engine
    made for it makes none by default, and one given kv_memory still serves
    other policies' caches from it."""
    eng = load(tiny_gguf, kv_policy="pyramidkv", kv_budget=96, kv_memory="auto")
    assert eng.kv_pool is None
    shared = load(tiny_gguf, kv_policy="pyramidkv", kv_budget=96, kv_memory="4MB")
    own, other = shared.new_cache(), shared.new_cache(kv_policy="h2o", kv_budget=64)
    assert shared.kv_pool is not None and not own.shares_pool and other.shares_pool
    ids = shared.generate_ids(IDS[:30], max_tokens=100, cache=own, temperature=0.0)
    assert ids == eng.generate_ids(IDS[:30], max_tokens=100, cache=eng.new_cache(), temperature=0.0)
    assert own.count(0) > own.count(1)  # (budgets 123 and 69: the first layer keeps more)


@pytest.mark.parametrize("name,kv", [("h2o", "f16"), ("streaming", "q8"), ("snapkv", "f16")])
def test_a_saved_cache_comes_back_with_its_kept_tokens(tiny_gguf, tmp_path, name, kv):
    """A cache that evicted, saved and read back: the same count, positions,
    scores and rows per index, and it goes on exactly as the original."""
    eng = load(tiny_gguf, kv_policy=name, kv_budget=64, kv_k=kv, kv_v=kv)
    cache = eng.new_cache()
    generate_core(eng, cache, IDS[:70], max_tokens=25)
    assert cache.evicted > 0
    cache.save(tmp_path / "c.safetensors")
    back = eng.load_cache(tmp_path / "c.safetensors")
    assert back.policy == name and back.capacity == cache.capacity
    if kv == "f16":
        assert_same(by_index(back), by_index(cache))
    else:
        for l in range(cache.n_layers):
            assert back.count(l) == cache.count(l) and back.length(l) == cache.length(l)
            assert back.kept_positions(l) == cache.kept_positions(l)
            for kvs in (0, 1):
                for x, y in zip(back.read_rows(l, kvs, 0, back.count(l), by_index=True),
                                cache.read_rows(l, kvs, 0, cache.count(l), by_index=True)):
                    np.testing.assert_array_equal(x, y)
    assert generate_core(eng, back, IDS[80:90], max_tokens=30) == generate_core(eng, cache, IDS[80:90], max_tokens=30)


def test_an_unevicting_cache_loads_into_an_engine_with_a_policy(tiny_gguf, tmp_path):
    """A file saved without a policy comes back without one, whatever the engine's."""
    plain = load(tiny_gguf)
    cache = plain.new_cache()
    generate_core(plain, cache, IDS[:30], max_tokens=5)
    cache.save(tmp_path / "plain.safetensors")
    back = load(tiny_gguf, kv_policy="h2o", kv_budget=64).load_cache(tmp_path / "plain.safetensors")
    assert back.policy == "none" and back.length(0) == cache.length(0)

