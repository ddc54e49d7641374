"""Many sequences in one step (docs/BATCHING.md). The reference is the
single-sequence path: every call of a list, or of several threads, must get
exactly what the same call gets alone, bit for bit in its ids (greedy, sampled
with a seed, with repetition penalty), whatever else shares its steps, however
its prompt was cut into chunks, and however many run at once (max_seqs)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import metalkv
from devices import TEST_DEVICE  # tests/ is on sys.path


@pytest.fixture(scope="module")
def tiny_text(tmp_path_factory):
    """A tiny llama GGUF with a real (64-token) byte-level vocabulary: text in and out."""
    from models.tiny import TINY_VOCAB, write_gguf  # tests/ is on sys.path

    f = tmp_path_factory.mktemp("tiny_text") / "tiny_text.gguf"
    write_gguf(f, tokenizer=TINY_VOCAB, hidden=128, n_heads=2, n_kv_heads=1, head_dim=64, ffn=64, vocab=64)
    return f


def load(path, **kw):
    kw = {"context": 160, "prefill_chunk": 8, **kw}
    return metalkv.Engine.load(path, device=TEST_DEVICE, progress=False, **kw)


@pytest.fixture(scope="module")
def tiny(tiny_gguf):
    return load(tiny_gguf)


@pytest.fixture(scope="module")
def sliding(tiny_sliding_dir):
    """Gemma 3, window 8 on six of its seven layers: batches through ring layers."""
    return load(tiny_sliding_dir)


def prompts(n: int, seed: int = 0, vocab: int = 64) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocab, int(rng.integers(1, 60))).tolist() for _ in range(n)]


def core_kw(kw: dict) -> dict:
    """generate_ids options as the C++ request takes them."""
    full = dict(max_tokens=16, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0, seed=0)
    full.update({k: v for k, v in kw.items() if k != "stop_ids"})
    return dict(full, stop_ids=list(kw.get("stop_ids", ())))


def with_logits(engine, ps: list[list[int]], kw: dict, together: bool) -> list[tuple[list[int], np.ndarray]]:
    """(ids, the logits each id was sampled from) per prompt: submitted together
    (one batch) or one after the other (alone)."""
    def submit(p):
        return engine._core.submit(engine.new_cache(), np.asarray(p, np.int64), keep_logits=True, ephemeral=True,
                                   **core_kw(kw))
    if together:
        requests = [submit(p) for p in ps]
        return [(r.result(), r.logits()) for r in requests]
    out = []
    for p in ps:
        r = submit(p)
        out.append((r.result(), r.logits()))
    return out


SAMPLINGS = [dict(), dict(temperature=0.9, top_k=20, seed=3), dict(temperature=1.3, top_p=0.8, min_p=0.05, seed=11,
                                                                      repetition_penalty=1.3)]


@pytest.mark.parametrize("model", ["tiny", "sliding"])
@pytest.mark.parametrize("sampling", range(len(SAMPLINGS)))
def test_a_list_gets_what_each_prompt_gets_alone(request, model, sampling):
    engine = request.getfixturevalue(model)
    kw = dict(max_tokens=24, stop_ids=(), **SAMPLINGS[sampling])
    ps = prompts(6, seed=sampling)
    together = engine.generate_ids(ps, **kw)
    assert engine.last_stats["max_batch"] > 1 and len(engine.last_stats["requests"]) == 6
    alone = with_logits(engine, ps, kw, False)
    assert together == [ids for ids, _ in alone]
    # and bit for bit: the logits every id was sampled from
    for (ids_b, logits_b), (ids_a, logits_a) in zip(with_logits(engine, ps, kw, True), alone):
        assert ids_b == ids_a and logits_b.shape == (len(ids_a), engine.config.vocab)
        np.testing.assert_array_equal(logits_b, logits_a)


def test_threads_are_batched_and_each_gets_what_it_gets_alone(tiny):
    """8 threads, mixed prompts and options, each calling several times."""
    work = [(p, dict(max_tokens=int(n), stop_ids=(5, 9) if i % 3 == 0 else (), **SAMPLINGS[i % 3]))
            for i, (p, n) in enumerate(zip(prompts(24, seed=7), np.random.default_rng(1).integers(1, 30, 24)))]
    results: dict[int, list[int]] = {}
    batches: list[int] = []

    def worker(k: int):
        for i in range(k, len(work), 8):
            results[i] = tiny.generate_ids(work[i][0], **work[i][1])
            batches.append(tiny.last_stats["max_batch"])  # this thread's own last call

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert max(batches) > 1  # they really shared steps
    for i, (p, kw) in enumerate(work):
        assert results[i] == tiny.generate_ids(p, **kw), i


def test_max_seqs_bounds_the_batch_and_the_rest_wait(tiny_gguf, tiny):
    two = load(tiny_gguf, max_seqs=2)
    ps = prompts(7, seed=3)
    kw = dict(max_tokens=10, stop_ids=())
    assert two.generate_ids(ps, **kw) == [tiny.generate_ids(p, **kw) for p in ps]
    st = two.last_stats
    assert st["max_batch"] == 2 and max(r["queue_seconds"] for r in st["requests"]) > 0


def test_long_generation_through_sliding_layers_in_a_batch(sliding):
    """Past the window many times over: the ring layers let blocks go in every
    sequence of the batch, and each still matches its lone run."""
    ps = prompts(3, seed=5)
    kw = dict(max_tokens=100, stop_ids=())
    assert sliding.generate_ids(ps, **kw) == [sliding.generate_ids(p, **kw) for p in ps]


def test_text_lists_stream_and_stop_strings(tiny_text):
    engine = load(tiny_text)
    ps = ["hello there", "a b c d", "the end", "zz"]
    kw = dict(max_tokens=20, temperature=0.8, seed=2)
    alone = [engine.generate(p, **kw) for p in ps]
    assert engine.generate(ps, **kw) == alone
    pieces: dict[int, str] = {}
    for i, piece in engine.stream(ps, **kw):
        pieces[i] = pieces.get(i, "") + piece
    assert [pieces.get(i, "") for i in range(len(ps))] == alone
    # a stop string cuts one call of the batch; its cache ends as the same call's alone
    stop = next(a[3:5] for a in alone if len(a) > 6)
    caches, refs = [engine.new_cache() for _ in ps], [engine.new_cache() for _ in ps]
    cut = engine.generate(ps, stop=stop, cache=caches, **kw)
    assert cut == [engine.generate(p, stop=stop, cache=c, **kw) for p, c in zip(ps, refs)]
    assert any(stop in a for a in alone) and all(stop not in t for t in cut)
    assert [list(c.tokens) for c in caches] == [list(c.tokens) for c in refs]
    assert [c.messages for c in caches] == [c.messages for c in refs]


def test_closing_one_stream_leaves_the_others(tiny_text):
    engine = load(tiny_text)
    kw = dict(max_tokens=30, temperature=0.7, seed=4)
    ps = ["one two", "three four"]
    alone = [engine.generate(p, **kw) for p in ps]
    seen = {0: "", 1: ""}
    stream = engine.stream(ps, **kw)
    for i, piece in stream:
        seen[i] += piece
        if len(seen[0]) >= 3:
            break
    stream.close()
    assert alone[0].startswith(seen[0]) and alone[1].startswith(seen[1])
    assert engine.generate(ps, **kw) == alone  # the engine goes on


def test_a_cache_serves_one_call_at_a_time(tiny):
    cache = tiny.new_cache()
    first = tiny._core.submit(cache, np.arange(1, 9, dtype=np.int64), max_tokens=4, hold_at_step=1)
    with pytest.raises(metalkv.ArgumentError, match=r"this cache is in another call that has not finished"):
        tiny.generate_ids([1, 2, 3], cache=cache, max_tokens=2)
    first.resume()
    first.result()
    assert tiny.generate_ids([1, 2, 3], cache=cache, max_tokens=2)  # free again


def test_a_call_whose_store_cannot_go_in_fails_alone(tiny):
    """A call whose cache was filled behind the engine's back (while the call was
    held) fails at its next step with the cache's error; the call sharing its
    steps goes on and gets what it gets alone: the plan checks each call's
    stores apart, before anything is encoded."""
    other = np.arange(3, 40, dtype=np.int64)
    kw = core_kw(dict(max_tokens=30))
    alone = tiny._core.submit(tiny.new_cache(), other, **kw).result()
    cache = tiny.new_cache()
    bad = tiny._core.submit(cache, np.arange(1, 9, dtype=np.int64), **kw, hold_at_step=2)  # held before its 1st decode
    good = tiny._core.submit(tiny.new_cache(), other, **kw, hold_at_step=2)
    for r in (bad, good):
        while not (r.held or r.done):
            time.sleep(0.002)
    assert bad.held and good.held
    full = np.zeros((cache.n_layers, cache.capacity - cache.length(0), cache.n_kv_heads, cache.head_dim), np.float32)
    cache.append_all_layers(full, full)
    good.resume()
    bad.resume()
    with pytest.raises(metalkv.GpuError, match="capacity"):
        bad.result()
    assert bad.finish_reason == "aborted"
    assert good.result() == alone


def test_list_arguments_are_checked(tiny):
    with pytest.raises(metalkv.ArgumentError, match=r"cache"):
        tiny.generate_ids([[1, 2], [3, 4]], cache=[tiny.new_cache()], max_tokens=2)
    with pytest.raises(metalkv.ArgumentError, match=r"prompts"):
        tiny.generate([], max_tokens=2)
