"""Stress: the scheduler under concurrency and memory pressure, over time. The
references are the single-sequence path (each call again, alone) and the pool's
own bookkeeping (every block back, nothing reserved, device bytes and RSS flat).
Quick form in CI; METALKV_STRESS=long for minutes at full size (conftest.py)."""
from __future__ import annotations

import random
import threading
import time

import numpy as np

from devices import TEST_DEVICE  # tests/ is on sys.path

from .conftest import load, report, rss_bytes, size

B = 32  # metalkv._core.BLOCK_TOKENS, restated


def submit(engine, ids, **kw):
    """A call through the request API that keeps the logits it sampled from."""
    opts = dict(max_tokens=16, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0, seed=0,
                stop_ids=[])
    opts.update(kw)
    return engine._core.submit(engine.new_cache(), np.asarray(ids, np.int64), keep_logits=True, ephemeral=True,
                               **opts)


def random_call(rng: random.Random) -> tuple[list[int], dict]:
    ids = [rng.randrange(1, 64) for _ in range(rng.randrange(1, 90))]
    kw = dict(max_tokens=rng.randrange(1, 40))
    if rng.random() < 0.5:
        kw.update(temperature=rng.choice([0.7, 1.0, 1.4]), top_k=rng.choice([0, 10, 40]), seed=rng.randrange(2**32),
                  repetition_penalty=rng.choice([1.0, 1.2]))
    return ids, kw


def pool_settled(engine) -> None:
    """Every block back (free or cached-evictable), nothing reserved."""
    for g in engine.kv_pool["groups"]:
        assert g["free_blocks"] == g["blocks"] and g["reserved_blocks"] == 0, g


def test_threads_with_mixed_calls_equal_their_sequential_results(tiny_text):
    """8 threads x mixed calls (text with stop strings, streams, ids, sampling) at once
    give what the same calls give one after the other."""
    engine = load(tiny_text)
    rng = random.Random(1)
    words = ["the", "a", "cat", "sat", "on", "mat", "zz", "hello", "there"]
    work = []
    for i in range(8 * size(3, 25)):
        prompt = " ".join(rng.choice(words) for _ in range(rng.randrange(1, 12)))
        kw = dict(max_tokens=rng.randrange(2, 30), temperature=rng.choice([0.0, 0.8]), seed=i)
        work.append((rng.choice(["generate", "stream", "ids"]), prompt, kw, rng.choice([None, "a", "t "])))

    def call(kind, prompt, kw, stop):
        if kind == "ids":
            return engine.generate_ids(engine.tokenizer.encode(prompt), stop_ids=(), **kw)
        if kind == "stream":
            return "".join(engine.stream(prompt, stop=stop, **kw))
        return engine.generate(prompt, stop=stop, **kw)

    results = {}
    t0 = time.perf_counter()

    def worker(k):
        for i in range(k, len(work), 8):
            results[i] = call(*work[i])

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    concurrent_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i, w in enumerate(work):
        assert results[i] == call(*w), (i, w)
    report("8 threads x mixed calls", calls=len(work), concurrent_s=round(concurrent_s, 2),
           sequential_s=round(time.perf_counter() - t0, 2))
    pool_settled(engine)


def test_a_pool_kept_near_full(tiny_text):
    """Six threads keep submitting random calls into a pool with room for about
    three at a time: calls wait, none fails, no NaN, and memory stays flat."""
    probe = load(tiny_text, kv_memory=None)
    block = 2 * B * probe.config.n_kv_heads * probe.config.head_dim * 2 * probe.config.n_layers
    engine = load(tiny_text, kv_memory=12 * block, context=128)
    seconds = size(12.0, 240.0)
    stop = time.monotonic() + seconds
    tokens, calls, errors = [0], [0], []
    samples = []

    def worker(k):
        rng = random.Random(k)
        while time.monotonic() < stop:
            ids, kw = random_call(rng)
            r = submit(engine, ids, **kw)
            try:
                out = r.result()
            except Exception as e:  # noqa: BLE001 - collected, asserted below
                errors.append(repr(e))
                continue
            logits = r.logits()
            if not np.isfinite(logits).all():
                errors.append(f"non-finite logits in call {k}")
            tokens[0] += len(out)
            calls[0] += 1

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    [t.start() for t in threads]
    while any(t.is_alive() for t in threads):
        pool = engine.kv_pool
        samples.append((rss_bytes(), pool["nbytes"], min(g["free_blocks"] for g in pool["groups"])))
        time.sleep(0.25)
    [t.join() for t in threads]
    assert not errors, errors[:3]
    assert calls[0] > 6 and min(s[2] for s in samples) < 6  # it was near full
    assert len({s[1] for s in samples}) == 1  # the pool's device bytes never change
    steady = [s[0] for s in samples[len(samples) // 3:]]
    assert max(steady) - min(steady) < 64 * 2**20, (min(steady), max(steady))  # RSS flat after warm-up
    report("pool near full", seconds=seconds, calls=calls[0], tokens=tokens[0],
           tok_s=round(tokens[0] / seconds, 1), rss_mb=round(steady[-1] / 2**20, 1),
           rss_spread_mb=round((max(steady) - min(steady)) / 2**20, 1))
    pool_settled(engine)


def test_64_prompts_in_one_batch(tiny_text):
    """64 prompts (one-token ones among them) decode together once the last prompt is in."""
    # 192 rows a step: the prompts are in within ~10; a pool for 64 of them (auto: 16 sequences of the context)
    engine = load(tiny_text, max_seqs=64, prefill_chunk=128, kv_memory="64MB")
    rng = random.Random(3)
    ps = [[rng.randrange(1, 64) for _ in range(rng.randrange(1, 40))] for _ in range(64)]
    kw = dict(max_tokens=size(32, 96), stop_ids=())
    t0 = time.perf_counter()
    together = engine.generate_ids(ps, **kw)
    batch_s = time.perf_counter() - t0
    st = engine.last_stats
    assert st["max_batch"] == 64
    t0 = time.perf_counter()
    assert together == [engine.generate_ids(p, **kw) for p in ps]
    report("64 prompts in one batch", batch_s=round(batch_s, 2), alone_s=round(time.perf_counter() - t0, 2),
           tok_s=round(st["generated_tokens"] / batch_s, 1), max_batch=st["max_batch"])
    pool_settled(engine)


def test_continuous_generation_through_sliding_layers(tiny_sliding):
    """Thousands of tokens (10k+ in the long form) through a model whose ring
    layers keep only their window: their blocks stay bounded, the logits finite."""
    n = size(1500, 10500)
    engine = load(tiny_sliding, context=n + 64)
    cache = engine.new_cache()
    r = engine._core.submit(cache, np.arange(1, 9, dtype=np.int64), max_tokens=n, temperature=0.0, stop_ids=[],
                            keep_logits=True)
    samples = []
    t0 = time.perf_counter()
    while not r.done:
        pool = engine.kv_pool
        samples.append((rss_bytes(), [g["blocks"] - g["free_blocks"] for g in pool["groups"]]))
        time.sleep(0.2)
    out = r.result()
    seconds = time.perf_counter() - t0
    assert len(out) == n and r.finish_reason == "length"
    assert np.isfinite(r.logits()).all()
    windows = [g["window"] for g in engine.kv_pool["groups"]]
    for g, w in enumerate(windows):
        used = [s[1][g] for s in samples]
        if w:  # a ring group: its window, history and a tail, never more
            assert max(used) <= -(-(w + 2 * 16 - 1) // B) + 2, (w, max(used))
    steady = [s[0] for s in samples[len(samples) // 3:]]
    report("continuous generation, sliding", tokens=n, seconds=round(seconds, 1), tok_s=round(n / seconds, 1),
           rss_spread_mb=round((max(steady) - min(steady)) / 2**20, 1) if steady else 0)


def test_requests_arriving_at_random(tiny_text):
    """Calls start at random times, some are cancelled part-way: the others get what
    they get alone, and the pool ends settled."""
    engine = load(tiny_text)
    rng = random.Random(5)
    n = size(24, 240)
    plan = [random_call(rng) + (rng.random() < 0.2, rng.expovariate(20.0)) for _ in range(n)]
    results: dict[int, object] = {}

    def one(i, ids, kw, cancel):
        r = submit(engine, ids, paced=True, **kw)
        if cancel:
            while not r.take()[0] and not r.done:
                time.sleep(0.001)
            r.cancel()
        results[i] = (r.result(), r.finish_reason)

    threads = []
    for i, (ids, kw, cancel, wait) in enumerate(plan):
        time.sleep(wait)
        threads.append(threading.Thread(target=one, args=(i, ids, kw, cancel)))
        threads[-1].start()
    [t.join() for t in threads]
    for i, (ids, kw, cancel, _) in enumerate(plan):
        out, reason = results[i]
        alone = submit(engine, ids, **kw).result()
        if cancel:
            assert alone[:len(out)] == out and reason in ("cancelled", "length")
        else:
            assert out == alone, i
    report("random arrivals", calls=n, cancelled=sum(p[2] for p in plan))
    pool_settled(engine)


def test_every_eviction_policy_generates_on_in_flat_memory(tiny_text):
    """bench/kv_policy_stress.py's run, per policy (issue 15): a cache with a
    budget of half its 256-token context generates 600 tokens (long: 20,000)
    in calls of 100, each call continuing the last; it never stops for a full
    cache, its logits stay finite, the KV bytes its blocks hold stay within
    the budget's blocks and do not grow over the second half, and RSS grows by
    less than 32 MB. Without a policy the same cache stops at its context."""
    import argparse
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[2] / "bench" / "kv_policy_stress.py"
    spec = importlib.util.spec_from_file_location("kv_policy_stress", path)
    stress = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stress)
    a = argparse.Namespace(device=TEST_DEVICE, context=256, prefill_chunk=16, budget=0.5, kv_memory=None,
                           tokens=size(600, 20000), every=size(100, 1000), prompt=40, temperature=0.8,
                           verbose=False)
    none = stress.run(a, str(tiny_text), None)
    assert none["stopped"] == "context_full" and none["tokens"] < a.tokens
    first = none["samples"][0]
    per_block = first["held_bytes"] / -(-first["length"] // B)  # one block in every layer
    budget_blocks = 128 // B
    for policy in ("streaming", "keynorm", "h2o", "snapkv", "pyramidkv"):
        r = stress.run(a, str(tiny_text), policy)
        report(f"kv policy {policy}", tokens=r["tokens"], held_max=r["held_max"], tok_s=round(r["tok_s_steady"], 1))
        assert r["tokens"] == a.tokens and r["stopped"] == "length" and r["all_finite"], policy
        assert r["held_flat"] and r["rss_growth"] < 32e6, (policy, r["held_range"], r["rss_growth"])
        # snapkv and pyramidkv hold each call's prompt (one token here) whole, up to a block past
        # the budget; pyramidkv's layers round their own budgets up to blocks, one more at most
        whole = policy in ("snapkv", "pyramidkv")
        assert r["held_max"] <= per_block * (budget_blocks + whole), (policy, r["held_max"], per_block)
