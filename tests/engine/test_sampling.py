"""The device sampler against a numpy model of transformers' logits processors
(repetition penalty, temperature, top-k, top-p, min-p) and inverse-CDF draw."""
import numpy as np
import pytest

import metalkv
from metalkv._core import ops
from devices import test_device  # tests/ is on sys.path


def reference_probs(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                    repetition_penalty=1.0, penalty_ids=()):
    """Probabilities after the filters, float64, in transformers' order."""
    x = logits.astype(np.float64).copy()
    for i in set(int(i) for i in penalty_ids):
        x[i] = x[i] / repetition_penalty if x[i] > 0 else x[i] * repetition_penalty
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


@pytest.fixture(scope="module")
def host():
    return test_device()


def logits_row(vocab, seed):
    return (np.random.default_rng(seed).normal(0, 3, vocab)).astype(np.float32)


def test_greedy_is_argmax_with_lowest_index_on_ties(host):
    x = logits_row(49152, 0)
    x[[100, 4000]] = x.max() + 1  # a tie
    assert ops.sample(host, host.buffer_from(x), 49152) == 100


def test_repetition_penalty_changes_the_greedy_choice(host):
    x = np.zeros(1000, np.float32)
    x[7], x[9], x[11] = 5.0, 4.0, -1.0
    ids = np.array([7, 7, 11], np.uint32)
    tok = ops.sample(host, host.buffer_from(x), 1000, repetition_penalty=2.0,
                     penalty_ids=host.buffer_from(ids), n_penalty_ids=3)
    assert tok == 9  # 5/2 = 2.5 < 4


CASES = [dict(temperature=0.8), dict(temperature=1.0, top_k=40), dict(temperature=0.7, top_p=0.9),
         dict(temperature=1.2, min_p=0.05), dict(temperature=0.9, top_k=50, top_p=0.8, min_p=0.02),
         dict(temperature=1.0, repetition_penalty=1.3)]


@pytest.mark.parametrize("case", CASES)
def test_draws_match_inverse_cdf_of_reference(host, case):
    vocab = 49152
    x = logits_row(vocab, 1)
    ids = np.argsort(-x)[:20].astype(np.uint32)  # penalise the current favourites
    extra = dict(penalty_ids=host.buffer_from(ids), n_penalty_ids=len(ids)) \
        if "repetition_penalty" in case else {}
    probs = reference_probs(x, penalty_ids=ids if extra else (), **case)
    cdf = np.cumsum(probs)
    buf = host.buffer_from(x)
    for u in np.random.default_rng(2).uniform(0, 1, 25):
        # f32 sums on the device vs f64 here: skip draws within 1e-4 of a boundary
        if np.min(np.abs(cdf - u)) < 1e-4:
            continue
        got = ops.sample(host, buf, vocab, uniform=float(u), **case, **extra)
        assert got == draw(probs, u), (case, u)
        assert probs[got] > 0


def test_top_k_one_is_greedy(host):
    x = logits_row(5000, 3)
    for u in (0.0, 0.5, 0.99):
        assert ops.sample(host, host.buffer_from(x), 5000, uniform=u, temperature=1.0, top_k=1) == int(np.argmax(x))


def test_min_p_one_keeps_only_the_most_likely(host):
    """min_p = 1 keeps the tokens whose probability reaches the largest one's."""
    x = logits_row(5000, 5)
    for u in (0.0, 0.5, 0.99):
        assert ops.sample(host, host.buffer_from(x), 5000, uniform=u, temperature=1.0, min_p=1.0) == int(np.argmax(x))


@pytest.mark.parametrize("bad,match", [
    (dict(temperature=-1.0), r"temperature=-1.0: expected a finite number >= 0"),
    (dict(temperature=1.0, top_p=0.0), r"top_p=0.0: expected a number in \(0, 1\]"),
    (dict(temperature=1.0, min_p=1.5), r"min_p=1.5: expected a number in \[0, 1\]"),
    (dict(repetition_penalty=0.0), r"repetition_penalty=0.0: expected a finite number > 0"),
    (dict(top_k=-2), r"top_k=-2: expected an int >= 0"),
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
