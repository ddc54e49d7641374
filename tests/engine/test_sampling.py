"""The device sampler against a numpy model of transformers' logits processors
(repetition penalty, temperature, top-k, top-p, min-p) and inverse-CDF draw,
with OpenAI's presence and frequency penalties after the repetition penalty;
then the engine's generation with those penalties against a loop over
Engine.logits that applies them in numpy."""
import functools

import numpy as np
import pytest

import metalkv
from metalkv import cli
from metalkv._core import ops
from devices import TEST_DEVICE, test_device  # tests/ is on sys.path


def penalized(logits, repetition_penalty=1.0, penalty_ids=(), presence_penalty=0.0, frequency_penalty=0.0,
              generated=()):
    """The logits after the penalties, float64: repetition (transformers': every id
    of penalty_ids once), then OpenAI's over `generated`, c[j] = times id j was
    generated: logit[j] -= frequency_penalty * c[j] + presence_penalty * (c[j] > 0)."""
    x = logits.astype(np.float64).copy()
    for i in set(int(i) for i in penalty_ids):
        x[i] = x[i] / repetition_penalty if x[i] > 0 else x[i] * repetition_penalty
    c = np.bincount(np.asarray(generated, np.int64), minlength=len(x))
    return x - frequency_penalty * c - presence_penalty * (c > 0)


def reference_probs(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
                    penalty_ids=(), presence_penalty=0.0, frequency_penalty=0.0, generated=()):
    """Probabilities after the filters, float64, in transformers' order."""
    x = penalized(logits, repetition_penalty, penalty_ids, presence_penalty, frequency_penalty, generated)
    x = x / temperature
    keep = np.ones_like(x, bool)
    if top_k:
        kth = np.sort(x)[::-1][top_k - 1]
        keep &= x >= kth
    if top_p < 1.0:
        p = np.where(keep, np.exp(x - x.max()), 0)
        p /= p.sum()
        order = np.argsort(-p, kind="stable")
        mass = np.cumsum(p[order])
        n_keep = int(np.searchsorted(mass, top_p * (1 - 1e-9)) + 1)  # smallest set with mass >= top_p
        threshold = x[order[n_keep - 1]]
        keep &= x >= threshold
    if min_p > 0:
        keep &= x >= x.max() + np.log(min_p)
    p = np.where(keep, np.exp(x - x.max()), 0)
    return p / p.sum()


def draw(probs, u):
    return int(np.searchsorted(np.cumsum(probs), u * probs.sum(), side="right"))


def counted_pairs(generated) -> np.ndarray:
    """What the engine keeps for the kernel: (id, count) uint32 pairs, each id once,
    in order of first appearance."""
    ids, first, counts = np.unique(np.asarray(generated, np.int64), return_index=True, return_counts=True)
    order = np.argsort(first)
    return np.stack([ids[order], counts[order]], axis=1).astype(np.uint32)


def counted_args(host, generated) -> dict:
    pairs = counted_pairs(generated)
    return dict(counted=host.buffer_from(pairs.reshape(-1)), n_counted=len(pairs))


@pytest.fixture(scope="module")
def host():
    return test_device()


@pytest.fixture(params=["gpu", "simd"])
def sample(request):
    """ops.sample in each of its kernel's shapes (the host executor's own is 'simd')."""
    return functools.partial(ops.sample, shape=request.param)


def logits_row(vocab, seed):
    return (np.random.default_rng(seed).normal(0, 3, vocab)).astype(np.float32)


def test_greedy_is_argmax_with_lowest_index_on_ties(host, sample):
    x = logits_row(49152, 0)
    x[[100, 4000]] = x.max() + 1  # a tie
    assert sample(host, host.buffer_from(x), 49152) == 100


def test_repetition_penalty_changes_the_greedy_choice(host, sample):
    x = np.zeros(1000, np.float32)
    x[7], x[9], x[11] = 5.0, 4.0, -1.0
    ids = np.array([7, 7, 11], np.uint32)
    tok = sample(host, host.buffer_from(x), 1000, repetition_penalty=2.0,
                 penalty_ids=host.buffer_from(ids), n_penalty_ids=3)
    assert tok == 9  # 5/2 = 2.5 < 4


def test_presence_and_frequency_penalties_change_the_greedy_choice(host, sample):
    x = np.zeros(1000, np.float32)
    x[7], x[9], x[11] = 5.0, 4.8, 5.2
    kw = counted_args(host, [7, 7, 7, 9])  # c[7] = 3, c[9] = 1; 11 was not generated
    buf = host.buffer_from(x)
    assert sample(host, buf, 1000, **kw) == 11  # penalties off: the counts are not read
    assert sample(host, buf, 1000, presence_penalty=0.1, **kw) == 11  # 4.9, 4.7, 5.2
    assert sample(host, buf, 1000, presence_penalty=-0.5, **kw) == 7  # 5.5, 5.3, 5.2
    assert sample(host, buf, 1000, frequency_penalty=-0.2, **kw) == 7  # 5.6, 5.0, 5.2
    assert sample(host, buf, 1000, presence_penalty=-1.0, frequency_penalty=0.5, **kw) == 9  # 4.5, 5.3, 5.2


@pytest.mark.parametrize("penalties", [dict(presence_penalty=0.7), dict(frequency_penalty=1.1),
                                       dict(presence_penalty=-0.8, frequency_penalty=-0.4),
                                       dict(presence_penalty=2.0, frequency_penalty=-2.0, repetition_penalty=1.4)])
def test_greedy_with_penalties_is_argmax_of_the_penalized_logits(host, penalties, sample):
    """Over a real-sized row, with repeats in the generated ids and ids both in the
    repetition list and the counted one."""
    vocab = 49152
    rng = np.random.default_rng(7)
    changed = 0
    for trial in range(6):
        x = logits_row(vocab, 10 + trial)
        top = np.argsort(-x)
        # favourites, several of them more than once, and ids anywhere
        generated = np.concatenate([top[rng.integers(0, 6, 12)], rng.integers(0, vocab, 20)])
        penalty_ids = top[3:40].astype(np.uint32)  # overlaps the generated favourites
        ref = penalized(x, penalty_ids=penalty_ids, generated=generated, **penalties)
        first, second = np.sort(ref)[::-1][:2]
        assert first - second > 1e-4, "a near tie: pick another row"  # f32 on the device vs f64 here
        got = sample(host, host.buffer_from(x), vocab, penalty_ids=host.buffer_from(penalty_ids),
                     n_penalty_ids=len(penalty_ids), **counted_args(host, generated), **penalties)
        assert got == int(np.argmax(ref)), (trial, penalties)
        changed += got != int(np.argmax(x))
    assert changed >= 1  # the penalties decided some of these rows


def test_extra_counted_ids_are_counted_as_if_merged(host, sample):
    """A verified row's proposals as extra ids (repeats, ids already counted, new
    ones): the same token, greedy and over 100 draws, as with them merged into the
    pairs (each id's penalty one subtraction of its whole count); and they matter."""
    vocab = 5000
    rng = np.random.default_rng(21)
    x = logits_row(vocab, 5)
    top = np.argsort(-x)
    generated = np.concatenate([top[[1, 4, 4, 9]], rng.integers(0, vocab, 12)])
    extra = np.array([top[0], top[0], top[1], top[2], generated[5], top[3], top[0]], np.uint32)
    merged = counted_args(host, np.concatenate([generated, extra]))
    base = dict(counted_args(host, generated), extra=host.buffer_from(extra), n_extra=len(extra))
    without = counted_args(host, generated)
    differs = 0
    for penalties in (dict(presence_penalty=1.5, frequency_penalty=0.8), dict(presence_penalty=-0.7),
                      dict(frequency_penalty=2.0)):
        for u in [None] + list(np.linspace(0.0, 0.997, 100)):
            kw = dict(penalties) if u is None else dict(penalties, temperature=1.0, uniform=float(u))
            want = sample(host, host.buffer_from(x), vocab, **merged, **kw)
            assert sample(host, host.buffer_from(x), vocab, **base, **kw) == want, (penalties, u)
            differs += sample(host, host.buffer_from(x), vocab, **without, **kw) != want
    assert differs > 100, differs  # 265 of the 303 here
    with pytest.raises(Exception, match="at most 16"):
        sample(host, host.buffer_from(x), vocab, presence_penalty=1.0, extra=host.buffer_from(
            np.zeros(17, np.uint32)), n_extra=17)


CASES = [dict(temperature=0.8), dict(temperature=1.0, top_k=40), dict(temperature=0.7, top_p=0.9),
         dict(temperature=1.2, min_p=0.05), dict(temperature=0.9, top_k=50, top_p=0.8, min_p=0.02),
         dict(temperature=1.0, repetition_penalty=1.3),
         dict(temperature=1.0, presence_penalty=0.8, frequency_penalty=0.5),
         dict(temperature=0.7, top_p=0.9, presence_penalty=-0.5, frequency_penalty=-0.3),
         dict(temperature=1.1, top_k=30, min_p=0.01, repetition_penalty=1.3, presence_penalty=1.5,
              frequency_penalty=2.0)]


@pytest.mark.parametrize("case", CASES)
def test_draws_match_inverse_cdf_of_reference(host, case, sample):
    vocab = 49152
    x = logits_row(vocab, 1)
    ids = np.argsort(-x)[:20].astype(np.uint32)  # penalise the current favourites
    extra = dict(penalty_ids=host.buffer_from(ids), n_penalty_ids=len(ids)) \
        if "repetition_penalty" in case else {}
    # generated: favourites (in the repetition list too), some repeated, and ids further down
    generated = np.concatenate([ids[5:15], ids[5:8], ids[5:6], np.argsort(-x)[20:30]]) \
        if "presence_penalty" in case else []
    if len(generated):
        extra.update(counted_args(host, generated))
    probs = reference_probs(x, penalty_ids=ids if "repetition_penalty" in case else (), generated=generated, **case)
    cdf = np.cumsum(probs)
    buf = host.buffer_from(x)
    for u in np.random.default_rng(2).uniform(0, 1, 25):
        # f32 sums on the device vs f64 here: skip draws within 1e-4 of a boundary
        if np.min(np.abs(cdf - u)) < 1e-4:
            continue
        got = sample(host, buf, vocab, uniform=float(u), **case, **extra)
        assert got == draw(probs, u), (case, u)
        assert probs[got] > 0


def tied_row(vocab, seed):
    """Logits with many ties (integers), a few far below the rest and masked
    ids (-inf)."""
    rng = np.random.default_rng(seed)
    x = np.round(rng.normal(0, 2, vocab)).astype(np.float32)
    if vocab >= 8:
        x[rng.choice(vocab, 3, replace=False)] = [-1e30, 1e-30, -np.inf]
    return x


@pytest.mark.parametrize("vocab", [1, 2, 7, 1000])
@pytest.mark.parametrize("filters", [dict(top_k=1), dict(top_k=2), dict(top_k=5), dict(top_k=-1),
                                     dict(top_p=0.05), dict(top_p=0.5), dict(top_p=0.999),
                                     dict(top_k=9, top_p=0.6)])
def test_the_kept_set_is_the_reference_one_with_ties(host, vocab, filters, sample):
    """The threshold searches at their edges: ties at the threshold are all
    kept, top_k = vocab - 1, one- and two-token rows. Tokens the reference
    keeps are drawn at the middle of their CDF intervals, so a token kept or
    dropped wrongly moves the intervals and a draw differs."""
    x = tied_row(vocab, vocab)
    kw = dict(filters, temperature=1.0)
    if kw.get("top_k") == -1:
        kw["top_k"] = max(vocab - 1, 1)
    kw["top_k"] = min(kw.get("top_k", 0), vocab)  # past the vocabulary: all kept, as the kernel does
    probs = reference_probs(x, **kw)
    cdf = np.cumsum(probs)
    lo = np.concatenate([[0.0], cdf[:-1]])
    kept = np.flatnonzero(probs > 0)
    assert len(kept) >= 1
    if len(kept) > 24:  # the last kept ids (any wrong token before them moves theirs) and the threshold's ties
        kept = np.union1d(kept[-12:], kept[np.argsort(probs[kept], kind="stable")[:12]])
    buf = host.buffer_from(x)
    for i in kept:
        if cdf[i] - lo[i] < 1e-4:  # too narrow to aim at in float32
            continue
        assert sample(host, buf, vocab, uniform=float((lo[i] + cdf[i]) / 2), **kw) == i, (kw, i)


def test_top_k_one_is_greedy(host, sample):
    x = logits_row(5000, 3)
    for u in (0.0, 0.5, 0.99):
        assert sample(host, host.buffer_from(x), 5000, uniform=u, temperature=1.0, top_k=1) == int(np.argmax(x))


def test_min_p_one_keeps_only_the_most_likely(host, sample):
    """min_p = 1 keeps the tokens whose probability reaches the largest one's."""
    x = logits_row(5000, 5)
    for u in (0.0, 0.5, 0.99):
        assert sample(host, host.buffer_from(x), 5000, uniform=u, temperature=1.0, min_p=1.0) == int(np.argmax(x))


@pytest.mark.parametrize("bad,match", [
    (dict(temperature=-1.0), r"temperature=-1.0: expected a finite number >= 0"),
    (dict(temperature=1.0, top_p=0.0), r"top_p=0.0: expected a number in \(0, 1\]"),
    (dict(temperature=1.0, min_p=1.5), r"min_p=1.5: expected a number in \[0, 1\]"),
    (dict(repetition_penalty=0.0), r"repetition_penalty=0.0: expected a finite number > 0"),
    (dict(top_k=-2), r"top_k=-2: expected an int >= 0"),
    (dict(presence_penalty=2.5), r"presence_penalty=2.5: expected a finite number in \[-2, 2\] \(0 = off\)"),
    (dict(frequency_penalty=float("nan")), r"frequency_penalty=nan: expected a finite number in \[-2, 2\]"),
])
def test_bad_sampling_arguments(host, bad, match):
    """The op checks its arguments with the same function the engine uses."""
    x = logits_row(100, 4)
    with pytest.raises(metalkv.ArgumentError, match=match) as e:
        ops.sample(host, host.buffer_from(x), 100, **bad)
    assert e.value.argument == next(k for k in bad if k != "temperature" or len(bad) == 1)


def test_bad_uniform_draw(host):
    with pytest.raises(metalkv.GpuError, match="uniform draw must be in"):
        ops.sample(host, host.buffer_from(logits_row(100, 4)), 100, uniform=1.0, temperature=1.0)


def test_a_shape_it_lacks_is_refused_by_name(host):
    with pytest.raises(metalkv.ArgumentError, match=r"shape='wide'.*'gpu' or 'simd'"):
        ops.sample(host, host.buffer_from(logits_row(100, 4)), 100, shape="wide")


# ---- the engine: generation with presence and frequency penalties --------------------
@pytest.fixture(scope="module")
def tiny(tiny_gguf):
    return metalkv.Engine.load(tiny_gguf, device=TEST_DEVICE, context=64, progress=False)


PROMPT = [3, 14, 15, 9, 26]


def reference_greedy(engine, prompt: list[int], n: int, repetition_penalty=1.0, **penalties) -> list[int]:
    """Greedy ids, each the argmax of Engine.logits of the sequence so far with the
    penalties applied here: repetition over every id fed (prompt and generated),
    presence/frequency over the generated ones only."""
    out: list[int] = []
    for _ in range(n):
        row = engine.logits(prompt + out)[-1]
        out.append(int(np.argmax(penalized(row, repetition_penalty, prompt + out, generated=out, **penalties))))
    return out


@pytest.mark.parametrize("penalties", [dict(frequency_penalty=0.7), dict(presence_penalty=1.5, frequency_penalty=2.0),
                                       dict(presence_penalty=-0.5, frequency_penalty=-0.3),
                                       dict(presence_penalty=-0.7, frequency_penalty=0.4, repetition_penalty=1.3)])
def test_greedy_generation_with_penalties_is_argmax_of_penalized_logits(tiny, penalties):
    """40 ids: more distinct ids than the engine's first (id, count) buffer holds, so it grows."""
    got = tiny.generate_ids(PROMPT, max_tokens=40, stop_ids=(), **penalties)
    assert got == reference_greedy(tiny, PROMPT, 40, **penalties)
    plain = tiny.generate_ids(PROMPT, max_tokens=40, stop_ids=(),
                              repetition_penalty=penalties.get("repetition_penalty", 1.0))
    assert got != plain  # the presence/frequency penalties changed what was generated


def test_a_batch_with_different_penalties_gets_what_each_gets_alone(tiny):
    options = [dict(), dict(frequency_penalty=0.7), dict(presence_penalty=-0.5, frequency_penalty=-0.3),
               dict(presence_penalty=1.2, temperature=0.9, seed=5),
               dict(frequency_penalty=2.0, repetition_penalty=1.2, temperature=1.1, top_k=20, seed=9)]
    prompts = [PROMPT, [1, 2, 3], list(range(10, 30)), [7] * 6, [40, 41]]

    def submit(prompt, kw):
        return tiny._core.submit(tiny.new_cache(), np.asarray(prompt, np.int64), max_tokens=30, ephemeral=True, **kw)
    together = [submit(p, kw) for p, kw in zip(prompts, options)]
    together_ids = [r.result() for r in together]
    assert max(r.stats["max_batch"] for r in together) > 1  # they really shared steps
    assert together_ids == [submit(p, kw).result() for p, kw in zip(prompts, options)]


def test_penalty_flags_reach_the_sampling_options():
    """cli._sampling picks the Sampling fields up by name: the new flags included."""
    args = cli._parser().parse_args(["generate", "hi", "--presence-penalty", "0.5", "--frequency-penalty", "-1.25"])
    s = cli._sampling(args)
    assert s["presence_penalty"] == 0.5 and s["frequency_penalty"] == -1.25
    d = cli._sampling(cli._parser().parse_args(["generate", "hi"]))
    assert d["presence_penalty"] == metalkv.Sampling().presence_penalty == 0.0 == d["frequency_penalty"]


# ---- speculative verification (docs/SPECULATIVE.md) ---------------------------------
@pytest.mark.parametrize("filters", [dict(temperature=1.0), dict(temperature=0.7, top_k=8),
                                     dict(temperature=1.3, top_p=0.8, min_p=0.02)])
def test_a_draft_is_kept_with_its_probability_and_the_rest_is_drawn_without_it(host, filters, sample):
    """A proposed id d is the token exactly when the acceptance draw is below p(d),
    p the filtered distribution; otherwise the draw comes from p without d,
    renormalized (speculative sampling's residual for a certain proposal), so
    over both draws each id comes with probability p. The rejected draw is aimed
    at the middle of each id's interval of that residual's CDF and must give that
    id: a wrong residual (d left in, another id dropped, not renormalized) moves
    the intervals and some draw differs."""
    vocab = 24
    x = logits_row(vocab, 7) / 2
    p = reference_probs(x, **filters)
    buf = host.buffer_from(x)
    kept = np.flatnonzero(p > 0)
    for d in (int(np.argmax(p)), int(kept[len(kept) // 2])):
        below, above = max(p[d] - 1e-4, 0.0), min(p[d] + 1e-4, 0.9999)
        assert sample(host, buf, vocab, 0.5, draft=d, accept=below, **filters) == d
        assert sample(host, buf, vocab, 0.5, draft=d, accept=above, **filters) != d
        rest = np.where(np.arange(vocab) == d, 0.0, p)
        rest /= rest.sum()
        cdf = np.cumsum(rest)
        lo = cdf - rest
        for t in np.flatnonzero(rest > 0):
            u = float((lo[t] + cdf[t]) / 2)
            assert sample(host, buf, vocab, u, draft=d, accept=0.9999, **filters) == t, (d, t)
        # and the whole: P(t) = p(d) [t = d] + (1 - p(d)) rest(t) = p(t)
        np.testing.assert_allclose(p[d] * (np.arange(vocab) == d) + (1 - p[d]) * rest, p, atol=1e-12)


def test_a_draft_the_filters_drop_is_an_ordinary_draw(host, sample):
    vocab = 24
    x = logits_row(vocab, 8)
    p = reference_probs(x, temperature=1.0, top_k=4)
    d = int(np.argmin(p))  # outside the top 4
    for u in (0.1, 0.5, 0.93):
        assert sample(host, host.buffer_from(x), vocab, u, temperature=1.0, top_k=4, draft=d, accept=0.0) == \
            sample(host, host.buffer_from(x), vocab, u, temperature=1.0, top_k=4) == draw(p, u)
