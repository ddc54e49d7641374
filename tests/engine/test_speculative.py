"""Speculative decoding by prompt lookup (docs/SPECULATIVE.md). Greedy, the
reference is decoding without it: every call must get the same ids and, bit for
bit, the same logits rows each id was sampled from (keep_logits), and leave its
cache at the same length, whatever was proposed and rejected; alone, batched,
with stop ids, max_tokens and stop strings falling inside an accepted run.
Sampled, the ids must follow the model's distribution (a chi-square test on a
16-token vocabulary against the engine's own logits). The proposals come from
_core.lookup_drafts, held against a plain Python reading of its rule."""
from __future__ import annotations

import numpy as np
import pytest

import metalkv
from metalkv import _core
from devices import TEST_DEVICE  # tests/ is on sys.path

from .test_batching import load, prompts, sliding, tiny, tiny_text  # noqa: F401 (fixtures)

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


def same_as_plain(engine, ps, draft_tokens=None, **kw):
    proposed = accepted = 0
    spec = dict(LOOKUP, **({"draft_tokens": draft_tokens} if draft_tokens else {}))
    for p in ps:
        ids_a, logits_a, _, len_a = run(engine, p, **kw)
        ids_b, logits_b, st, len_b = run(engine, p, **kw, **spec)
        assert ids_b == ids_a and len_b == len_a
        np.testing.assert_array_equal(logits_b, logits_a)
        proposed += st["draft_proposed"]
        accepted += st["draft_accepted"]
    assert proposed > 0 and 0 < accepted <= proposed  # it proposed, and some were right
    return proposed, accepted


@pytest.mark.parametrize("draft_tokens", [1, 4, 16])
def test_ids_logits_and_cache_as_without_it(tiny, draft_tokens):
    same_as_plain(tiny, looping(6, seed=draft_tokens), max_tokens=40, stop_ids=[], draft_tokens=draft_tokens)


def test_frequency_penalty_counts_the_proposals_before_each_row(tmp_path):
    """Lookup proposes ids of the prompt, so the repetition penalty already sees them;
    presence and frequency count them once emitted. Row i of a verified segment must
    count the proposals before it: with a 16-token vocabulary and the strongest
    frequency penalty the replies are those without speculation (rows that ignore
    those proposals change 6 of these 12 replies)."""
    engine = metalkv.Engine.load(v16_model(tmp_path / "v16.gguf"), progress=False, context=256)
    ps = [[x % 16 for x in p] for p in looping(12, seed=13)]
    same_as_plain(engine, ps, max_tokens=60, stop_ids=[], temperature=0.0, frequency_penalty=2.0)


def test_sliding_layers(sliding):
    """Gemma 3's window-8 ring layers: a verified segment stores its rows at once
    and each row reads its own window; past the window many times over."""
    same_as_plain(sliding, looping(4, seed=3), max_tokens=90, stop_ids=[])


@pytest.mark.parametrize("kv", [dict(kv_k="q8", kv_v="q8"), dict(kv_k="q4", kv_v="q8", kv_residual=0)])
def test_quantized_cache(tiny_gguf, kv):
    same_as_plain(load(tiny_gguf, **kv), looping(4, seed=5), max_tokens=40, stop_ids=[])


@pytest.mark.parametrize("kv", [dict(kv_k="q4", kv_v="q4"), dict(kv_k="q2", kv_v="q2", kv_rotate=True)])
def test_residual_window(tiny_gguf, kv):
    """A quantized cache with its residual window (128 f16 positions; q2 seals K
    per block): each verified row reads its own window from the ring and what
    precedes it from the pool, as decode at its position does; well past the
    window."""
    engine = load(tiny_gguf, context=512, **kv)
    same_as_plain(engine, [p * 4 for p in looping(3, seed=9)], max_tokens=200, stop_ids=[])


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


def test_a_saved_cache_continues_the_same(tiny, tmp_path):
    """A cache a speculating call filled, saved and read back, continues as the
    cache of a plain call does."""
    p, q = looping(2, seed=23)
    texts = []
    for kw in (dict(), LOOKUP):
        c = tiny.new_cache()
        run(tiny, p, cache=c, max_tokens=30, stop_ids=[], **kw)
        c.save(tmp_path / "c.safetensors")
        back = tiny.load_cache(tmp_path / "c.safetensors")
        texts.append(run(tiny, q, cache=back, max_tokens=30, stop_ids=[], **kw)[:2])
    assert texts[0][0] == texts[1][0]
    np.testing.assert_array_equal(texts[0][1], texts[1][1])


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


def test_verified_rows_beside_a_prompt_chunk(tiny_gguf):
    """A speculating call decodes while a longer prompt is read in chunks of 8 in
    the same steps: the prompt rows go through the gemm (q/k/v split by its
    epilogue), the verified rows through the separate gemvs after them. Its
    prompt holds every bigram (L, v), so it proposes from its first decode
    step on. Each call gets what it gets alone without speculation."""
    engine = load(tiny_gguf, context=512)
    fast = [x for v in range(64) for x in (3, v, 7)] + [3]
    long = np.random.default_rng(4).integers(1, 64, 320).tolist()
    kw = dict(max_tokens=60, stop_ids=())
    together = engine.generate_ids([fast, long], **kw, **LOOKUP)  # first: nothing of either cached yet
    st = engine.last_stats["requests"]
    assert st[0]["draft_accepted"] > 0 and st[1]["prefill_steps"] >= 35
    assert together == [engine.generate_ids(p, **kw) for p in (fast, long)]


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


@pytest.mark.parametrize("kw,match", [
    (dict(speculate="ngram"), r"speculate='ngram': expected None, 'lookup' \(prompt lookup\) or 'draft'"),
    (dict(speculate="lookup", draft_tokens=0), r"draft_tokens=0: expected an int in 1\.\.16"),
    (dict(speculate="lookup", draft_tokens=True), r"draft_tokens=True: expected an int"),
    (dict(draft_tokens=4), r"draft_tokens=4: expected to come with speculate='lookup'"),
])
def test_options_are_checked(tiny, kw, match):
    with pytest.raises(metalkv.ArgumentError, match=match):
        tiny.generate_ids([1, 2, 3], max_tokens=4, **kw)
    with pytest.raises(metalkv.ArgumentError, match=match):
        metalkv.Sampling(**kw).check()


def policy_state(cache, n_layers):
    """Per layer: length, count, kept positions per head and the scores' bits."""
    out = []
    for l in range(n_layers):
        kept = [cache.kept_positions(l, h) for h in range(cache.n_kv_heads)] if cache.evicts(l) else None
        sc = cache.scores(l)
        out.append((cache.length(l), cache.count(l), kept, None if sc is None else sc[:, :cache.count(l)].tobytes()))
    return out


@pytest.mark.parametrize("policy", ["streaming", "keynorm", "h2o", "snapkv", "pyramidkv"])
def test_eviction_policies(tiny_gguf, policy):
    """Under every eviction policy, well past its budget (several evictions per
    reply): the ids, logits rows, kept positions and scores bits decoding gives
    without speculation. A verified step stores no more rows than fit before the
    next eviction, and the scores get only the kept rows' shares, added one row at
    a time (adding the rejected rows' shares too fails h2o, snapkv and pyramidkv
    here; adding the kept ones in one sum changes h2o's scores bits)."""
    engine = load(tiny_gguf, context=256, kv_policy=policy, kv_budget=96, kv_sinks=4,
                  **({"kv_window": 16} if policy in ("snapkv", "pyramidkv") else {}))
    proposed = accepted = 0
    for p in [q * 3 for q in looping(4, seed=23)]:
        runs = []
        for spec in ({}, LOOKUP):
            cache = engine.new_cache()
            ids, logits, st, _ = run(engine, p, cache, max_tokens=200, stop_ids=[], **spec)
            runs.append((ids, logits, policy_state(cache, engine.config.n_layers), cache.evicted))
            proposed += st["draft_proposed"]
            accepted += st["draft_accepted"]
        (ids_a, logits_a, state_a, evicted_a), (ids_b, logits_b, state_b, _) = runs
        assert ids_b == ids_a
        np.testing.assert_array_equal(logits_b, logits_a)
        assert state_b == state_a
        assert evicted_a >= 64  # (evictions during the reply, not only of the prompt)
    assert 0 < accepted <= proposed


def test_eviction_policies_batched(tiny_gguf):
    """h2o, several speculating calls sharing steps: each as alone without it."""
    engine = load(tiny_gguf, context=256, kv_policy="h2o", kv_budget=96)
    ps = looping(6, seed=29)
    kw = dict(max_tokens=150, stop_ids=())
    alone = [engine.generate_ids(p, **kw) for p in ps]
    assert engine.generate_ids(ps, **kw, **LOOKUP) == alone
    st = engine.last_stats
    assert st["max_batch"] > 1 and sum(r["draft_accepted"] for r in st["requests"]) > 0


def test_the_server_speculates_for_every_request(tiny_engine_text):
    """`serve --speculate lookup`: a greedy request, with penalties or without, gets
    the reply it gets without it; a sampled one decodes too."""
    pytest.importorskip("uvicorn")
    pytest.importorskip("openai")
    from server.conftest import LiveServer  # tests/ is on sys.path

    plain = LiveServer(tiny_engine_text, model_name="tiny")
    fast = LiveServer(tiny_engine_text, model_name="tiny", defaults=dict(speculate="lookup", draft_tokens=4))
    try:
        ask = dict(model="tiny", prompt="abcabcabcabcabcab", max_tokens=32)
        for extra in ({}, dict(frequency_penalty=0.4, presence_penalty=0.3)):
            a = plain.client().completions.create(**ask, temperature=0, **extra)
            b = fast.client().completions.create(**ask, temperature=0, **extra)
            assert b.choices[0].text == a.choices[0].text
        sampled = fast.client().completions.create(**ask, temperature=0.8, seed=3)
        assert sampled.choices[0].finish_reason in ("length", "stop")
    finally:
        plain.close()
        fast.close()


@pytest.fixture(scope="module")
def tiny_engine_text(tiny_text):
    return load(tiny_text, context=256)


# The chi-square distribution's 0.1 % critical values by degrees of freedom.
CHI2_CRITICAL = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32, 8: 26.12, 9: 27.88,
                 10: 29.59, 11: 31.26, 12: 32.91, 13: 34.53, 14: 36.12, 15: 37.70}


def v16_model(path, seed=0):
    """A tiny llama GGUF with a 16-token vocabulary (the chi-square tests' cells)."""
    from models.tiny import write_gguf  # tests/ is on sys.path

    write_gguf(path, hidden=128, n_heads=2, n_kv_heads=1, head_dim=64, ffn=64, vocab=16, seed=seed)
    return path


def second_ids_chi2(engine, prompt, n, **kw):
    """Over n seeds, the chi-square of the second generated ids against the sum over
    seeds of p(. | prompt, first id) (the engine's logits at the call's temperature),
    its 0.1 % critical value, and the proposed and accepted counts."""
    vocab, temperature = 16, kw["temperature"]
    seconds, proposed, accepted = [], 0, 0
    for seed in range(n):
        ids = engine.generate_ids(prompt, seed=seed, max_tokens=3, stop_ids=(), **kw)
        proposed += engine.last_stats["draft_proposed"]
        accepted += engine.last_stats["draft_accepted"]
        seconds.append(tuple(ids[:2]))
    probs = {}
    expected, observed = np.zeros(vocab), np.zeros(vocab)
    for t1, t2 in seconds:
        if t1 not in probs:
            x = engine.logits(prompt + [t1])[-1].astype(np.float64) / temperature
            probs[t1] = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
        expected += probs[t1]
        observed[t2] += 1
    cells = expected >= 5
    chi2 = float((((observed - expected) ** 2) / expected)[cells].sum())
    critical = CHI2_CRITICAL[int(cells.sum()) - 1]

    return chi2, critical, proposed, accepted


def test_sampled_ids_follow_the_models_distribution(tmp_path):
    """Every prompt bigram (L, v) is followed by D, so after any first id t1 the
    lookup proposes D for the second: it is kept with probability p(D | t1) and
    otherwise the second id is drawn from the rest. Over 1,200 seeds the second
    ids' counts must match the sum over seeds of p(. | prompt, t1) (the engine's
    logits at temperature 8), chi-square below its 0.1 % critical value; a rule
    that kept D twice as often scores above 200 here. And a seed gives the same
    ids every time."""
    L, D, n = 3, 7, 1200
    engine = metalkv.Engine.load(v16_model(tmp_path / "v16.gguf"), progress=False, context=128)
    prompt = [x for v in range(16) for x in (L, v, D)] + [L]
    kw = dict(temperature=8.0, speculate="lookup")
    chi2, critical, proposed, accepted = second_ids_chi2(engine, prompt, n, **kw)
    assert proposed >= n and accepted > 0  # D proposed after every first id
    assert chi2 < critical, chi2
    assert engine.generate_ids(prompt, seed=5, max_tokens=3, **kw) == \
        engine.generate_ids(prompt, seed=5, max_tokens=3, **kw)


# ---- a draft model ---------------------------------------------------------------
@pytest.fixture(scope="module")
def drafts(tmp_path_factory):
    """(target, the target as its own draft, a target whose draft is another random model
    with a narrower feed-forward): tiny llama GGUFs with one 64-token vocabulary."""
    from models.tiny import TINY_VOCAB, write_gguf  # tests/ is on sys.path

    d = tmp_path_factory.mktemp("drafts")
    shape = dict(tokenizer=TINY_VOCAB, n_heads=2, n_kv_heads=1, head_dim=64, vocab=64)
    write_gguf(d / "target.gguf", hidden=128, ffn=64, seed=0, **shape)
    write_gguf(d / "small.gguf", hidden=128, ffn=32, seed=1, **shape)
    kw = dict(device=TEST_DEVICE, progress=False, context=256, prefill_chunk=8)
    return (metalkv.Engine.load(d / "target.gguf", **kw),
            metalkv.Engine.load(d / "target.gguf", draft=d / "target.gguf", **kw),
            metalkv.Engine.load(d / "target.gguf", draft=d / "small.gguf", **kw))


def test_a_draft_model_gives_what_decoding_alone_gives(drafts):
    """Greedy: the same ids, logits rows and cache length as without speculation,
    whether the draft is the target itself (nearly every proposal right) or a
    different model (most wrong); alone and batched."""
    plain, itself, other = drafts
    ps = looping(3, seed=29) + prompts(2, seed=7)
    kw = dict(max_tokens=40, stop_ids=[])
    for engine, least in ((itself, 0.999), (other, 0.0)):
        proposed = accepted = 0
        for p in ps:
            a, b = run(plain, p, **kw), run(engine, p, speculate="draft", **kw)
            assert b[0] == a[0] and b[3] == a[3]
            np.testing.assert_array_equal(b[1], a[1])
            proposed += b[2]["draft_proposed"]
            accepted += b[2]["draft_accepted"]
        assert proposed > 0 and accepted >= least * proposed
        assert engine.generate_ids(ps, speculate="draft", **kw) == [plain.generate_ids(p, **kw) for p in ps]


@pytest.mark.parametrize("penalties", [dict(repetition_penalty=1.3), dict(presence_penalty=1.0, frequency_penalty=0.5),
                                       dict(repetition_penalty=1.2, presence_penalty=-0.5, frequency_penalty=1.0)])
def test_penalties_with_a_draft_model(drafts, penalties):
    """A draft model proposes ids the context may lack: row i's repetition penalty
    sees the proposals before it, and presence/frequency count them, so greedy
    replies, logits rows and caches are those without speculation (rows that
    ignore those proposals change 4-6 of these 10 replies)."""
    plain, itself, _ = drafts
    kw = dict(max_tokens=40, stop_ids=[], temperature=0.0, **penalties)
    accepted = 0
    for p in prompts(6, seed=7) + looping(4, seed=3):
        a, b = run(plain, p, **kw), run(itself, p, speculate="draft", **kw)
        assert b[0] == a[0] and b[3] == a[3]
        np.testing.assert_array_equal(b[1], a[1])
        accepted += b[2]["draft_accepted"]
    assert accepted > 50


def test_a_conversation_with_a_draft_model(drafts):
    """The draft cache follows the target's: a second turn in the same cache, and a
    turn rolled back with keep, each as without speculation."""
    plain, itself, _ = drafts
    p, q = looping(2, seed=31)
    out = []
    for engine, kw in ((plain, {}), (itself, dict(speculate="draft"))):
        c = engine.new_cache()
        first = run(engine, p, cache=c, max_tokens=20, stop_ids=[], **kw)[0]
        second = run(engine, q, cache=c, max_tokens=20, stop_ids=[], **kw)[0]
        again = run(engine, q, cache=c, max_tokens=20, stop_ids=[], keep=len(p) + 10, **kw)[0]
        out.append((first, second, again, c.length(0)))
    assert out[0] == out[1]


def test_draft_models_are_checked(drafts, tmp_path):
    from models.tiny import TINY_VOCAB, write_gguf  # tests/ is on sys.path

    plain, itself, _ = drafts
    with pytest.raises(metalkv.ArgumentError, match=r"speculate='draft': expected an engine loaded with a draft"):
        plain.generate_ids([1, 2, 3], max_tokens=4, speculate="draft")
    write_gguf(tmp_path / "v32.gguf", hidden=128, n_heads=2, n_kv_heads=1, head_dim=64, ffn=32, vocab=32)
    write_gguf(tmp_path / "target.gguf", tokenizer=TINY_VOCAB, hidden=128, n_heads=2, n_kv_heads=1, head_dim=64,
               ffn=32, vocab=64)
    with pytest.raises(metalkv.ModelLoadError, match=r"the draft model has 32 token ids, target.gguf has 64"):
        metalkv.Engine.load(tmp_path / "target.gguf", draft=tmp_path / "v32.gguf", progress=False, context=64)


def test_sampled_ids_with_a_draft_model_follow_the_models_distribution(tmp_path):
    """Sampled, the draft model's greedy id after the first id is the proposal (a
    certain one: the rule keeps it with probability p(proposal) and otherwise draws
    from the rest), so the second ids follow the target's distribution: the same
    chi-square test as prompt lookup's, over 1,200 seeds, with another random model
    as the draft. And a seed gives the same ids every time."""
    target, small = v16_model(tmp_path / "target.gguf"), v16_model(tmp_path / "small.gguf", seed=1)
    engine = metalkv.Engine.load(target, draft=small, progress=False, context=128)
    prompt = [int(x) for x in np.random.default_rng(4).integers(0, 16, 12)]
    kw = dict(temperature=4.0, speculate="draft", draft_tokens=1)
    chi2, critical, proposed, accepted = second_ids_chi2(engine, prompt, 1200, **kw)
    assert proposed >= 1200 and 0 < accepted < proposed
    assert chi2 < critical, chi2
    assert engine.generate_ids(prompt, seed=5, max_tokens=6, **kw) == \
        engine.generate_ids(prompt, seed=5, max_tokens=6, **kw)
