"""Which request fields the server takes: every field OpenAI defines (its own answer where
metalkv cannot honour one), vLLM's sampling extensions, and for anything else OpenAI's
400, "Unrecognized request argument supplied: ...", so a misspelt field is not silently
a default. And error messages that name their field once."""
from __future__ import annotations

import pytest

from .conftest import needs_server_packages

needs_server_packages()
import httpx  # noqa: E402
import openai  # noqa: E402

from metalkv.server import protocol as proto  # noqa: E402

HELLO = [{"role": "user", "content": "hello"}]


def _fields(typed_dict) -> set[str]:
    return {k for base in typed_dict.__mro__ for k in getattr(base, "__annotations__", {})}


def test_every_field_openai_defines_is_known():
    """openai-python's request types are OpenAI's list; a field it adds shows up here."""
    from openai.types import completion_create_params
    from openai.types.chat import completion_create_params as chat_params

    assert _fields(chat_params.CompletionCreateParamsBase) | {"stream"} <= proto.CHAT_FIELDS
    assert _fields(completion_create_params.CompletionCreateParamsBase) | {"stream"} <= proto.COMPLETION_FIELDS


def test_unknown_fields_are_openais_400(tiny):
    client = tiny.client()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=2, extra_body={"max_token": 5})
    assert e.value.body["message"] == "Unrecognized request argument supplied: max_token"
    assert e.value.body["type"] == "invalid_request_error" and e.value.body["param"] is None
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="hi", max_tokens=2, extra_body={"foo": 1, "bar": None})
    assert e.value.body["message"] == "Unrecognized request arguments supplied: bar, foo"
    # a chat field is not a completions field (and the reverse)
    r = httpx.post(f"{tiny.url}/v1/completions", json={"prompt": "hi", "max_completion_tokens": 2}, timeout=60)
    assert r.status_code == 400 and "max_completion_tokens" in r.json()["error"]["message"]
    r = httpx.post(f"{tiny.url}/v1/chat/completions", json={"messages": HELLO, "echo": True}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["message"].endswith("supplied: echo")


def test_fields_openai_defines_keep_their_answer(tiny):
    client = tiny.client()
    # taken (they change nothing here) ...
    r = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=2, user="u1", store=False,
                                       metadata={"k": "v"}, parallel_tool_calls=False, service_tier="auto",
                                       extra_body={"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1})
    assert r.choices[0].finish_reason in ("length", "stop")
    r = client.completions.create(model="tiny", prompt="hi", max_tokens=2, user="u1", best_of=1,
                                  extra_body={"top_k": 5})
    assert r.choices[0].finish_reason in ("length", "stop")
    # ... and refused by name as before
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=HELLO, functions=[{"name": "f"}])
    assert e.value.body["param"] == "functions"


@pytest.mark.parametrize("path, body, starts", [
    ("/v1/chat/completions", {"messages": "hello"}, "messages: a non-empty list"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role: one of"),
    ("/v1/chat/completions", {"messages": HELLO, "top_p": 0}, "top_p=0"),
    ("/v1/completions", {"prompt": "hi", "repetition_penalty": 0}, "repetition_penalty=0"),
    ("/v1/completions", {"prompt": "hi", "temperature": "hot"}, "temperature: expected a number"),
])
def test_an_error_names_its_field_once(tiny, path, body, starts):
    err = httpx.post(f"{tiny.url}{path}", json=body, timeout=60).json()["error"]
    assert err["message"].startswith(starts), err
    field = starts.split(":")[0].split("=")[0].split("[")[0]
    assert err["message"].count(field) == 1 and "[chat]" not in err["message"], err


def test_bad_names_the_field_once():
    assert proto.bad("messages", "[chat] messages: a list").message == "messages: a list"
    assert proto.bad("top_p", "[engine] top_p=0.0: expected (0, 1]").message == "top_p=0.0: expected (0, 1]"
    assert proto.bad("n", "expected an integer").message == "n: expected an integer"
    assert proto.bad("stop", "stops: too many").message == "stop: stops: too many"  # another word, not the field


@pytest.mark.parametrize("body, message", [
    ({"prompt": ["hi", 5]}, "prompt[1]: expected a non-empty string or a list of token ids"),
    ({"prompt": "hi", "echo": True, "logprobs": 1}, "echo: not with logprobs"),
    ({"prompt": [1, 2], "echo": True}, "echo: needs text prompts"),
])
def test_completion_errors_name_their_field_once(tiny, body, message):
    err = httpx.post(f"{tiny.url}/v1/completions", json=body, timeout=60).json()["error"]
    assert err["message"].startswith(message), err
