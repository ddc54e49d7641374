"""Tool calling through the real `openai` client on the default model (the generic
format of metalkv.tools: the tools in a system message, the reply held to a JSON schema
and parsed back into tool_calls): forced and named calls validate against the tool's
parameters (jsonschema), "auto" gives either shape, streamed deltas rebuild the same
calls, and a conversation goes on after a tool's result."""
from __future__ import annotations

import pytest

from .conftest import needs_server_packages
from .tool_templates import ASK, TIME, WEATHER, check_calls

needs_server_packages()
pytest.importorskip("jsonschema", reason="the test extra's jsonschema is not installed")


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_forced_call_validates_against_the_tools_parameters(smol, choice):
    r = smol.client().chat.completions.create(model="smol", messages=ASK, tools=[WEATHER, TIME], tool_choice=choice,
                                              max_tokens=120, temperature=0)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    check_calls(c.message.tool_calls, [WEATHER, TIME])
    if isinstance(choice, dict):
        assert {t.function.name for t in c.message.tool_calls} == {"get_weather"}


def test_auto_gives_a_call_or_an_answer_and_the_stream_the_same(smol):
    client = smol.client()
    kw = dict(model="smol", messages=ASK, tools=[WEATHER], max_tokens=120, temperature=0)
    whole = client.chat.completions.create(**kw).choices[0]
    calls, text, reasons = {}, [], []
    for chunk in client.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            text.append(ch.delta.content or "")
            for d in ch.delta.tool_calls or []:
                calls.setdefault(d.index, [d.function.name, ""])[1] += d.function.arguments or ""
            reasons.append(ch.finish_reason)
    if whole.message.tool_calls:
        check_calls(whole.message.tool_calls, [WEATHER])
        assert whole.finish_reason == "tool_calls" and reasons[-1] == "tool_calls"
        assert [[t.function.name, t.function.arguments] for t in whole.message.tool_calls] == \
            [calls[k] for k in sorted(calls)]
    else:
        assert whole.finish_reason == "stop" and isinstance(whole.message.content, str)
        assert "".join(text) == whole.message.content


def test_the_conversation_goes_on_after_a_tools_result(smol):
    client = smol.client()
    first = client.chat.completions.create(model="smol", messages=ASK, tools=[WEATHER], tool_choice="required",
                                           max_tokens=120, temperature=0).choices[0].message
    call = first.tool_calls[0]
    messages = ASK + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                      {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18, "sky": "clear"}'}]
    r = client.chat.completions.create(model="smol", messages=messages, tools=[WEATHER], tool_choice="none",
                                       max_tokens=30, temperature=0)
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content
