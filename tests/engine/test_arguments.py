"""Every argument a caller gives is checked in one place and refused with a
ValueError (metalkv.ArgumentError) that names it; values at the edges of their
ranges do what they mean."""
from __future__ import annotations

import numpy as np
import pytest

import metalkv
from metalkv import _core
from devices import TEST_DEVICE  # tests/ is on sys.path


@pytest.fixture(scope="module")
def tiny(tiny_gguf):
    return metalkv.Engine.load(tiny_gguf, device=TEST_DEVICE, context=32, progress=False)


@pytest.mark.parametrize("kw,argument,match", [
    ({"prefill_chunk": 0}, "prefill_chunk", r"prefill_chunk=0: expected a positive int"),
    ({"prefill_chunk": True}, "prefill_chunk", r"prefill_chunk=True"),
    ({"prefill_chunk": 2.5}, "prefill_chunk", r"prefill_chunk=2.5"),
    ({"context": 0}, "context", r"context=0: expected a positive int"),
    ({"context": "512"}, "context", r"context='512'"),
    ({"context": 2**40}, "context", r"context=1099511627776"),
    ({"quantize": "q5_0"}, "quantize", r"quantize='q5_0': expected None, 'q8_0' or 'q4_0'"),
    ({"quantize": "Q8_0"}, "quantize", r"quantize='Q8_0': expected None, 'q8_0' or 'q4_0'"),
    ({"quantize": 8}, "quantize", r"quantize=8: expected None"),
])
def test_bad_engine_options(tiny_gguf, kw, argument, match):
    with pytest.raises(metalkv.ArgumentError, match=match) as e:
        metalkv.Engine.load(tiny_gguf, device=TEST_DEVICE, progress=False, **kw)
    assert e.value.argument == argument and isinstance(e.value, ValueError)


BAD_SAMPLING = [
    ({"temperature": -1.0}, "temperature", r"temperature=-1.0: expected a finite number >= 0"),
    ({"temperature": float("nan")}, "temperature", r"temperature=nan"),
    ({"temperature": "0.5"}, "temperature", r"temperature='0.5': expected a number"),
    ({"top_k": -1}, "top_k", r"top_k=-1: expected an int >= 0"),
    ({"top_k": 2.5}, "top_k", r"top_k=2.5: expected an int"),
    ({"top_p": 0.0}, "top_p", r"top_p=0.0: expected a number in \(0, 1\]"),
    ({"top_p": 1.5}, "top_p", r"top_p=1.5"),
    ({"min_p": -0.1}, "min_p", r"min_p=-0.1: expected a number in \[0, 1\]"),
    ({"min_p": 1.01}, "min_p", r"min_p=1.01"),
    ({"repetition_penalty": 0.0}, "repetition_penalty", r"repetition_penalty=0.0: expected a finite number > 0"),
    ({"presence_penalty": 2.5}, "presence_penalty",
     r"presence_penalty=2.5: expected a finite number in \[-2, 2\] \(0 = off\)"),
    ({"presence_penalty": float("nan")}, "presence_penalty", r"presence_penalty=nan: expected a finite number"),
    ({"frequency_penalty": -2.01}, "frequency_penalty", r"frequency_penalty=-2.01: expected a finite number in"),
    ({"frequency_penalty": float("inf")}, "frequency_penalty", r"frequency_penalty=inf"),
    ({"frequency_penalty": "0.5"}, "frequency_penalty", r"frequency_penalty='0.5': expected a number"),
    ({"max_tokens": -1}, "max_tokens", r"max_tokens=-1: expected an int >= 0"),
    ({"max_tokens": 10**20}, "max_tokens", r"max_tokens=100000000000000000000: expected an int between"),
    ({"max_tokens": True}, "max_tokens", r"max_tokens=True: expected an int"),
    ({"seed": -3}, "seed", r"seed=-3: expected an int in \[0, 2\*\*64\)"),
    ({"seed": 2**64}, "seed", r"seed=18446744073709551616"),
]


@pytest.mark.parametrize("kw,argument,match", BAD_SAMPLING)
def test_bad_sampling_arguments(tiny, kw, argument, match):
    """The same check for every entry point, and for metalkv.Sampling before any
    model is loaded (the CLI uses that)."""
    for call in (lambda: tiny.generate([1, 2, 3], **kw), lambda: tiny.generate_ids([1, 2, 3], **kw),
                 lambda: list(tiny.stream([1, 2, 3], **kw)), lambda: metalkv.Sampling(**kw).check()):
        with pytest.raises(metalkv.ArgumentError, match=match) as e:
            call()
        assert e.value.argument == argument


def test_one_check_for_python_and_cpp():
    """min_p = 1 was accepted by Python and refused by C++; now one function
    decides, and numpy scalars are numbers."""
    metalkv.Sampling(min_p=1.0, temperature=np.float32(0.7), top_k=np.int64(3), max_tokens=np.int32(4)).check()
    _core.check_generate(max_tokens=1, temperature=0.0, top_k=0, top_p=1.0, min_p=1.0, repetition_penalty=1.0,
                         seed=0)


def test_unknown_options_are_type_errors(tiny):
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) temprature"):
        tiny.generate([1, 2], temprature=0.5)
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) temprature"):
        tiny.stream([1, 2], temprature=0.5)


@pytest.mark.parametrize("stop,match", [(5, r"stop=5: expected a non-empty str"), ([""], r"stop=\[''\]")])
def test_bad_stop(tiny, stop, match):
    with pytest.raises(metalkv.ArgumentError, match=match) as e:
        tiny.generate([1, 2, 3], stop=stop)
    assert e.value.argument == "stop"


def test_edges_of_the_ranges_do_what_they_mean(tiny):
    prompt = [3, 14, 15, 9, 26]
    greedy = tiny.generate_ids(prompt, max_tokens=6, stop_ids=())
    # min_p = 1 keeps only the most likely token: sampling becomes greedy
    assert tiny.generate_ids(prompt, max_tokens=6, stop_ids=(), temperature=1.0, min_p=1.0, seed=4) == greedy
    # top_k beyond the vocabulary keeps everything, as top_k = 0 does
    kw = dict(max_tokens=6, stop_ids=(), temperature=1.0, seed=9)
    assert tiny.generate_ids(prompt, top_k=10**6, **kw) == tiny.generate_ids(prompt, top_k=0, **kw)


def test_huge_max_tokens_stops_at_the_context(tiny):
    """max_tokens beyond anything the cache can hold is 'until the context is
    full', and allocates nothing for the tokens it cannot reach."""
    cache = tiny.new_cache(capacity=16)
    out = tiny.generate_ids([1, 2, 3], max_tokens=2**62, stop_ids=(), repetition_penalty=1.3, temperature=0.9,
                            seed=1, cache=cache)
    assert tiny.last_stats["finish_reason"] == "context_full"
    assert len(out) == 14 and cache.length(0) == 16


def test_token_ids(tiny):
    with pytest.raises(metalkv.ArgumentError, match=r"token id 64 at index 1 is out of range; the vocabulary has 64"):
        tiny.logits([3, 64])
    with pytest.raises(metalkv.ArgumentError, match=r"token id -1 at index 0 is out of range"):
        tiny.generate_ids([-1, 3])
    # 2**32 + 5 would be 5 after a cast to int32: it is refused, not wrapped
    with pytest.raises(metalkv.ArgumentError, match=r"token id 4294967301 at index 0 is out of range"):
        tiny.generate_ids([2**32 + 5])
    for bad in ([[1, 2]], [1.5, 2.0]):
        with pytest.raises(metalkv.ArgumentError, match=r"1-D sequence of ints"):
            tiny.logits(bad)
    with pytest.raises(metalkv.ArgumentError, match=r"no token ids") as e:
        tiny.logits([])
    assert e.value.argument == "token_ids"


def test_prompt_longer_than_cache(tiny):
    cache = tiny.new_cache(capacity=8)
    with pytest.raises(metalkv.ArgumentError, match=r"10 tokens do not fit: the cache holds 8 and 0 are used"):
        tiny.generate_ids(list(range(10)), cache=cache)
    tiny.logits(list(range(6)), cache=cache)
    with pytest.raises(metalkv.ArgumentError, match=r"3 tokens do not fit: the cache holds 8 and 6 are used"):
        tiny.logits([1, 2, 3], cache=cache)
    assert cache.length(0) == 6 and list(cache.tokens) == list(range(6))  # nothing stored by the refused calls
    with pytest.raises(metalkv.ArgumentError, match=r"capacity=0: expected a positive int"):
        tiny.new_cache(capacity=0)
