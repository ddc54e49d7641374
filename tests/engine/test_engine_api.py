"""The public Engine API on the default model: generate, stream, stop strings,
caches that continue, chat turns, seeds, stats. References are the engine's own
lower layers used independently (logits + numpy argmax, the tokenizer), so each
test pins one behaviour of the layer on top."""
from __future__ import annotations

import numpy as np
import pytest

import metalkv
from devices import TEST_DEVICE  # tests/ is on sys.path

PROMPT = "What is the capital of France? Answer in one sentence."


def test_generate_is_greedy_argmax_of_logits(engine):
    ids = engine.tokenizer.encode("The capital of France is")
    out = engine.generate_ids(ids, max_tokens=4, stop_ids=())
    # teacher-forced logits of prompt + generated: each generated id is the argmax after its prefix
    lg = engine.logits(ids + out[:-1])
    assert out == [int(i) for i in lg[len(ids) - 1:].argmax(1)]


def test_generate_text_and_chat_template(engine):
    text = engine.generate(PROMPT, max_tokens=12)
    assert "Paris" in text
    st = engine.last_stats
    assert st["finish_reason"] == "stop"  # ends with <|im_end|>, which is not part of the text
    rendered = engine.chat_template.render([{"role": "user", "content": PROMPT}])
    assert st["prompt_tokens"] == len(engine.tokenizer.encode(rendered))
    assert engine.tokenizer.decode(engine.tokenizer.encode(text)) == text


def test_stream_pieces_join_to_generate(engine):
    pieces = list(engine.stream(PROMPT, max_tokens=12))
    assert len(pieces) > 1
    assert "".join(pieces) == engine.generate(PROMPT, max_tokens=12)


def test_stream_stops_when_abandoned(engine):
    it = engine.stream("Count from one to one hundred.", max_tokens=40)
    next(it)
    it.close()  # the generator's finally stops the worker after its current token
    assert engine.last_stats["finish_reason"] == "cancelled"
    assert engine.last_stats["generated_tokens"] < 40


def test_stop_string_cuts_text(engine):
    full = engine.generate(PROMPT, max_tokens=12)
    cut = full.index("Paris")
    text = engine.generate(PROMPT, max_tokens=12, stop=["Paris", "never-appears"])
    assert text == full[:cut]
    assert engine.last_stats["finish_reason"] == "stop_string"


def test_max_tokens_and_finish_reason(engine):
    ids = engine.tokenizer.encode("Once upon a time")
    assert len(engine.generate_ids(ids, max_tokens=3, stop_ids=())) == 3
    assert engine.last_stats["finish_reason"] == "length"
    assert engine.generate_ids(ids, max_tokens=0) == []


def test_counters_per_token(engine):
    engine.generate_ids(engine.tokenizer.encode("Hello"), max_tokens=4, stop_ids=())
    st = engine.last_stats
    assert st["decode_steps"] == 3  # the first token comes out of the prefill step
    # one command buffer (and one compute encoder) per 4 layers (Model::kLayersPerCommandBuffer),
    # committed as encoded; the step waits for each in order (only the last blocks)
    buffers = -(-engine.config.n_layers // 4)
    assert st["command_buffers_committed_per_token"] == buffers and st["waits_per_token"] == buffers
    assert st["compute_encoders_per_token"] == buffers and st["blit_encoders_per_token"] == 0
    # per layer: norm, qkv (stacked weights), kv store (+ Q's rope), attention, o (+ residual
    # add), norm, gate/up + swiglu (one pass), down (+ residual add) = 8, and where lanes are
    # fibers the rows form's merge of its parts (metal/attention_decode_rows.h); plus
    # embedding, final norm, lm_head, argmax
    per_layer = 9 if engine.device.properties["lanes_are_fibers"] else 8
    assert st["dispatches_per_token"] == per_layer * engine.config.n_layers + 4


def test_cache_continuation_equals_one_pass(engine):
    ids = engine.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 3)
    full = engine.logits(ids)
    cache = engine.new_cache(capacity=64)
    first = engine.logits(ids[:13], cache=cache)
    rest = [engine.logits([t], cache=cache)[0] for t in ids[13:17]]  # decode steps
    tail = engine.logits(ids[17:], cache=cache)
    got = np.concatenate([first, np.stack(rest), tail])
    # decode (gemv, decode attention) and prefill (gemm, tiled attention) sum in
    # different orders; a float32 difference in a K or V element can round it to
    # the neighbouring float16 in the cache. Both paths are within 0.006 of the
    # float64 reference (test_default_model), so within 0.02 of each other.
    np.testing.assert_allclose(got, full, rtol=0, atol=0.02)
    assert list(cache.tokens) == ids and cache.length(0) == len(ids)


def test_prefill_chunk_size_does_not_change_logits(engine, default_gguf):
    small = metalkv.Engine.load(default_gguf, device=TEST_DEVICE, prefill_chunk=5, context=64)
    ids = engine.tokenizer.encode("Chunked prefill must see every earlier key: one two three four.")
    assert len(ids) > 10
    np.testing.assert_allclose(small.logits(ids), engine.logits(ids), rtol=0, atol=0.02)  # as above
    assert small.last_stats["prefill_steps"] == -(-len(ids) // 5)


def test_generate_continues_a_cache(engine):
    ids = engine.tokenizer.encode("One, two, three,")
    cache = engine.new_cache(capacity=64)
    a = engine.generate_ids(ids, max_tokens=3, stop_ids=(), cache=cache)
    # the cache holds prompt + all generated ids but the last: feeding that one continues
    assert list(cache.tokens) == ids + a[:-1]
    b = engine.generate_ids([a[-1]], max_tokens=3, stop_ids=(), cache=cache)
    assert engine.generate_ids(ids, max_tokens=6, stop_ids=()) == a + b


def test_chat_turns_reuse_the_cache(engine):
    cache = engine.new_cache()
    first = engine.generate("My name is Ana. Say hello to me.", max_tokens=16, cache=cache)
    held = len(cache.tokens)
    second = engine.generate("What is my name?", max_tokens=16, cache=cache)
    fed = engine.last_stats["prompt_tokens"]
    messages = [{"role": "user", "content": "My name is Ana. Say hello to me."},
                {"role": "assistant", "content": first}, {"role": "user", "content": "What is my name?"}]
    full = engine.tokenizer.encode(engine.chat_template.render(messages))
    assert fed < len(full) and len(cache.tokens) >= held  # only the new turn went in
    # the same as answering the whole conversation from scratch
    assert second == engine.generate(full, max_tokens=16)
    assert [m["role"] for m in cache.messages] == ["user", "assistant", "user", "assistant"]


def test_chat_refuses_a_cache_of_plain_text(engine):
    cache = engine.new_cache(capacity=128)
    engine.generate("Once upon a time", chat=False, max_tokens=2, cache=cache)
    held = list(cache.tokens)
    with pytest.raises(ValueError, match=r"holds \d+ tokens that are not a chat this engine rendered"):
        engine.generate("Hello", cache=cache)
    assert list(cache.tokens) == held  # nothing was dropped


def test_seeded_sampling_reproduces(engine):
    kw = dict(max_tokens=8, temperature=1.0, top_k=50, top_p=0.95, min_p=0.02, repetition_penalty=1.1)
    a = engine.generate("Write a word.", seed=7, **kw)
    assert engine.generate("Write a word.", seed=7, **kw) == a
    outs = {engine.generate("Write a word.", seed=s, **kw) for s in range(8, 12)}
    assert len(outs | {a}) > 1  # different seeds draw differently


def test_cache_full_ends_generation(engine):
    ids = engine.tokenizer.encode("Hello there")
    cache = engine.new_cache(capacity=len(ids) + 3)
    out = engine.generate_ids(ids, max_tokens=20, stop_ids=(), cache=cache)
    assert engine.last_stats["finish_reason"] == "context_full"
    assert len(out) == 4 and cache.length(0) == len(ids) + 3  # the 4th id was sampled, not stored


def test_gil_is_released_while_the_engine_computes(engine):
    """A Python thread keeps running while one long C++ call (a 96-token prefill)
    computes. Were the GIL held through the call, that thread could not run at
    all during it: its longest pause would be the whole call."""
    import threading
    import time

    ids = np.asarray(engine.tokenizer.encode("one two three four five six seven eight " * 12)[:96], np.int32)
    cache = engine.new_cache(capacity=128)
    ticks: list[float] = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(time.perf_counter())

    t = threading.Thread(target=ticker)
    t.start()
    time.sleep(0.01)
    t0 = time.perf_counter()
    engine.logits(ids, cache=cache)
    t1 = time.perf_counter()
    stop.set()
    t.join()
    during = [x for x in ticks if t0 <= x <= t1]
    gaps = np.diff([t0] + during + [t1])
    assert gaps.max() < 0.5 * (t1 - t0), (gaps.max(), t1 - t0)
