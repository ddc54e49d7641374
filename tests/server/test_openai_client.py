"""The server through the real `openai` client, on the default model. The reference of
each reply is the Python API on the same engine (Engine.chat / Engine.generate, which
tests/engine checks against llama.cpp and transformers): the server must give exactly
what the engine gives, whole or streamed, chat or completions."""
from __future__ import annotations

import numpy as np
import pytest

from .conftest import needs_server_packages

needs_server_packages()

QUESTION = [{"role": "user", "content": "Name three colours."}]


def test_chat_greedy_is_the_engines_reply(smol):
    r = smol.client().chat.completions.create(model="smol", messages=QUESTION, max_tokens=12, temperature=0)
    expected = smol.engine.chat(QUESTION, max_tokens=12)
    assert r.object == "chat.completion" and r.model == "smol" and r.id.startswith("chatcmpl-")
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == expected
    assert r.choices[0].finish_reason in ("length", "stop")
    prompt = len(smol.engine.chat_ids(QUESTION))
    assert r.usage.prompt_tokens == prompt
    assert r.usage.completion_tokens == smol.engine.last_stats["generated_tokens"]
    assert r.usage.total_tokens == prompt + r.usage.completion_tokens


def test_chat_stream_is_the_whole_reply_in_pieces(smol):
    messages = [{"role": "system", "content": "You answer in one sentence."},
                {"role": "user", "content": [{"type": "text", "text": "Why is the sea "}, {"type": "text",
                                                                                          "text": "salty?"}]}]
    client = smol.client()
    whole = client.chat.completions.create(model="smol", messages=messages, max_tokens=16, temperature=0)
    chunks = list(client.chat.completions.create(model="smol", messages=messages, max_tokens=16, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert len([p for p in pieces if p]) > 1  # streamed, not one piece at the end
    assert "".join(pieces) == whole.choices[0].message.content
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [whole.choices[0].finish_reason]
    usage = chunks[-1]
    assert usage.choices == [] and usage.usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_text_and_token_ids(smol):
    client = smol.client()
    expected = smol.engine.generate("Once upon a time", chat=False, max_tokens=10)
    r = client.completions.create(model="smol", prompt="Once upon a time", max_tokens=10, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text == expected
    ids = smol.engine.tokenizer.encode("Once upon a time")
    by_ids = client.completions.create(model="smol", prompt=ids, max_tokens=10, temperature=0)
    assert by_ids.choices[0].text == expected and by_ids.usage.prompt_tokens == len(ids)
    streamed = client.completions.create(model="smol", prompt="Once upon a time", max_tokens=10, temperature=0,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed) == expected
    echoed = client.completions.create(model="smol", prompt="Once upon a time", max_tokens=10, temperature=0,
                                       echo=True)
    assert echoed.choices[0].text == "Once upon a time" + expected


def test_several_prompts_and_choices(smol):
    client = smol.client()
    r = client.completions.create(model="smol", prompt=["The sky is", "Water is"], max_tokens=6, temperature=0)
    assert [c.index for c in r.choices] == [0, 1]
    assert [c.text for c in r.choices] == [smol.engine.generate(p, chat=False, max_tokens=6)
                                           for p in ("The sky is", "Water is")]
    sampled = client.chat.completions.create(model="smol", messages=QUESTION, max_tokens=8, temperature=1.0, n=3,
                                             seed=7)
    again = client.chat.completions.create(model="smol", messages=QUESTION, max_tokens=8, temperature=1.0, n=3,
                                           seed=7)
    texts = [c.message.content for c in sampled.choices]
    assert texts == [c.message.content for c in again.choices]  # a seed makes the choices reproducible
    assert len(set(texts)) > 1  # ... and each choice draws its own
    generated = 0
    for j, text in enumerate(texts):  # choice j draws with seed + j
        assert text == smol.engine.chat(QUESTION, max_tokens=8, temperature=1.0, seed=7 + j)
        generated += smol.engine.last_stats["generated_tokens"]
    assert sampled.usage.prompt_tokens == len(smol.engine.chat_ids(QUESTION))  # the prompt counted once
    assert sampled.usage.completion_tokens == generated


def test_stop_strings_and_max_tokens(smol):
    client = smol.client()
    free = client.completions.create(model="smol", prompt="1, 2, 3, 4,", max_tokens=12, temperature=0)
    text = free.choices[0].text
    assert free.choices[0].finish_reason == "length" and free.usage.completion_tokens == 12
    stop = text.strip()[:2]  # something the reply is known to say
    cut = client.completions.create(model="smol", prompt="1, 2, 3, 4,", max_tokens=12, temperature=0, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == text[:text.index(stop)]


def test_sampling_fields_reach_the_engine(smol):
    opts = dict(max_tokens=10, temperature=0.9, top_p=0.8, seed=11)
    r = smol.client().chat.completions.create(model="smol", messages=QUESTION, **opts,
                                               extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1})
    expected = smol.engine.chat(QUESTION, max_tokens=10, temperature=0.9, top_p=0.8, seed=11, top_k=20, min_p=0.05,
                                repetition_penalty=1.1)
    assert r.choices[0].message.content == expected


def test_a_shared_system_prompt_is_cached(smol):
    system = ("You are a careful assistant for a library. You answer questions about opening hours, loans, "
              "renewals, fines and events, briefly and politely, and you never invent a policy you were not told.")
    client = smol.client()
    first = client.chat.completions.create(model="smol", max_tokens=4, temperature=0, messages=[
        {"role": "system", "content": system}, {"role": "user", "content": "When do you open?"}])
    second = client.chat.completions.create(model="smol", max_tokens=4, temperature=0, messages=[
        {"role": "system", "content": system}, {"role": "user", "content": "Can I renew a book?"}])
    prompt = len(smol.engine.tokenizer.encode(system))
    assert prompt >= 32  # at least one whole block of it
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= 32 and cached % 32 == 0 and cached < second.usage.prompt_tokens
    assert first.usage.prompt_tokens_details.cached_tokens <= cached


def test_logprobs_are_the_models_distribution(smol):
    r = smol.client().chat.completions.create(model="smol", messages=QUESTION, max_tokens=5, temperature=0,
                                               logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 5
    prompt = smol.engine.chat_ids(QUESTION)
    ids = smol.engine.generate_ids(prompt, max_tokens=5)  # greedy: the ids the reply was made of
    logits = smol.engine.logits(prompt + ids[:4])[len(prompt) - 1:].astype(np.float64)
    top = logits.max(1, keepdims=True)
    ref = logits - top - np.log(np.exp(logits - top).sum(1, keepdims=True))  # log-softmax
    for k, entry in enumerate(content):
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob >= entry.top_logprobs[2].logprob
        assert entry.token == entry.top_logprobs[0].token  # greedy: the most likely token
        # (the reference comes from the prefill kernels, the reply from the decode ones: ~1e-3 apart on Q4_1)
        assert entry.logprob == pytest.approx(float(ref[k][ids[k]]), abs=5e-3)
        best = np.argsort(-ref[k], kind="stable")[:3]
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(ref[k][best].tolist(), abs=5e-3)
        assert [t.token for t in entry.top_logprobs] == [smol.engine.tokenizer.decode([int(i)]) for i in best]
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token


def test_models_health_and_the_model_by_name(smol):
    client = smol.client()
    assert [m.id for m in client.models.list()] == ["smol"]
    assert client.models.retrieve("smol").owned_by == "metalkv"
    with pytest.raises(Exception) as e:
        client.models.retrieve("gpt-4")
    assert getattr(e.value, "status_code", None) == 404
    import httpx

    health = httpx.get(f"{smol.url}/health").json()
    assert health["status"] == "ok" and health["model"] == "smol"


def test_logprobs_streamed_and_in_completions(smol):
    client = smol.client()
    whole = client.chat.completions.create(model="smol", messages=QUESTION, max_tokens=6, temperature=0,
                                           logprobs=True, top_logprobs=2)
    chunks = list(client.chat.completions.create(model="smol", messages=QUESTION, max_tokens=6, temperature=0,
                                                 logprobs=True, top_logprobs=2, stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in whole.choices[0].logprobs.content]
    legacy = client.completions.create(model="smol", prompt="The sky is", max_tokens=5, temperature=0, logprobs=3)
    lp = legacy.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 5
    assert "".join(lp.tokens) == legacy.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(5)]
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) == 3 and max(top.values()) == pytest.approx(logprob)  # greedy: the best is the one taken
