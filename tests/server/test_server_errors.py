"""What the server answers to requests it must refuse, and what it does when clients go
away: OpenAI's error object with the right status and the field named, and a server
that goes on serving afterwards, its calls ended and its blocks back in the pool."""
from __future__ import annotations

import json
import threading

import pytest

from .conftest import LiveServer, needs_server_packages

needs_server_packages()
import httpx  # noqa: E402
import openai  # noqa: E402

HELLO = [{"role": "user", "content": "hello"}]


def post(server, path: str, body, **kw) -> httpx.Response:
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(f"{server.url}{path}", content=data, headers={"content-type": "application/json"},
                      timeout=60, **kw)


def assert_error(r: httpx.Response, status: int, param=None, code=None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param and (code is None or err["code"] == code), err
    return err


@pytest.mark.parametrize("body, param", [
    ({"messages": HELLO, "temperature": "hot"}, "temperature"),
    ({"messages": HELLO, "temperature": 2.5}, "temperature"),
    ({"messages": HELLO, "top_p": 0}, "top_p"),
    ({"messages": HELLO, "max_tokens": -1}, "max_tokens"),
    ({"messages": HELLO, "max_tokens": 1.5}, "max_tokens"),
    ({"messages": HELLO, "max_completion_tokens": True}, "max_completion_tokens"),
    ({"messages": HELLO, "n": 0}, "n"),
    ({"messages": HELLO, "n": 1000}, "n"),
    ({"messages": HELLO, "presence_penalty": 3}, "presence_penalty"),
    ({"messages": HELLO, "min_p": 2}, "min_p"),
    ({"messages": HELLO, "repetition_penalty": 0}, "repetition_penalty"),
    ({"messages": HELLO, "top_k": "many"}, "top_k"),
    ({"messages": HELLO, "frequency_penalty": float("nan")}, "frequency_penalty"),
    ({"messages": HELLO, "seed": "x"}, "seed"),
    ({"messages": HELLO, "stop": [1, 2]}, "stop"),
    ({"messages": HELLO, "top_logprobs": 3}, "top_logprobs"),
    ({"messages": HELLO, "logprobs": True, "top_logprobs": 50}, "top_logprobs"),
    ({"messages": HELLO, "stream_options": {"include_usage": True}}, "stream_options"),
    ({"messages": HELLO, "tools": [{"type": "function", "function": {"name": "bad name!"}}]},
     "tools[0].function.name"),
    ({"messages": HELLO, "tools": [{"type": "function", "function": {"name": "f"}}] * 2}, "tools[1].function.name"),
    ({"messages": HELLO, "tools": "f"}, "tools"),
    ({"messages": HELLO, "tool_choice": "required"}, "tool_choice"),
    ({"messages": HELLO, "tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
    ({"messages": HELLO, "tools": [{"type": "function", "function": {"name": "f"}}],
      "response_format": {"type": "json_object"}}, "response_format"),
    ({"messages": HELLO, "functions": [{"name": "f"}]}, "functions"),
    ({"messages": HELLO, "logit_bias": {"1": 500}}, "logit_bias"),
    ({"messages": HELLO, "logit_bias": {"x": 5}}, "logit_bias"),
    ({"messages": HELLO, "logit_bias": {"99999": 5}}, "logit_bias"),
    ({"messages": HELLO, "logit_bias": [1]}, "logit_bias"),
    ({"messages": HELLO, "response_format": {"type": "yaml"}}, "response_format.type"),
    ({"messages": HELLO, "response_format": "json"}, "response_format"),
    ({"messages": HELLO, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema"),
    ({"messages": HELLO, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "intgr"}}}}}},
     "response_format.json_schema.schema"),
    ({"messages": "hello"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages"),
    ({"messages": [{"role": "user"}]}, "messages"),
    ({}, "messages"),
])
def test_bad_chat_fields_get_400_naming_the_field(tiny, body, param):
    r = post(tiny, "/v1/chat/completions", dict(body, model="tiny"))  # (NaN: as Python's json writes it)
    err = assert_error(r, 400, param)
    assert err["type"] == "invalid_request_error"


@pytest.mark.parametrize("body, param", [
    ({"prompt": 5}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": [[]]}, "prompt"),
    ({"prompt": [1, 99999]}, "prompt"),
    ({"prompt": "hi", "logprobs": 99}, "logprobs"),
    ({"prompt": "hi", "echo": True, "logprobs": 1}, "echo"),
    ({"prompt": "hi", "suffix": "end"}, "suffix"),
    ({"prompt": "hi", "best_of": 3}, "best_of"),
    ({}, "prompt"),
])
def test_bad_completion_fields_get_400(tiny, body, param):
    assert_error(post(tiny, "/v1/completions", dict(body, model="tiny")), 400, param)


def test_bodies_that_are_not_requests(tiny):
    assert_error(post(tiny, "/v1/chat/completions", b"{not json"), 400)
    assert_error(post(tiny, "/v1/chat/completions", b"\xff\xfe"), 400)
    assert_error(post(tiny, "/v1/chat/completions", [1, 2]), 400)
    assert_error(httpx.get(f"{tiny.url}/v1/chat/completions"), 405)
    assert_error(httpx.get(f"{tiny.url}/v1/nothing-here"), 404)
    # ... and the server goes on serving
    ok = tiny.client().chat.completions.create(model="tiny", messages=HELLO, max_tokens=3)
    assert ok.choices[0].finish_reason in ("length", "stop")


def test_unknown_model_is_openais_404(tiny):
    with pytest.raises(openai.NotFoundError) as e:
        tiny.client().chat.completions.create(model="gpt-4o", messages=HELLO, max_tokens=3)
    assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"


def test_a_prompt_longer_than_the_context(tiny):
    long = "word " * 400  # byte vocabulary: ~2,000 tokens, the context holds 256
    with pytest.raises(openai.BadRequestError) as e:
        tiny.client().completions.create(model="tiny", prompt=long, max_tokens=3)
    assert e.value.body["code"] == "context_length_exceeded" and "256" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        tiny.client().chat.completions.create(model="tiny", messages=[{"role": "user", "content": long}])
    assert e.value.body["param"] == "messages"


def test_api_key(tiny_engine):
    s = LiveServer(tiny_engine, model_name="tiny", api_key="sesame")
    try:
        with pytest.raises(openai.AuthenticationError):
            s.client(api_key="wrong").models.list()
        assert_error(httpx.get(f"{s.url}/v1/models"), 401, code="invalid_api_key")
        assert [m.id for m in s.client(api_key="sesame").models.list()] == ["tiny"]
        assert httpx.get(f"{s.url}/health").status_code == 200  # health needs no key
    finally:
        s.close()


@pytest.fixture
def no_gc():
    """Garbage collection off: a reply's end must not wait for the collector to find it."""
    import gc

    gc.disable()
    yield
    gc.enable()


def free_blocks(engine) -> int:
    return sum(g["free_blocks"] for g in engine.kv_pool["groups"])


# The default model here: slow enough on the host executor (a few tokens a second) that
# 300 tokens are far from done when the client goes.
def test_a_client_that_goes_mid_stream_cancels_its_call(smol, no_gc):
    smol.settled()
    before, cancelled = free_blocks(smol.engine), smol.server.bridge.cancelled
    body = {"model": "smol", "prompt": "Once upon a time", "max_tokens": 300, "stream": True}
    with httpx.stream("POST", f"{smol.url}/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(4)]
        assert any(line.startswith("data: {") for line in got)
        assert smol.server.bridge.calls_in_flight == 1
    smol.settled(timeout=20)
    assert smol.server.bridge.cancelled == cancelled + 1
    assert free_blocks(smol.engine) == before


def test_a_client_that_gives_up_on_a_whole_reply_cancels_its_call(smol):
    smol.settled()
    before, cancelled = free_blocks(smol.engine), smol.server.bridge.cancelled
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{smol.url}/v1/completions", json={"model": "smol", "prompt": "Once upon a time",
                                                      "max_tokens": 300}, timeout=httpx.Timeout(60, read=1.0))
    smol.settled(timeout=20)
    assert smol.server.bridge.cancelled == cancelled + 1
    assert free_blocks(smol.engine) == before


def test_a_full_server_answers_429_and_recovers(smol_engine, no_gc):
    s = LiveServer(smol_engine, model_name="smol", max_calls=1)
    try:
        # Greedy: 480 tokens without an end of text (sampled, a reply could end before the
        # second request arrives and free its slot; after tests/stress it did). The second
        # request's client is made first, so it goes out as soon as the first reply starts
        # (CI once saw the first reply's slot free before it; the check below says so if again).
        client = s.client()
        body = {"model": "smol", "prompt": "Once upon a time", "max_tokens": 480, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{s.url}/v1/completions", json=body, timeout=120) as r:
            next(r.iter_lines())
            assert s.server.bridge.calls_in_flight == 1, "the first reply ended before the second request went out"
            with pytest.raises(openai.RateLimitError) as e:
                client.completions.create(model="smol", prompt="x", max_tokens=2)
            assert e.value.response.headers["retry-after"] == "1"
        s.settled()
        assert s.client().completions.create(model="smol", prompt="x", max_tokens=2).choices[0].finish_reason
    finally:
        s.close()


def test_many_bad_requests_while_good_ones_run(tiny):
    """Refusals do not disturb replies in flight."""
    expected = tiny.client().completions.create(model="tiny", prompt="stay", max_tokens=16).choices[0].text
    result = {}

    def good():
        result["text"] = tiny.client().completions.create(model="tiny", prompt="stay", max_tokens=16).choices[0].text

    t = threading.Thread(target=good)
    t.start()
    for _ in range(20):
        assert post(tiny, "/v1/completions", b"]]").status_code == 400
        assert post(tiny, "/v1/completions", {"model": "tiny", "prompt": "x", "top_p": 7}).status_code == 400
    t.join(timeout=120)
    assert result["text"] == expected


def test_a_reply_that_fails_is_a_500_and_the_server_goes_on(tiny, monkeypatch):
    class Broken:  # a detokenizer that fails on the first token
        def add(self, token):
            raise RuntimeError("the detokenizer broke")

        def flush(self):
            return ""

    monkeypatch.setattr(tiny.engine.tokenizer, "detokenizer", lambda **kw: Broken())
    err = assert_error(post(tiny, "/v1/completions", {"model": "tiny", "prompt": "abc", "max_tokens": 5}), 500)
    assert "the detokenizer broke" in err["message"] and err["type"] == "server_error"
    monkeypatch.undo()
    tiny.settled()
    assert tiny.client().completions.create(model="tiny", prompt="abc", max_tokens=3).choices[0].finish_reason
