"""Eviction policies in metalkv.KVCache (issue 15): the selection rule against
the numpy reference (kv_policy_ref.py), and a cache that evicts by it: what
each head keeps, the rows at the kept positions (moved, never recomputed), the
budget held, the scores the store writes (keynorm) and the errors."""
from __future__ import annotations

import numpy as np
import pytest

import metalkv
from metalkv._core import BLOCK_TOKENS as B
from metalkv._core import ops

from . import kv_policy_ref as ref
from .kvcache_ref import rows

POLICIES = ["streaming", "keynorm", "h2o", "snapkv"]


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("sinks,recent", [(4, -1), (0, -1), (2, 5), (7, 0)])
def test_the_rule_matches_the_reference(name, sinks, recent):
    """Random positions in index order (a compacted cache's), random scores with
    ties, every budget: the C++ rule keeps exactly the reference's indices."""
    rng = np.random.default_rng(sinks * 10 + recent + 3)
    policy = {"policy": name, "sinks": sinks, "recent": recent, "window": 6, "pool": 5}
    for n in (1, 9, 40, 97):
        pos = rng.permutation(np.arange(n) * 3 // 2).astype(np.uint32)  # gaps: some evicted before
        scores = rng.integers(0, 6, n).astype(np.float32)  # ties on purpose
        for n_keep in sorted({0, 1, n // 3, n // 2, n - 1, n}):
            s = None if name == "streaming" else scores
            got = ops.select_kept(policy, pos, s, n_keep)
            assert got == ref.select_kept(policy, pos, s, n_keep), (n, n_keep)
            assert len(got) == n_keep


def test_a_scoring_rule_needs_scores():
    with pytest.raises(metalkv.GpuError, match="h2o selects by score"):
        ops.select_kept({"policy": "h2o"}, np.arange(9, dtype=np.uint32), None, 3)


def heads(cache, layer):
    """Per KV head, the kept positions and the f16 K and V rows at their indices."""
    table, n = cache.block_table(layer), cache.count(layer)
    slots = [table[i // B] * B + i % B for i in range(n)]
    k, v = cache.keys(layer)[slots], cache.values(layer)[slots]
    return [(np.array(cache.kept_positions(layer, h)), k[:, h], v[:, h]) for h in range(k.shape[1])]


@pytest.mark.parametrize("store", ["compute", "blit"])
@pytest.mark.parametrize("name", ["streaming", "keynorm"])
def test_a_cache_evicts_by_the_rule_and_keeps_the_rows(dev, store, name):
    """Two full layers and a sliding one take 400 tokens in random chunks under a
    budget of 100: after every step each head of each full layer holds exactly
    the reference's positions, each index the f16 rows of its position (moves
    kept them), at most the budget; the sliding layer is untouched by it."""
    rng = np.random.default_rng(11)
    n_kv, d, budget, chunk = 3, 8, 100, 9
    policy = {"policy": name, "sinks": 3}
    cache = metalkv.KVCache(dev, 3, n_kv, d, budget, windows=[0, 16, 0], max_chunk=chunk, store=store,
                            kv_policy=policy)
    assert [cache.evicts(l) for l in range(3)] == [True, False, True] and cache.wraps(0)
    k_all, v_all = rows(rng, 3, 0, n_kv, d), rows(rng, 3, 0, n_kv, d)
    states = [[ref.HeadState(policy, budget) for _ in range(n_kv)] for _ in range(3)]
    while cache.length(0) < 400:
        n = int(rng.integers(1, chunk + 1))
        k, v = rows(rng, 3, n, n_kv, d), rows(rng, 3, n, n_kv, d)
        k[:, :, :, 0] *= rng.uniform(0.1, 3, (3, n, n_kv))  # spread the norms
        k_all, v_all = np.concatenate([k_all, k], 1), np.concatenate([v_all, v], 1)
        for l in (0, 2):
            for h, st in enumerate(states[l]):
                st.store(n, lambda p, l=l, h=h: -np.linalg.norm(k_all[l, p, h].astype(np.float64), axis=-1))
        cache.append_all_layers(k, v)
        for l in (0, 2):
            assert cache.count(l) <= budget and cache.length(l) == k_all.shape[1]
            for h, (pos, kh, vh) in enumerate(heads(cache, l)):
                assert sorted(pos) == states[l][h].held, (l, h, cache.length(l))
                np.testing.assert_array_equal(kh, k_all[l, pos, h].astype(np.float16))
                np.testing.assert_array_equal(vh, v_all[l, pos, h].astype(np.float16))
            if name == "keynorm":  # the store's scores: -|k| of each kept index
                s = cache.scores(l)[:, :cache.count(l)]
                for h, (pos, _, _) in enumerate(heads(cache, l)):
                    np.testing.assert_allclose(s[h], -np.linalg.norm(k_all[l, pos, h], axis=-1), rtol=1e-5)
        assert cache.count(1) == cache.length(1)  # sliding: its own window, no policy
    assert cache.evicted == 400 - cache.count(0)
    assert len([b for b in cache.block_table(0) if b >= 0]) <= -(-budget // B)  # memory stays at the budget


def test_a_prompt_held_whole_is_compressed_after_it(dev):
    """kv_prompt='whole' (capacity 256, budget 64, keynorm): a prompt of 150
    tokens announced by open_prompt is stored whole in chunks; the next store
    compresses to the rule's pick among all 150 (not among what a streamed
    prompt would have left); a prompt of 300 is held up to capacity, evicts
    there and goes on; a prompt opened over the budget compresses first."""
    rng = np.random.default_rng(2)
    n_kv, d, budget, chunk = 2, 8, 64, 9
    policy = {"policy": "keynorm", "sinks": 2, "prompt": "whole"}
    cache = metalkv.KVCache(dev, 1, n_kv, d, 256, max_chunk=chunk, kv_policy=dict(policy, budget=budget))
    assert cache.budget == budget and cache.capacity == 256 and cache.policy_options["prompt"] == "whole"
    k_all = np.zeros((1, 0, n_kv, d), np.float32)

    def store(n):
        nonlocal k_all
        k = rows(rng, 1, n, n_kv, d)
        k[:, :, :, 0] *= rng.uniform(0.1, 3, (1, n, n_kv))
        k_all = np.concatenate([k_all, k], 1)
        cache.append_all_layers(k, k)

    def rule_pick(held_pos, n_keep):  # per head, the reference's positions kept of held_pos
        out = []
        for h in range(n_kv):
            pos = np.asarray(held_pos[h])
            s = -np.linalg.norm(k_all[0, pos, h].astype(np.float64), axis=-1)
            out.append(sorted(pos[ref.select_kept(policy, pos, s, n_keep)].tolist()))
        return out

    cache.open_prompt(150)
    for a in range(0, 150, chunk):
        store(min(chunk, 150 - a))
    assert cache.count(0) == 150 and cache.evicted == 0
    want = rule_pick([range(150)] * n_kv, ref.keep_after_eviction(budget, 1))
    store(1)  # a decode step: compresses
    assert [sorted(cache.kept_positions(0, h)) for h in range(n_kv)] == [w + [150] for w in want]
    held_blocks = len([b for b in cache.block_table(0) if b >= 0])
    assert held_blocks <= -(-budget // B)

    cache.open_prompt(300)  # longer than capacity: held up to 256 at a time
    counts = []
    for a in range(0, 300, chunk):
        store(min(chunk, 300 - a))
        counts.append(cache.count(0))
    assert max(counts) > 200 and max(counts) <= 256 and cache.length(0) == 451
    assert min(counts[counts.index(max(counts)):]) < budget  # evicted at capacity, went on

    before = [cache.kept_positions(0, h) for h in range(n_kv)]
    assert cache.count(0) > budget
    cache.open_prompt(5)  # over the budget: the first store of it compresses first
    want = rule_pick(before, ref.keep_after_eviction(budget, 5))
    store(5)
    assert [sorted(cache.kept_positions(0, h)) for h in range(n_kv)] == [w + list(range(451, 456)) for w in want]
    with pytest.raises(metalkv.ArgumentError, match="kv_budget=300: expected at most the capacity"):
        metalkv.KVCache(dev, 1, n_kv, d, 256, max_chunk=chunk, kv_policy=dict(policy, budget=300))


@pytest.mark.parametrize("budget,window", [(400, 32), (96, 8), (60, 8)])
def test_pyramidkv_gives_each_layer_its_budget_and_its_own_blocks(dev, budget, window):
    """pyramidkv over 5 full layers and a sliding one: each full layer's budget
    is the reference's split (falling, averaging the budget; below the fixed
    part all equal), its pool holds that budget's blocks (prompts streamed), and
    through 500 tokens each layer keeps at most its own budget, evicting when it
    reaches it, by the rule (no attention here: ties, the latest)."""
    windows = [0, 0, 16, 0, 0, 0]
    policy = {"policy": "pyramidkv", "budget": budget, "sinks": 4, "window": window, "prompt": "stream"}
    want = ref.layer_budgets(policy, windows)
    cap = max(want + [128])  # (a sliding layer wraps in a cache of more than its window's blocks)
    cache = metalkv.KVCache(dev, 6, 1, 8, cap, windows=windows, max_chunk=8, kv_policy=policy)
    assert [cache.layer_budget(l) for l in (0, 1, 3, 4, 5)] == [want[l] for l in (0, 1, 3, 4, 5)]
    full = [want[l] for l in (0, 1, 3, 4, 5)]
    if budget > 2 * window + 64:
        assert full == sorted(full, reverse=True) and full[0] > full[-1]
        assert abs(np.mean(full) - budget) <= 1
    else:
        assert full == [budget] * 5
    for l in (0, 1, 3, 4, 5):
        assert cache.slots(l) == -(-want[l] // B) * B  # its own blocks, its budget's
    rng = np.random.default_rng(4)
    states = {l: ref.HeadState(dict(policy, policy="streaming"), want[l]) for l in (0, 1, 3, 4, 5)}
    while cache.length(0) < 500:
        n = int(rng.integers(1, 9))
        k = rows(rng, 6, n, 1, 8)
        cache.append_all_layers(k, k)
        for l, st in states.items():
            st.store(n)  # (zero scores, ties to the latest: what streaming keeps, with snapkv's recent)
            assert cache.count(l) <= want[l] and cache.count(l) == len(st.held)
            assert sorted(cache.kept_positions(l)) == st.held
    assert cache.count(5) < cache.count(0) or budget <= 2 * window + 64


@pytest.mark.parametrize("kv", ["q8", "q4"])
def test_quantized_rows_move_with_their_parameters(dev, kv):
    """A quantized cache that evicts holds, per kept index, the very bytes the
    same row got when stored (the same tokens in an unevicting cache)."""
    rng = np.random.default_rng(5)
    n_kv, d, budget = 2, 64, 96
    policy = {"policy": "streaming", "sinks": 4}
    evicting = metalkv.KVCache(dev, 1, n_kv, d, budget, max_chunk=8, kv_k=[kv], kv_v=[kv], kv_policy=policy)
    whole = metalkv.KVCache(dev, 1, n_kv, d, 512, max_chunk=8, kv_k=[kv], kv_v=[kv])
    for _ in range(40):
        k, v = rows(rng, 1, 7, n_kv, d), rows(rng, 1, 7, n_kv, d)
        evicting.append_all_layers(k, v)
        whole.append_all_layers(k, v)
    assert evicting.evicted > 0
    table = evicting.block_table(0)
    data_bytes = {"q8": d, "q4": d // 2}[kv]  # one head's codes and scales (docs/KV_QUANT.md)
    param_bytes = 2 * d // {"q8": 64, "q4": 32}[kv]
    for kvs in (0, 1):
        data, params = whole.read_rows(0, kvs, 0, whole.length(0))
        blocks = evicting.section_bytes(0, kvs)
        for h in range(n_kv):
            for i, p in enumerate(evicting.kept_positions(0, h)):
                block, j = blocks[table[i // B]], i % B
                got_d = block[(j * n_kv + h) * data_bytes:][:data_bytes]
                got_p = block[B * n_kv * data_bytes + j * params.shape[1] + h * param_bytes:][:param_bytes]
                np.testing.assert_array_equal(got_d, data[p, h * data_bytes:(h + 1) * data_bytes])
                np.testing.assert_array_equal(got_p, params[p, h * param_bytes:(h + 1) * param_bytes])


def test_policy_arguments_and_limits_are_clear_errors(host):
    one = np.ones((1, 1, 1, 32), np.float32)
    with pytest.raises(metalkv.ArgumentError, match="kv_policy='lru': expected None or one of streaming"):
        metalkv.KVCache(host, 1, 1, 32, 128, kv_policy={"policy": "lru"})
    with pytest.raises(metalkv.ArgumentError, match=r"kv_budget=40: expected at least kv_sinks \+ the store.s most tokens"):
        metalkv.KVCache(host, 1, 1, 32, 40, max_chunk=8, kv_policy={"policy": "streaming"})
    with pytest.raises(metalkv.ArgumentError, match="kv_residual=32: expected 0 with kv_policy='h2o'"):
        metalkv.KVCache(host, 1, 1, 64, 128, kv_k=["q4"], kv_residual=32, kv_policy={"policy": "h2o"})
    with pytest.raises(metalkv.ArgumentError, match="single tokens cannot be evicted"):
        metalkv.KVCache(host, 1, 1, 64, 128, kv_k=["q2"], kv_v=["q2"], kv_residual=32, kv_policy={"policy": "h2o"})
    cache = metalkv.KVCache(host, 1, 1, 32, 64, max_chunk=4, kv_policy={"policy": "streaming"})
    with pytest.raises(metalkv.GpuError, match="storing 5 tokens in one call exceeds max_chunk 4"):
        cache.append_all_layers(np.ones((1, 5, 1, 32), np.float32), np.ones((1, 5, 1, 32), np.float32))
    for _ in range(70):
        cache.append_all_layers(one, one)
    assert cache.length(0) == 70 and cache.count(0) <= 64
    cache.truncate(70)  # where it is: fine
    # The 65th store evicted to 32 (evict_keep(64, 1)); the 6 stored since can be taken back, no more.
    assert cache.count(0) == 38
    cache.truncate(69)
    assert cache.count(0) == 37 and max(cache.kept_positions(0, 0)) == 68
    cache.truncate(64)
    assert cache.count(0) == 32 and max(cache.kept_positions(0, 0)) == 63
    with pytest.raises(metalkv.GpuError, match="it has evicted .* last 0 tokens ago, .* reset\\(\\) it instead"):
        cache.truncate(63)
    cache.append_all_layers(one, one)  # stores on at 64
    assert cache.length(0) == 65 and cache.count(0) == 33 and max(cache.kept_positions(0, 0)) == 64
    with pytest.raises(metalkv.GpuError, match="no longer addressed by position"):
        cache.read_rows(0, 0, 0, 1)
    cache.reset()
    assert cache.length(0) == cache.count(0) == 0 and cache.evicted == 0


def test_a_large_budget_evicts_a_sixteenth_at_a_time(host):
    """A budget of 1,024 evicts 64 tokens at a time (not a block per 32 steps):
    the count after each eviction is the reference's, the kept positions too."""
    rng = np.random.default_rng(2)
    policy = {"policy": "streaming", "sinks": 4}
    cache = metalkv.KVCache(host, 1, 1, 32, 1024, max_chunk=8, kv_policy=policy)
    st = ref.HeadState(policy, 1024)
    counts = set()
    for _ in range(170):
        k = rows(rng, 1, 8, 1, 32)
        cache.append_all_layers(k, k)
        st.store(8)
        if cache.length(0) > 1024:
            counts.add(cache.count(0))
        assert sorted(cache.kept_positions(0)) == st.held
    assert ref.keep_after_eviction(1024, 8) == 1024 - 64 and min(counts) == 1024 - 64 + 8
