"""Tool calling in a template's own format, end to end through the real `openai` client:
the default model served with a Hermes-style template that takes tools
(tool_templates.HERMES, given as `--chat-template` would give it). The tools reach the
prompt through the template, forced and named calls come back as tool_calls whose
arguments validate against the tool's parameters (jsonschema), a streamed reply rebuilds
the same calls from its deltas, and the conversation goes on after a tool's result,
written by the template."""
from __future__ import annotations

import pytest

import metalkv

from .conftest import TEST_DEVICE, LiveServer, needs_server_packages
from .tool_templates import ASK, HERMES, TIME, WEATHER, check_calls

needs_server_packages()
pytest.importorskip("jsonschema", reason="the test extra's jsonschema is not installed")



@pytest.fixture(scope="module")
def hermes(tmp_path_factory):
    from metalkv.cli import chat_template_file
    from metalkv.models import ModelNotFoundError, default_model_path, load_model

    try:
        loaded = load_model(default_model_path())
    except ModelNotFoundError:
        pytest.skip("the default model is not installed")
    f = tmp_path_factory.mktemp("template") / "hermes.jinja"
    f.write_text(HERMES)
    loaded.chat_template = chat_template_file(str(f), loaded.chat_template)
    s = LiveServer(metalkv.Engine.load(loaded, device=TEST_DEVICE, context=768, progress=False), model_name="h")
    yield s
    s.close()


def test_the_server_uses_the_templates_format(hermes):
    fmt = hermes.server.tool_format
    assert fmt is not None and fmt.prefix == "<tool_call>\n" and fmt.args_key == "arguments"
    eng = hermes.engine
    prompt = eng.tokenizer.decode(eng.chat_ids(ASK, [WEATHER]))
    assert '"name": "get_weather"' in prompt and "<tool_call>" in prompt  # the template wrote the tools


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_a_forced_call_in_the_templates_format(hermes, choice):
    kw = dict(model="h", messages=ASK, tools=[WEATHER, TIME], tool_choice=choice, max_tokens=120, temperature=0)
    client = hermes.client()
    c = client.chat.completions.create(**kw).choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    check_calls(c.message.tool_calls, [WEATHER, TIME])
    if isinstance(choice, dict):
        assert {t.function.name for t in c.message.tool_calls} == {"get_time"}
    streamed, reasons = {}, []
    for chunk in client.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            assert not ch.delta.content
            for d in ch.delta.tool_calls or []:
                streamed.setdefault(d.index, [d.function.name, ""])[1] += d.function.arguments or ""
            reasons.append(ch.finish_reason)
    assert reasons[-1] == "tool_calls"
    assert [streamed[k] for k in sorted(streamed)] == \
        [[t.function.name, t.function.arguments] for t in c.message.tool_calls]


def test_auto_streams_an_answer_as_it_comes(hermes):
    client = hermes.client()
    kw = dict(model="h", messages=[{"role": "user", "content": "Say hello."}], tools=[WEATHER], max_tokens=24,
              temperature=0)
    whole = client.chat.completions.create(**kw).choices[0]
    pieces = [ch.delta.content for chunk in client.chat.completions.create(stream=True, **kw)
              for ch in chunk.choices if ch.delta.content]
    if whole.message.tool_calls:
        check_calls(whole.message.tool_calls, [WEATHER])
        assert not pieces
    else:
        assert "".join(pieces) == whole.message.content and len(pieces) > 1  # piece by piece


@pytest.mark.parametrize("choice", ["auto", "none"])
def test_the_conversation_goes_on_after_a_tools_result(hermes, choice):
    client = hermes.client()
    first = client.chat.completions.create(model="h", messages=ASK, tools=[WEATHER], tool_choice="required",
                                           max_tokens=120, temperature=0).choices[0].message
    call = first.tool_calls[0]
    messages = ASK + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                      {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18, "sky": "clear"}'}]
    prompt = hermes.engine.tokenizer.decode(hermes.engine.chat_ids(messages, [WEATHER]))
    assert "<tool_response>\n{\"temperature\": 18" in prompt and call.function.name in prompt
    r = client.chat.completions.create(model="h", messages=messages, tools=[WEATHER], tool_choice=choice,
                                       max_tokens=30, temperature=0).choices[0]
    assert r.message.content or r.message.tool_calls
    if choice == "none":
        assert r.message.tool_calls is None


def test_bad_tool_turns_are_refused_by_name(hermes):
    import openai

    bad = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "x", "type": "function", "function": {"name": "get_weather", "arguments": "{not json"}}]}]
    with pytest.raises(openai.BadRequestError) as e:
        hermes.client().chat.completions.create(model="h", messages=bad, tools=[WEATHER], max_tokens=8)
    assert "messages[1].tool_calls[0].function.arguments" in str(e.value)
