"""Engine.chat / chat_stream: OpenAI-shaped messages through the model's chat template.
The reference is the template itself (ChatTemplate.render, tested against transformers in
tests/models/test_chat.py) fed as token ids through generate, and generate's own chat turns."""
from __future__ import annotations

import pytest

import metalkv

MESSAGES = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Name a fruit."}]


def test_chat_is_the_rendered_template_fed_as_ids(engine):
    ids = engine.tokenizer.encode(engine.chat_template.render(MESSAGES, add_generation_prompt=True))
    assert engine.chat_ids(MESSAGES) == ids
    assert engine.chat(MESSAGES, max_tokens=10) == engine.generate(ids, max_tokens=10)
    # ... and what generate's own chat turn makes of the same conversation
    assert engine.chat(MESSAGES, max_tokens=10) == engine.generate("Name a fruit.", system="You are brief.",
                                                                    max_tokens=10)


def test_text_parts_and_developer_role(engine):
    parts = [{"role": "developer", "content": "You are brief."},
             {"role": "user", "content": [{"type": "text", "text": "Name a "}, {"type": "text", "text": "fruit."}]}]
    assert engine.chat_ids(parts) == engine.chat_ids(MESSAGES)


def test_chat_stream_is_chat_in_pieces(engine):
    pieces = list(engine.chat_stream(MESSAGES, max_tokens=12))
    assert len(pieces) > 1 and "".join(pieces) == engine.chat(MESSAGES, max_tokens=12)


def test_chat_with_a_cache_feeds_only_what_is_new(engine):
    cache = engine.new_cache()
    first = engine.chat(MESSAGES, cache=cache, max_tokens=8)
    assert cache.messages == MESSAGES + [{"role": "assistant", "content": first}]
    follow = cache.messages + [{"role": "user", "content": "Another one."}]
    second = engine.chat(follow, cache=cache, max_tokens=8)
    fed = engine.last_stats["prompt_tokens"]
    assert fed < len(engine.chat_ids(follow)) // 2  # the cache held the first turn
    assert second == engine.chat(follow, max_tokens=8)  # what the whole conversation gets from nothing
    assert cache.messages[-1] == {"role": "assistant", "content": second}


@pytest.mark.parametrize("messages, says", [
    ("hello", "non-empty list"),
    ([], "non-empty list"),
    ([{"role": "robot", "content": "x"}], "messages[0].role"),
    ([{"role": "tool", "content": "x"}], "tools are not supported"),
    ([{"role": "user", "content": [{"type": "image_url"}]}], "this model reads text only; images need a model"),
    ([{"role": "user", "content": [{"type": "video"}]}], "only 'text' parts"),
    ([{"role": "user"}], "needs content"),
    ([{"role": "assistant", "content": "", "tool_calls": [{"id": "1"}]}], "tool calls"),
    (["user: hi"], "messages[0]"),
])
def test_bad_messages_are_refused_by_name(engine, messages, says):
    with pytest.raises(metalkv.ArgumentError, match=None) as e:
        engine.chat(messages, max_tokens=2)
    assert says in str(e.value) and e.value.argument == "messages"
