"""The sampler's constrained-decoding edits (metal/sample.metal 1c): logit_bias added
after the penalties, then the ids a token bitmask leaves out made -inf; against
numpy's filtered distribution (tests/engine/test_sampling.py's reference), greedy,
sampled over grids of draws, with the filters, penalties and a draft."""
import numpy as np
import pytest

from metalkv import _core

from .test_sampling import counted_args, draw, host, logits_row, reference_probs, sample  # noqa: F401 (fixtures)

ops = _core.ops


def bitmask(allowed: np.ndarray) -> np.ndarray:
    """llguidance's layout: bit id % 32 of uint32 word id / 32."""
    words = np.zeros((len(allowed) + 31) // 32, np.uint32)
    for i in np.flatnonzero(allowed):
        words[i // 32] |= np.uint32(1 << (i % 32))
    return words


def bias_pairs(bias: dict) -> np.ndarray:
    return np.array([[i, np.float32(b).view(np.uint32)] for i, b in bias.items()], np.uint32).reshape(-1)


def edited(x, allowed=None, bias=None):
    """The logits after the edits, float64 (the reference applies them after its penalties)."""
    y = x.astype(np.float64).copy()
    for i, b in (bias or {}).items():
        y[i] += np.float32(b)
    if allowed is not None:
        y[~allowed] = -np.inf
    return y


def edit_args(host, allowed=None, bias=None) -> dict:
    out = {}
    if allowed is not None:
        out["mask"] = host.buffer_from(bitmask(allowed))
    if bias:
        out.update(bias=host.buffer_from(bias_pairs(bias)), n_bias=len(bias))
    return out


def allowed_ids(vocab, seed, fraction):
    return np.random.default_rng(seed).uniform(size=vocab) < fraction


def test_greedy_is_the_argmax_of_the_allowed_ids(host, sample):
    vocab = 49152
    x = logits_row(vocab, 4)
    buf = host.buffer_from(x)
    allowed = allowed_ids(vocab, 5, 0.01)
    assert not allowed[np.argmax(x)]  # the mask changes the choice
    assert sample(host, buf, vocab, **edit_args(host, allowed)) == int(np.argmax(np.where(allowed, x, -np.inf)))
    one = np.zeros(vocab, bool)
    one[vocab - 1] = True  # the last id only (a partial last word)
    assert sample(host, buf, vocab, **edit_args(host, one)) == vocab - 1
    assert sample(host, buf, vocab, temperature=1.0, uniform=0.999, **edit_args(host, one)) == vocab - 1


def test_logit_bias_moves_the_greedy_choice(host, sample):
    vocab = 1000
    x = logits_row(vocab, 6)
    buf = host.buffer_from(x)
    order = np.argsort(-x)
    gap = float(x[order[0]] - x[order[7]])
    bias = {int(order[7]): gap + 0.5, int(order[0]): -100.0, 3: 0.0}
    assert sample(host, buf, vocab, **edit_args(host, bias=bias)) == int(order[7])
    # after the penalties: a presence penalty that would move it back is applied first
    got = sample(host, buf, vocab, presence_penalty=2.0, **counted_args(host, [int(order[7])]),
                 **edit_args(host, bias=bias))
    assert got == int(np.argmax(edited(x - 2.0 * (np.arange(vocab) == order[7]), bias=bias)))


CASES = [dict(temperature=1.0), dict(temperature=0.7, top_k=20), dict(temperature=1.0, top_p=0.8),
         dict(temperature=1.3, min_p=0.05, presence_penalty=0.5)]


@pytest.mark.parametrize("case", CASES)
def test_draws_match_the_reference_over_the_allowed_ids(host, case, sample):
    vocab = 49152
    x = logits_row(vocab, 7)
    allowed = allowed_ids(vocab, 8, 0.05)
    bias = {int(i): float(b) for i, b in zip(np.flatnonzero(allowed)[:40], np.linspace(-3, 3, 40))}
    bias[int(np.flatnonzero(~allowed)[0])] = 50.0  # a bias on a masked id does not bring it back
    generated = np.flatnonzero(allowed)[40:60] if "presence_penalty" in case else []
    extra = counted_args(host, generated) if len(generated) else {}
    y = edited(x.astype(np.float64) - case.get("presence_penalty", 0.0) * np.isin(np.arange(vocab), generated),
               allowed, bias)
    kw = {k: v for k, v in case.items() if k != "presence_penalty"}
    probs = reference_probs(y, **kw)
    assert probs[~allowed].sum() == 0
    cdf = np.cumsum(probs)
    buf = host.buffer_from(x)
    n = 0
    for u in np.random.default_rng(9).uniform(0, 1, 25):
        if np.min(np.abs(cdf - u)) < 1e-4:
            continue
        got = sample(host, buf, vocab, uniform=float(u), **case, **extra, **edit_args(host, allowed, bias))
        assert got == draw(probs, u), (case, u)
        n += 1
    assert n >= 20


def test_a_masked_draft_is_never_kept(host, sample):
    """Speculative verification under a mask: a proposal the mask leaves out has no
    mass, so the row is an ordinary draw among the allowed ids."""
    vocab = 4096
    x = logits_row(vocab, 10)
    allowed = allowed_ids(vocab, 11, 0.1)
    d = int(np.argmax(np.where(allowed, -np.inf, x)))  # the best masked id
    probs = reference_probs(edited(x, allowed))
    buf = host.buffer_from(x)
    for u in (0.1, 0.5, 0.9):
        got = sample(host, buf, vocab, temperature=1.0, uniform=u, draft=d, accept=0.0,
                     **edit_args(host, allowed))
        assert got == draw(probs, u) and allowed[got]


def test_bad_edits_are_refused(host):
    x = logits_row(100, 1)
    buf = host.buffer_from(x)
    with pytest.raises(Exception, match="at most 1024"):
        ops.sample(host, buf, 100, bias=host.buffer_from(np.zeros(2 * 1025, np.uint32)), n_bias=1025)
    with pytest.raises(Exception, match="mask"):
        ops.sample(host, buf, 100, mask=host.buffer_from(np.zeros(3, np.uint32)))  # 4 words needed


def test_the_masked_argmax_is_the_samplers_greedy_choice(host, sample):
    """A greedy constrained row without a bias takes the argmax kernel with the mask (cheaper
    than the sampler): the same id as the sampler's greedy path, over random masks."""
    vocab = 49157  # a partial last word
    x = logits_row(vocab, 12)
    buf, out = host.buffer_from(x), host.buffer(4)
    for seed, fraction in ((13, 0.001), (14, 0.3), (15, 1.0)):
        allowed = allowed_ids(vocab, seed, fraction)
        allowed[vocab - 1] = seed == 13  # the last id alone of its word
        ops.argmax(host, buf, out, n_rows=1, n=vocab, mask=host.buffer_from(bitmask(allowed)))
        want = int(np.argmax(np.where(allowed, x, -np.inf)))
        assert int(out.numpy().view(np.int32)[0]) == want
        assert sample(host, buf, vocab, **edit_args(host, allowed)) == want
