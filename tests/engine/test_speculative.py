"""Speculative decoding by prompt lookup (docs/SPECULATIVE.md). The reference is
decoding without it: every call must get the same ids and, bit for bit, the same
logits rows each id was sampled from (keep_logits), and leave its cache at the
same length, whatever was proposed and rejected; alone, batched, with stop ids,
max_tokens and stop strings falling inside an accepted run. The proposals come
from _core.lookup_drafts, held against a plain Python reading of its rule."""
from __future__ import annotations

import numpy as np
import pytest

import metalkv
from metalkv import _core

from .test_batching import load, prompts

LOOKUP = dict(speculate="lookup")


def lookup_reference(history: list[int], k: int) -> list[int]:
    """The rule, written for reading: for n = 4, 3, 2, the latest earlier place
    where the last n ids occurred; what followed it (up to k ids)."""
    for n in (4, 3, 2):
        if len(history) <= n:
            continue
        tail = history[-n:]
        for start in range(len(history) - n - 1, -1, -1):
            if history[start:start + n] == tail:
                return history[start + n:start + n + k]
    return []


def test_lookup_drafts_against_the_rule():
    rng = np.random.default_rng(0)
    cases = [[1, 2, 3, 1, 2], [1, 2, 3, 4, 1, 2, 3, 4], [7, 7, 7, 7], [1, 2], [], [5, 1, 2, 9, 1, 2, 3, 1, 2]]
    cases += [rng.integers(0, 4, int(rng.integers(1, 40))).tolist() for _ in range(200)]
    for h in cases:
        for k in (1, 3, 8):
            assert _core.lookup_drafts(h, k) == lookup_reference(h, k), (h, k)
    assert _core.lookup_drafts([1, 2, 3, 9, 9, 1, 2, 3], 2) == [9, 9]  # the longest match wins, latest first


def looping(n: int, seed: int) -> list[list[int]]:
    """Prompts that repeat a short run: random tiny models continue such runs (and
    fall into loops of their own), so lookups propose and some are accepted."""
    rng = np.random.default_rng(seed)
    return [(rng.integers(1, 64, int(rng.integers(3, 7))).tolist() * 6)[: int(rng.integers(8, 40))] for _ in range(n)]


def run(engine, p, cache=None, **kw):
    """(ids, logits rows, stats, the cache's length after) of one call."""
    c = cache if cache is not None else engine.new_cache()
    r = engine._core.submit(c, np.asarray(p, np.int64), keep_logits=True, **kw)
    ids = r.result()
    return ids, r.logits(), r.stats, [c.length(l) for l in range(engine.config.n_layers)]


def same_as_plain(engine, ps, **kw):
    proposed = accepted = 0
    for p in ps:
        ids_a, logits_a, _, len_a = run(engine, p, **kw)
        ids_b, logits_b, st, len_b = run(engine, p, **kw, **LOOKUP)
        assert ids_b == ids_a and len_b == len_a
        np.testing.assert_array_equal(logits_b, logits_a)
        proposed += st["draft_proposed"]
        accepted += st["draft_accepted"]
    assert proposed > 0 and 0 < accepted <= proposed  # it proposed, and some were right
    return proposed, accepted


@pytest.fixture(scope="module")
def tiny(tiny_gguf):
    return load(tiny_gguf)


@pytest.fixture(scope="module")
def sliding(tiny_sliding_dir):
    return load(tiny_sliding_dir)


@pytest.mark.parametrize("draft_tokens", [1, 4, 16])
def test_ids_logits_and_cache_as_without_it(tiny, draft_tokens):
    same_as_plain(tiny, looping(6, seed=draft_tokens), max_tokens=40, stop_ids=[], draft_tokens=draft_tokens)


def test_sliding_layers(sliding):
    """Gemma 3's window-8 ring layers: a verified segment stores its rows at once
    and each row reads its own window; past the window many times over."""
    same_as_plain(sliding, looping(4, seed=3), max_tokens=90, stop_ids=[])


@pytest.mark.parametrize("kv", [dict(kv_k="q8", kv_v="q8"), dict(kv_k="q4", kv_v="q8", kv_residual=0)])
def test_quantized_cache(tiny_gguf, kv):
    same_as_plain(load(tiny_gguf, **kv), looping(4, seed=5), max_tokens=40, stop_ids=[])


def test_stop_ids_and_max_tokens_inside_an_accepted_run(tiny):
    """Every id of a plain reply as the stop id, and every max_tokens up to its
    length: the reply and the cache's length are those without speculation."""
    p = looping(1, seed=11)[0]
    plain, _, _, _ = run(tiny, p, max_tokens=30, stop_ids=[])
    for j, stop in enumerate(plain):
        if stop in plain[:j]:
            continue
        a = run(tiny, p, max_tokens=30, stop_ids=[stop])
        b = run(tiny, p, max_tokens=30, stop_ids=[stop], **LOOKUP)
        assert b[0] == a[0] == plain[:j] and b[3] == a[3]
    for n in range(1, len(plain) + 1):
        a, b = run(tiny, p, max_tokens=n, stop_ids=[]), run(tiny, p, max_tokens=n, stop_ids=[], **LOOKUP)
        assert b[0] == a[0] == plain[:n] and b[3] == a[3]
        np.testing.assert_array_equal(b[1], a[1])


def test_a_conversation_continues_the_same(tiny):
    """Two calls into one cache (the second continues the first): the same ids and
    cache as without speculation, so what a speculative call leaves is what a
    plain one leaves."""
    p, q = looping(2, seed=13)
    caches = []
    for kw in (dict(), LOOKUP):
        c = tiny.new_cache()
        first = run(tiny, p, cache=c, max_tokens=20, stop_ids=[], **kw)
        second = run(tiny, q, cache=c, max_tokens=20, stop_ids=[], **kw)
        caches.append((first[0], second[0], c.length(0), second[1]))
    assert caches[0][:3] == caches[1][:3]
    np.testing.assert_array_equal(caches[0][3], caches[1][3])


def test_batched_with_plain_calls(tiny):
    """A list where every other call speculates, batched into shared steps: each
    gets what it gets alone without speculation."""
    ps = looping(8, seed=17) + prompts(4, seed=2)
    kw = dict(max_tokens=32, stop_ids=())
    alone = [tiny.generate_ids(p, **kw) for p in ps]
    together = tiny.generate_ids(ps, **kw, **LOOKUP)
    assert together == alone
    st = tiny.last_stats
    assert st["max_batch"] > 1 and sum(r["draft_accepted"] for r in st["requests"]) > 0


def test_streams_with_stop_strings(tiny_text):
    """Text, paced streaming and a stop string found inside a verified run
    (stop_after rolls the cache back): the same text and cache as without it."""
    engine = load(tiny_text)
    accepted = 0
    for prompt in ("abcabcabcabcab", "hello hello hello hel"):
        c_a, c_b = engine.new_cache(), engine.new_cache()
        a = "".join(engine.stream(prompt, chat=False, cache=c_a, max_tokens=40))
        b = "".join(engine.stream(prompt, chat=False, cache=c_b, max_tokens=40, **LOOKUP))
        accepted += engine.last_stats["draft_accepted"]
        assert a == b and c_a.length(0) == c_b.length(0)
        if len(a) > 4:
            stop = a[2:4]
            c_a, c_b = engine.new_cache(), engine.new_cache()
            a = engine.generate(prompt, chat=False, cache=c_a, max_tokens=40, stop=stop)
            b = engine.generate(prompt, chat=False, cache=c_b, max_tokens=40, stop=stop, **LOOKUP)
            assert a == b and c_a.length(0) == c_b.length(0)
    assert accepted > 0


@pytest.fixture(scope="module")
def tiny_text(tmp_path_factory):
    from models.tiny import TINY_VOCAB, write_gguf  # tests/ is on sys.path

    f = tmp_path_factory.mktemp("spec_text") / "tiny_text.gguf"
    write_gguf(f, tokenizer=TINY_VOCAB, hidden=128, n_heads=2, n_kv_heads=1, head_dim=64, ffn=64, vocab=64)
    return f


@pytest.mark.parametrize("kw,match", [
    (dict(speculate="ngram"), r"speculate='ngram': expected None or 'lookup'"),
    (dict(speculate="lookup", draft_tokens=0), r"draft_tokens=0: expected an int in 1\.\.16"),
    (dict(speculate="lookup", draft_tokens=True), r"draft_tokens=True: expected an int"),
    (dict(speculate="lookup", temperature=0.7), r"speculate='lookup': expected greedy decoding"),
    (dict(speculate="lookup", repetition_penalty=1.2), r"speculate='lookup': expected greedy decoding"),
])
def test_options_are_checked(tiny, kw, match):
    with pytest.raises(metalkv.ArgumentError, match=match):
        tiny.generate_ids([1, 2, 3], max_tokens=4, **kw)
    with pytest.raises(metalkv.ArgumentError, match=match):
        metalkv.Sampling(**kw).check()


def test_caches_it_cannot_verify_are_refused(tiny_gguf):
    engine = load(tiny_gguf, kv_k="q4", kv_v="q4")  # a residual window by default
    with pytest.raises(metalkv.ArgumentError, match=r"speculate='lookup': expected a cache without a residual"):
        engine.generate_ids([1, 2, 3], max_tokens=4, **LOOKUP)
    assert engine.generate_ids([1, 2, 3], max_tokens=4) is not None  # and without it, it runs


def test_the_server_speculates_for_greedy_requests_only(tiny_engine_text):
    """`serve --speculate lookup`: a greedy request gets the reply it gets without
    it (and speculated); a sampled one is not refused, it decodes without it."""
    pytest.importorskip("uvicorn")
    pytest.importorskip("openai")
    from server.conftest import LiveServer  # tests/ is on sys.path

    plain = LiveServer(tiny_engine_text, model_name="tiny")
    fast = LiveServer(tiny_engine_text, model_name="tiny", defaults=dict(speculate="lookup", draft_tokens=4))
    try:
        ask = dict(model="tiny", prompt="abcabcabcabcabcab", max_tokens=32)
        a = plain.client().completions.create(**ask, temperature=0)
        b = fast.client().completions.create(**ask, temperature=0)
        assert b.choices[0].text == a.choices[0].text
        sampled = fast.client().completions.create(**ask, temperature=0.8, seed=3)
        assert sampled.choices[0].finish_reason in ("length", "stop")
    finally:
        plain.close()
        fast.close()


@pytest.fixture(scope="module")
def tiny_engine_text(tiny_text):
    return load(tiny_text, context=256)
