"""Log-probabilities of generated ids (Engine.submit(logprobs=n), Request.logprobs):
the log-softmax of the raw logits row each id was sampled from (before penalties
and temperature), checked in numpy against the rows the call kept (keep_logits:
the same floats, so a float32 rounding apart) and against the logits path
(Engine.logits of the sequence so far: other kernels, so a looser tolerance)."""
from __future__ import annotations

import numpy as np
import pytest

import metalkv
from metalkv import _core
from devices import TEST_DEVICE  # tests/ is on sys.path

from .test_cache_state import held

PROMPT = [3, 14, 15, 9, 26]


@pytest.fixture(scope="module")
def tiny(tiny_gguf):
    return metalkv.Engine.load(tiny_gguf, device=TEST_DEVICE, context=64, progress=False)


def log_softmax(row: np.ndarray) -> np.ndarray:
    x = row.astype(np.float64)
    return x - x.max() - np.log(np.exp(x - x.max()).sum())


def top_ids(ref: np.ndarray, n: int) -> list[int]:
    """The n highest entries, highest first, ties by lower id."""
    return sorted(range(len(ref)), key=lambda j: (-ref[j], j))[:n]


def submit(engine, prompt, **kw):
    """A call through the request API, as Engine.generate_ids makes it."""
    return engine._core.submit(engine.new_cache(), np.asarray(prompt, np.int64), ephemeral=True,
                               channel=_core.Channel(), **kw)


def check_entries(engine, prompt: list[int], ids: list[int], entries: list, kept: np.ndarray, n: int,
                  path_atol: float) -> None:
    """Every entry against log_softmax of the row its id was sampled from (kept),
    and of Engine.logits(prompt + ids[:i]) (the teacher-forced logits path)."""
    assert len(entries) == len(ids) == len(kept)
    path = engine.logits(prompt + ids[:-1])[len(prompt) - 1:]  # row i: the next-token logits after ids[:i]
    for i, (logprob, top) in enumerate(entries):
        ref = log_softmax(kept[i])
        # the same floats in double on both sides: only the float32 result's rounding
        np.testing.assert_allclose(logprob, ref[ids[i]], rtol=1e-6, atol=1e-5)
        assert [j for j, _ in top] == top_ids(ref, n)
        np.testing.assert_allclose([v for _, v in top], ref[[j for j, _ in top]], rtol=1e-6, atol=1e-5)
        assert all(a[1] >= b[1] for a, b in zip(top, top[1:]))
        # decode and prefill kernels sum in other orders: the rows differ by ~1e-3 on Q4_1
        via_path = log_softmax(path[i])
        np.testing.assert_allclose(logprob, via_path[ids[i]], atol=path_atol)
        np.testing.assert_allclose([v for _, v in top], via_path[[j for j, _ in top]], atol=path_atol)


def test_greedy_logprobs_are_log_softmax_of_the_logits(tiny):
    r = submit(tiny, PROMPT, max_tokens=12, stop_ids=[], logprobs=5, keep_logits=True)
    ids = r.result()
    entries = r.logprobs()
    check_entries(tiny, PROMPT, ids, entries, r.logits(), 5, path_atol=2e-3)
    for i, (logprob, top) in enumerate(entries):
        assert len(top) == 5 and top[0] == (ids[i], logprob)  # greedy: the id is the most likely one
    assert r.logprobs(4) == entries[4:] and r.logprobs(len(ids)) == [] and r.logprobs(10**6) == []


def test_greedy_logprobs_on_the_default_model(engine):
    """A real vocabulary (49152 ids): the sum over it and the top lists mean something."""
    prompt = engine.tokenizer.encode("The capital of France is")
    r = submit(engine, prompt, max_tokens=6, stop_ids=[], logprobs=5, keep_logits=True)
    ids = r.result()
    entries = r.logprobs()
    check_entries(engine, prompt, ids, entries, r.logits(), 5, path_atol=1e-2)
    assert all(top[0][0] == i for i, (_, top) in zip(ids, entries))


def test_sampled_logprobs_are_of_the_raw_distribution(tiny):
    """Temperature and every penalty change what is drawn, not what is recorded."""
    kw = dict(max_tokens=16, stop_ids=[], temperature=1.4, top_k=20, repetition_penalty=1.2, presence_penalty=1.0,
              frequency_penalty=0.5, seed=3)
    r = submit(tiny, PROMPT, logprobs=3, keep_logits=True, **kw)
    ids = r.result()
    check_entries(tiny, PROMPT, ids, r.logprobs(), r.logits(), 3, path_atol=2e-3)
    assert ids == submit(tiny, PROMPT, **kw).result()  # recording them changes nothing drawn
    # not all greedy picks: the test saw draws away from the raw favourite
    assert any(top[0][0] != i for i, (_, top) in zip(ids, r.logprobs()))


def test_logprobs_zero_records_the_id_alone(tiny):
    r = submit(tiny, PROMPT, max_tokens=5, stop_ids=[], logprobs=0, keep_logits=True)
    ids = r.result()
    entries = r.logprobs()
    assert [top for _, top in entries] == [[]] * len(ids)
    rows = r.logits()
    np.testing.assert_allclose([lp for lp, _ in entries], [log_softmax(rows[i])[j] for i, j in enumerate(ids)],
                               rtol=1e-6, atol=1e-5)


def test_no_entry_for_a_stop_id(tiny):
    whole = submit(tiny, PROMPT, max_tokens=12, stop_ids=[]).result()
    stop = whole[3]
    k = whole.index(stop)
    r = submit(tiny, PROMPT, max_tokens=12, stop_ids=[stop], logprobs=2)
    assert r.result() == whole[:k] and r.finish_reason == "stop"
    assert len(r.logprobs()) == k


def test_stop_after_drops_the_entries_with_the_ids(tiny):
    """What a stop string does (Python's Call: request.stop_after(k)): ids past k go, and their entries."""
    r = held(submit(tiny, PROMPT, max_tokens=12, stop_ids=[], logprobs=4, hold_at_step=6))  # 1 prefill + 4 decode
    assert len(r.ids) == 5 and len(r.logprobs()) == 5
    before = r.logprobs()
    r.stop_after(2)
    r.resume()
    assert len(r.result()) == 3 and r.finish_reason == "cancelled"
    assert r.logprobs() == before[:3]


def test_without_logprobs_there_are_no_entries(tiny):
    for kw in (dict(), dict(logprobs=None), dict(logprobs=-1)):
        r = submit(tiny, PROMPT, max_tokens=4, stop_ids=[], **kw)
        assert len(r.result()) == 4 and r.logprobs() == []


def test_a_batch_records_what_each_records_alone(tiny):
    prompts = [PROMPT, [1, 2, 3], list(range(10, 30))]
    kws = [dict(logprobs=5), dict(logprobs=2, temperature=0.8, seed=4), dict(logprobs=0, frequency_penalty=0.7)]
    together = [submit(tiny, p, max_tokens=10, stop_ids=[], **kw) for p, kw in zip(prompts, kws)]
    got = [(r.result(), r.logprobs()) for r in together]
    assert max(r.stats["max_batch"] for r in together) > 1
    for (ids, entries), p, kw in zip(got, prompts, kws):
        alone = submit(tiny, p, max_tokens=10, stop_ids=[], **kw)
        assert (ids, entries) == (alone.result(), alone.logprobs())


@pytest.mark.parametrize("bad,match", [(21, r"logprobs=21: expected an int in 0\.\.20, or -1/None for off"),
                                       (-2, r"logprobs=-2"), (2**40, r"logprobs=1099511627776"),
                                       (2.5, r"logprobs=2\.5: expected an int"), (True, r"logprobs=True")])
def test_bad_logprobs(tiny, bad, match):
    for call in (lambda: submit(tiny, PROMPT, max_tokens=2, logprobs=bad),
                 lambda: _core.check_generate(logprobs=bad)):
        with pytest.raises(metalkv.ArgumentError, match=match) as e:
            call()
        assert e.value.argument == "logprobs"
