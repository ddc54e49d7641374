"""The cache owns what it holds (token ids, the chat they render) and a call is
all or nothing for it: one that fails part-way leaves the cache exactly as it
was, and the same seed gives the same tokens however the work was split."""
from __future__ import annotations

import numpy as np
import pytest

import metalkv
from devices import TEST_DEVICE  # tests/ is on sys.path


@pytest.fixture(scope="module")
def tiny(tiny_gguf):
    # prefill_chunk 4: a 13-token prompt takes 4 steps, so a failure can land in the middle
    return metalkv.Engine.load(tiny_gguf, device=TEST_DEVICE, context=64, prefill_chunk=4, progress=False)


@pytest.fixture(scope="module")
def sliding(tiny_sliding_dir):
    """Gemma 3 with window 8 and prefill_chunk 4: its ring layers have 8 + 4 - 1 = 11 slots."""
    return metalkv.Engine.load(tiny_sliding_dir, device=TEST_DEVICE, context=64, prefill_chunk=4, progress=False)


def snapshot(cache) -> dict:
    """Everything observable about a cache: lengths, ids, chat, and the K/V rows of
    every slot that holds a position."""
    layers = []
    for layer in range(cache.n_layers):
        pos = np.array(cache.positions(layer))
        held = pos >= 0
        layers.append((cache.length(layer), pos.tolist(), np.array(cache.keys(layer))[held].copy(),
                       np.array(cache.values(layer))[held].copy()))
    return {"tokens": list(cache.tokens), "messages": cache.messages, "layers": layers}


def assert_same(a: dict, b: dict) -> None:
    assert a["tokens"] == b["tokens"] and a["messages"] == b["messages"]
    for (la, pa, ka, va), (lb, pb, kb, vb) in zip(a["layers"], b["layers"]):
        assert la == lb and pa == pb
        np.testing.assert_array_equal(ka, kb)
        np.testing.assert_array_equal(va, vb)


class Planted(Exception):
    pass


def fail_on_call(k: int):
    """A poll that raises on its k-th call (before the k-th step)."""
    calls = {"n": 0}

    def poll() -> bool:
        calls["n"] += 1
        if calls["n"] == k:
            raise Planted(f"planted failure before step {k}")
        return True
    return poll


def generate_core(engine, cache, ids, *, keep=None, poll=None, on_token=None, max_tokens=6):
    return engine._core.generate(cache, np.asarray(ids, np.int64), max_tokens=max_tokens, temperature=0.0, top_k=0,
                                 top_p=1.0, min_p=0.0, repetition_penalty=1.0, seed=0, stop_ids=[], keep=keep,
                                 on_token=on_token, poll=poll)


@pytest.mark.parametrize("model", ["tiny", "sliding"])
@pytest.mark.parametrize("where", ["prefill", "decode", "callback", "after_truncation"])
def test_a_call_that_fails_part_way_leaves_the_cache_as_it_was(request, model, where):
    engine = request.getfixturevalue(model)
    cache = engine.new_cache()
    first = generate_core(engine, cache, list(range(1, 14)))  # 13 prompt tokens: rings have wrapped
    cache.messages = [{"role": "user", "content": "x"}]       # a chat record must come back too
    before = snapshot(cache)
    prompt = [5, 6, 7, 8, 9, 10, 11, 12, 13]                  # 3 prefill steps
    with pytest.raises(Planted):
        if where == "prefill":
            generate_core(engine, cache, prompt, poll=fail_on_call(2))
        elif where == "decode":
            generate_core(engine, cache, prompt, poll=fail_on_call(5))
        elif where == "callback":
            generate_core(engine, cache, prompt, on_token=lambda t: (_ for _ in ()).throw(Planted()))
        else:  # roll back 3 tokens (a ring can drop max_chunk = 4), then fail: the tokens and slots return
            generate_core(engine, cache, prompt, keep=cache.length(0) - 3, poll=fail_on_call(3))
    assert_same(snapshot(cache), before)
    # and the cache goes on exactly as one that never saw the failed call
    clean = engine.new_cache()
    assert generate_core(engine, clean, list(range(1, 14))) == first
    clean.messages = [{"role": "user", "content": "x"}]
    assert generate_core(engine, cache, prompt) == generate_core(engine, clean, prompt)


def test_a_failed_logits_call_leaves_the_cache_as_it_was(sliding):
    cache = sliding.new_cache()
    sliding.logits(list(range(1, 14)), cache=cache)
    before = snapshot(cache)
    with pytest.raises(Planted):
        sliding._core.prefill(cache, np.arange(20, 40, dtype=np.int64), True, poll=fail_on_call(4))
    assert_same(snapshot(cache), before)


def test_cancelled_before_the_first_token_restores_after_keeps(tiny):
    cache = tiny.new_cache()
    generate_core(tiny, cache, list(range(1, 14)))
    before = snapshot(cache)
    assert generate_core(tiny, cache, [3, 4, 5, 6, 7], poll=lambda: False) == []
    assert tiny._core.finish_reason == "cancelled"
    assert_same(snapshot(cache), before)
    # cancelled in decode (the 3rd poll is the 1st decode step's): what was generated stays
    n = cache.length(0)
    calls = iter([True, True, False])
    out = generate_core(tiny, cache, [3, 4, 5, 6, 7], poll=lambda: next(calls))
    assert tiny._core.finish_reason == "cancelled" and len(out) == 1
    assert cache.length(0) == n + 5 and list(cache.tokens)[-5:] == [3, 4, 5, 6, 7]


def test_the_cache_owns_its_tokens_and_chat(tiny):
    cache = tiny.new_cache()
    out = tiny.generate_ids([1, 2, 3, 4], max_tokens=3, stop_ids=(), cache=cache)
    assert list(cache.tokens) == [1, 2, 3, 4] + out[:-1]
    cache.messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert cache.messages == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    cache.truncate(len(cache.tokens))  # drops nothing: the chat still describes the tokens
    assert len(cache.messages) == 2
    cache.truncate(3)
    assert list(cache.tokens) == [1, 2, 3] and cache.messages == []  # the tokens no longer render it
    cache.reset()
    assert list(cache.tokens) == [] and cache.length(0) == 0
    with pytest.raises(AttributeError):
        cache.anything = 1  # no Python-side state on a cache
    with pytest.raises(ValueError, match=r"exactly 'role' and 'content'"):
        cache.messages = [{"role": "user"}]


@pytest.mark.parametrize("chunk", [1, 3, 5, 64])
def test_same_seed_same_tokens_whatever_prefill_chunk(tiny_gguf, tiny, chunk):
    prompt = [7, 1, 22, 5, 9, 31, 2, 2, 40, 11, 3]
    kw = dict(max_tokens=12, stop_ids=(), temperature=1.2, top_k=40, repetition_penalty=1.1, seed=1234)
    other = metalkv.Engine.load(tiny_gguf, device=TEST_DEVICE, context=64, prefill_chunk=chunk, progress=False)
    assert other.generate_ids(prompt, **kw) == tiny.generate_ids(prompt, **kw)


def test_same_seed_same_tokens_however_the_prompt_is_split(tiny):
    prompt = [7, 1, 22, 5, 9, 31, 2, 2, 40, 11, 3]
    kw = dict(max_tokens=12, stop_ids=(), temperature=1.2, top_p=0.9, repetition_penalty=1.2, seed=99)
    whole = tiny.generate_ids(prompt, **kw)
    cache = tiny.new_cache()
    tiny.generate_ids(prompt[:4], max_tokens=0, cache=cache)
    tiny.logits(prompt[4:7], cache=cache)
    assert tiny.generate_ids(prompt[7:], cache=cache, **kw) == whole


def test_same_seed_same_reply_however_a_chat_is_split(engine):
    """A chat turn continued in its cache and the same conversation rendered into
    a fresh cache draw the same reply for the same seed."""
    kw = dict(max_tokens=10, temperature=0.9, top_k=40, seed=5)
    cache = engine.new_cache(capacity=256)
    engine.generate("My name is Ana.", cache=cache, max_tokens=8)
    second = engine.generate("What is my name?", cache=cache, **kw)
    fresh = engine.new_cache(capacity=256)
    fresh.messages = cache.messages[:2]
    assert engine.generate("What is my name?", cache=fresh, **kw) == second
    assert engine.last_stats["prompt_tokens"] > 20  # the fresh cache was fed the whole conversation


def test_system_prompt(engine):
    cache = engine.new_cache(capacity=256)
    engine.generate("Hi", cache=cache, system="You are a pirate.", max_tokens=4)
    assert cache.messages[0] == {"role": "system", "content": "You are a pirate."}
    rendered = engine.chat_template.render([{"role": "system", "content": "You are a pirate."},
                                            {"role": "user", "content": "Hi"}])
    assert list(cache.tokens)[:len(engine.tokenizer.encode(rendered))] == engine.tokenizer.encode(rendered)
    engine.generate("And?", cache=cache, max_tokens=4)  # the system prompt stays
    assert [m["role"] for m in cache.messages] == ["system", "user", "assistant", "user", "assistant"]
