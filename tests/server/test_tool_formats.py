"""Tool calls in a chat template's own format (metalkv.tool_formats): the format read
from templates written the three ways models call tools (tool_templates.py); the grammar
built from it, run by llguidance over the default model's vocabulary, takes the calls as
the template writes them and refuses what breaks the format or a tool's parameters; the
reply parsed back, whole and streamed (metalkv.tools.ReplyStream)."""
from __future__ import annotations

import json

import pytest

from metalkv.models.chat import ChatTemplate
from metalkv.tool_formats import NativeFormat
from metalkv.tools import ReplyStream, Tools

from .tool_templates import CONTROL_LIST, HERMES, LLAMA_JSON

llguidance = pytest.importorskip("llguidance")

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALLS = [{"id": "a1b2c3d4e", "type": "function", "function": {"name": "get_weather",
                                                            "arguments": {"city": "Paris", "unit": "c"}}},
         {"id": "f5g6h7i8j", "type": "function", "function": {"name": "get_time", "arguments": {"city": "Oslo"}}}]


@pytest.fixture(scope="module")
def smol():
    from metalkv.models import ModelNotFoundError, default_model_path, load_model

    try:
        return load_model(default_model_path())
    except ModelNotFoundError:
        pytest.skip("the default model is not installed")


def written(template: ChatTemplate, calls: list) -> str:
    """The assistant turn's calls as the template writes them (between the generation
    prompt and the end of the turn)."""
    user = [{"role": "user", "content": "q"}]
    gen = str(template.render(user, add_generation_prompt=True, tools=[WEATHER, TIME]))
    text = str(template.render(user + [{"role": "assistant", "content": "", "tool_calls": calls}],
                               add_generation_prompt=False, tools=[WEATHER, TIME]))
    assert text.startswith(gen)
    return text[len(gen):].rsplit("<|im_end|>", 1)[0]


def test_the_format_is_read_from_the_template():
    assert NativeFormat.of_template(ChatTemplate(HERMES)) == NativeFormat(
        "<tool_call>\n", "\n</tool_call>\n<tool_call>\n", "\n</tool_call>", "arguments")
    # one call a turn (the template refuses two): no separator
    assert NativeFormat.of_template(ChatTemplate(LLAMA_JSON)) == NativeFormat("", None, "", "parameters")
    assert NativeFormat.of_template(ChatTemplate(CONTROL_LIST)) == NativeFormat(
        "<jupyter_code>[", ", ", "]", "arguments")


def test_a_template_without_tools_has_no_native_format(smol):
    assert NativeFormat.of_template(smol.chat_template) is None       # the default model's
    assert NativeFormat.of_template(ChatTemplate(None)) is None        # the ChatML fallback
    # it takes tools but writes calls as no JSON object: generic
    odd = HERMES.replace('{{ {"name": c.function.name, "arguments": c.function.arguments} | tojson }}',
                         "{{ c.function.name }}()")
    assert NativeFormat.of_template(ChatTemplate(odd)) is None


def tools_of(source: str, smol, choice="auto", parallel=None, tools=(WEATHER, TIME)) -> Tools:
    return Tools.of(list(tools), choice, parallel).using(NativeFormat.of_template(ChatTemplate(source)),
                                                         smol.tokenizer)


def accepts(tools: Tools, smol, text: str) -> bool:
    """Whether the tools' grammar takes text whole (as the model's ids would spell it)."""
    from metalkv import constrain

    grammar = tools.constraint()["grammar"]
    m = llguidance.LLMatcher(constrain.llg_tokenizer(smol), grammar.compiled, log_level=0)
    ids = smol.tokenizer.encode(text, add_special=False, parse_special=True)
    if m.validate_tokens(ids) != len(ids):
        return False
    m.consume_tokens(ids)
    return m.is_accepting()


@pytest.mark.parametrize("source", [HERMES, LLAMA_JSON, CONTROL_LIST], ids=["hermes", "llama-json", "control-list"])
def test_the_grammar_takes_calls_as_the_template_writes_them(smol, source):
    t = ChatTemplate(source)
    one = written(t, CALLS[:1])
    auto, required = tools_of(source, smol), tools_of(source, smol, "required")
    assert accepts(auto, smol, one) and accepts(required, smol, one)
    named = tools_of(source, smol, {"type": "function", "function": {"name": "get_time"}})
    assert not accepts(named, smol, one)                               # not the named tool
    bad = one.replace('"unit": "c"', '"unit": "kelvin"')
    assert not accepts(auto, smol, bad)                                # outside the parameters
    assert not accepts(auto, smol, one.replace("get_weather", "get_wether"))  # no such tool
    answer = "It is sunny in Paris."
    assert accepts(auto, smol, answer) and not accepts(required, smol, answer)
    if NativeFormat.of_template(t).sep is not None:
        two = written(t, CALLS)
        assert accepts(auto, smol, two)
        assert not accepts(tools_of(source, smol, parallel=False), smol, two)


def test_an_answer_may_not_begin_as_a_call_does(smol):
    auto = tools_of(HERMES, smol)
    assert not accepts(auto, smol, "<tool_call> is what I would write")
    assert not accepts(tools_of(LLAMA_JSON, smol), smol, '{"a": 1}')


@pytest.mark.parametrize("source", [HERMES, LLAMA_JSON, CONTROL_LIST], ids=["hermes", "llama-json", "control-list"])
def test_a_reply_is_parsed_back_into_tool_calls_whole_and_streamed(smol, source):
    t = ChatTemplate(source)
    tools = tools_of(source, smol)
    calls = CALLS if NativeFormat.of_template(t).sep is not None else CALLS[:1]
    # the reply's text as the engine gives it: control tokens are not text
    ids = smol.tokenizer.encode(written(t, calls), add_special=False, parse_special=True)
    text = smol.tokenizer.decode(ids, skip_special=True)
    want = [(c["function"]["name"], c["function"]["arguments"]) for c in calls]
    content, got = tools.reply(text)
    assert content is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got] == want
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in got)
    stream = ReplyStream(tools)
    deltas = [d for k in range(0, len(text), 3) for d in stream.feed(text[k:k + 3])] + stream.finish()
    assert all("content" not in d for d in deltas) and stream.called
    streamed = [c for d in deltas for c in d["tool_calls"]]
    assert [c["index"] for c in streamed] == list(range(len(calls)))
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in streamed] == want


def test_an_answer_streams_as_it_comes_and_a_cut_call_is_content(smol):
    tools = tools_of(HERMES, smol)
    stream = ReplyStream(tools)
    assert stream.feed(" ") == []                                     # not yet known
    assert stream.feed("It is") == [{"content": " It is"}]
    assert stream.feed(" sunny.") == [{"content": " sunny."}]
    assert stream.finish() == [] and not stream.called
    cut = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'
    assert tools.reply(cut) == (cut, [])                               # max_tokens cut it: what came
