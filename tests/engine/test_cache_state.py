"""The cache owns what it holds (token ids, the chat they render) and a call is
all or nothing for it: one that fails part-way leaves the cache exactly as it
was, and the same seed gives the same tokens however the work was split."""
from __future__ import annotations

import time

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


@pytest.fixture(scope="module")
def residual(tiny_gguf):
    """A quantized cache with a residual window of 32: its ring is the sequence's own."""
    return metalkv.Engine.load(tiny_gguf, device=TEST_DEVICE, context=64, prefill_chunk=4, progress=False,
                               kv_k="q4", kv_v="q8", kv_residual=32)


def snapshot(cache) -> dict:
    """Everything observable about a cache: lengths, ids, chat, and the K/V rows of
    every slot that holds a position (a quantized cache: the stored bytes of every
    position, and where its window's ring begins)."""
    layers = []
    for layer in range(cache.n_layers):
        if cache.formats(layer) != ("f16", "f16"):
            n = cache.length(layer)
            k, v = (np.concatenate(cache.read_rows(layer, kv, 0, n), axis=1) for kv in (0, 1))
            layers.append((n, cache.ring_lo(layer), k, v))
            continue
        pos = np.array(cache.positions(layer))
        held = pos >= 0
        layers.append((cache.length(layer), pos.tolist(), np.array(cache.keys(layer))[held].copy(),
                       np.array(cache.values(layer))[held].copy()))
    return {"tokens": list(cache.tokens), "messages": cache.messages, "layers": layers}


def by_position(cache) -> dict:
    """What a cache holds, independent of where its blocks sit: ids, and per layer
    the K and V rows in position order."""
    rows = []
    for layer in range(cache.n_layers):
        pos = np.array(cache.positions(layer))
        order = np.argsort(np.where(pos >= 0, pos, np.iinfo(np.int64).max))[: int((pos >= 0).sum())]
        rows.append((sorted(pos[pos >= 0].tolist()), np.array(cache.keys(layer))[order],
                     np.array(cache.values(layer))[order]))
    return {"tokens": list(cache.tokens), "rows": rows}


def assert_same_rows(a: dict, b: dict) -> None:
    assert a["tokens"] == b["tokens"]
    for (pa, ka, va), (pb, kb, vb) in zip(a["rows"], b["rows"]):
        assert pa == pb
        np.testing.assert_array_equal(ka, kb)
        np.testing.assert_array_equal(va, vb)


def assert_same(a: dict, b: dict) -> None:
    assert a["tokens"] == b["tokens"] and a["messages"] == b["messages"]
    for (la, pa, ka, va), (lb, pb, kb, vb) in zip(a["layers"], b["layers"]):
        assert la == lb and pa == pb
        np.testing.assert_array_equal(ka, kb)
        np.testing.assert_array_equal(va, vb)


def submit(engine, cache, ids, *, keep=None, hold_at_step=0, max_tokens=6, paced=False):
    """A greedy call through the engine's request API (the Python Engine's own path)."""
    return engine._core.submit(cache, np.asarray(ids, np.int64), max_tokens=max_tokens, temperature=0.0, top_k=0,
                               top_p=1.0, min_p=0.0, repetition_penalty=1.0, seed=0, stop_ids=[], keep=keep,
                               paced=paced, hold_at_step=hold_at_step)


def generate_core(engine, cache, ids, **kw) -> list[int]:
    return submit(engine, cache, ids, **kw).result()


def held(request):
    """Waits until the engine holds the request at its hold_at_step."""
    for _ in range(6000):
        if request.held or request.done:
            break
        time.sleep(0.005)
    assert request.held and not request.done
    return request


@pytest.mark.parametrize("model", ["tiny", "sliding", "residual"])
@pytest.mark.parametrize("where", ["prefill", "decode", "after_truncation", "caller"])
def test_a_call_that_fails_part_way_leaves_the_cache_as_it_was(request, model, where):
    """An aborted call (its caller failed: an exception, Ctrl-C) puts the cache back
    exactly, wherever the abort lands."""
    engine = request.getfixturevalue(model)
    cache = engine.new_cache()
    first = generate_core(engine, cache, list(range(1, 14)))  # 13 prompt tokens: rings have wrapped
    cache.messages = [{"role": "user", "content": "x"}]       # a chat record must come back too
    before = snapshot(cache)
    prompt = [5, 6, 7, 8, 9, 10, 11, 12, 13]                  # 3 prefill steps (chunks of 4)
    if where == "caller":  # aborted once the caller has read an id, whenever that is
        # paced: the engine runs at most 8 ids ahead of what was read, so 40 cannot be done first
        r = submit(engine, cache, prompt, paced=True, max_tokens=40)
        while not r.take()[0] and not r.done:
            time.sleep(0.001)
    else:
        step = {"prefill": 2, "decode": 5, "after_truncation": 3}[where]
        # after_truncation: roll back 3 tokens (a ring can drop max_chunk = 4), then abort
        keep = cache.length(0) - 3 if where == "after_truncation" else None
        r = held(submit(engine, cache, prompt, keep=keep, hold_at_step=step))
    r.abort()
    r.result()
    assert r.finish_reason == "aborted"
    assert_same(snapshot(cache), before)
    # and the cache goes on exactly as one that never saw the failed call
    clean = engine.new_cache()
    assert generate_core(engine, clean, list(range(1, 14))) == first
    clean.messages = [{"role": "user", "content": "x"}]
    assert generate_core(engine, cache, prompt) == generate_core(engine, clean, prompt)
    if model == "residual":  # the window's rows came back too: the same logits, bit for bit
        np.testing.assert_array_equal(engine.logits([3, 4], cache=cache), engine.logits([3, 4], cache=clean))


def test_a_failed_logits_call_leaves_the_cache_as_it_was(sliding):
    cache = sliding.new_cache()
    sliding.logits(list(range(1, 14)), cache=cache)
    before = snapshot(cache)
    r = held(sliding._core.submit_logits(cache, np.arange(20, 40, dtype=np.int64), hold_at_step=4))
    r.abort()
    r.result()
    assert r.logits() is None and r.finish_reason == "aborted"
    assert_same(snapshot(cache), before)


def test_cancelled_before_the_first_token_restores_after_keeps(tiny):
    cache = tiny.new_cache()
    generate_core(tiny, cache, list(range(1, 14)))
    before = snapshot(cache)
    r = held(submit(tiny, cache, [3, 4, 5, 6, 7], hold_at_step=2))  # after the first chunk of the prompt
    r.cancel()
    assert r.result() == [] and r.finish_reason == "cancelled"
    assert_same(snapshot(cache), before)
    # cancelled in decode (step 3 is the 1st decode step): what was generated stays
    n = cache.length(0)
    r = held(submit(tiny, cache, [3, 4, 5, 6, 7], hold_at_step=3))
    r.cancel()
    out = r.result()
    assert r.finish_reason == "cancelled" and len(out) == 1
    assert cache.length(0) == n + 5 and list(cache.tokens)[-5:] == [3, 4, 5, 6, 7]


def test_stop_after_rolls_back_what_was_fed_past_it(tiny):
    """A stop string found in id k's text: the engine may have run ahead; stop_after(k)
    leaves the cache as if k had been the last id sampled."""
    ref = tiny.new_cache()
    whole = generate_core(tiny, ref, [3, 4, 5, 6, 7], max_tokens=3)  # ids 0..2; ids 0, 1 fed
    cache = tiny.new_cache()
    r = held(submit(tiny, cache, [3, 4, 5, 6, 7], max_tokens=12, hold_at_step=6))  # 2 prefill + 3 decode steps run
    assert r.take()[0] == whole + r.ids[3:] and len(r.ids) == 4
    r.stop_after(2)
    r.resume()
    assert r.result() == whole and r.finish_reason == "cancelled"
    assert_same_rows(by_position(cache), by_position(ref))


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
