"""Chat messages with images and audio (metalkv.messages): OpenAI's parts and transformers' kept
in order as the template's parts, their sources listed apart; a text model refusing them by
name; media only where Gemma's templates and OpenAI's API put it (user messages)."""
from __future__ import annotations

import pytest

from metalkv import ArgumentError
from metalkv.messages import Conversation, MediaPart, media_parts, normalize
from metalkv.models.chat import ChatTemplate

B64 = "UklGRg=="  # (not read here: the media layer reads sources)
MIXED = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
        {"type": "text", "text": "Compare "},
        {"type": "image_url", "image_url": "photo.jpg"},
        {"type": "input_audio", "input_audio": {"data": B64, "format": "wav"}},
        {"type": "image", "path": "/tmp/b.png"},
        {"type": "audio", "url": "file:///tmp/c.wav"},
        {"type": "text", "text": "with this."},
    ]},
    {"role": "assistant", "content": "They differ."},
    {"role": "user", "content": [{"type": "text", "text": "How?"}, {"type": "image", "image": b"\x89PNG"}]},
]


def test_parts_are_kept_in_order_and_sources_listed_apart():
    out = normalize(MIXED, media=True)
    assert out[0] == {"role": "system", "content": "Be brief."}
    assert out[1]["content"] == [{"type": "image"}, {"type": "text", "text": "Compare "}, {"type": "image"},
                                 {"type": "audio"}, {"type": "image"}, {"type": "audio"},
                                 {"type": "text", "text": "with this."}]
    assert out[2] == {"role": "assistant", "content": "They differ."}
    assert out[3]["content"] == [{"type": "text", "text": "How?"}, {"type": "image"}]
    assert media_parts(MIXED) == [
        MediaPart("image", "data:image/png;base64,AAAA", "messages[1].content[0]"),
        MediaPart("image", "photo.jpg", "messages[1].content[2]"),
        MediaPart("audio", {"data": B64, "format": "wav"}, "messages[1].content[3]"),
        MediaPart("image", "/tmp/b.png", "messages[1].content[4]"),
        MediaPart("audio", "file:///tmp/c.wav", "messages[1].content[5]"),
        MediaPart("image", b"\x89PNG", "messages[3].content[1]"),
    ]
    conversation = Conversation(MIXED, media=True)
    assert conversation.messages == out and conversation.media == media_parts(MIXED)


def test_text_only_messages_are_as_before():
    """Text parts alone are joined into one str, with or without media, as for a text model."""
    text = [{"role": "developer", "content": "Hi."},
            {"role": "user", "content": [{"type": "text", "text": "a "}, {"type": "text", "text": "b"}]}]
    want = [{"role": "system", "content": "Hi."}, {"role": "user", "content": "a b"}]
    assert normalize(text) == normalize(text, media=True) == want
    assert media_parts(text) == [] and Conversation(text).media == []


def test_the_template_gets_the_parts():
    source = ("{% for m in messages %}{{ m.role }}:{% if m.content is string %}{{ m.content }}{% else %}"
              "{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% else %}<{{ p.type }}>{% endif %}"
              "{% endfor %}{% endif %}|{% endfor %}")
    rendered = ChatTemplate(source).render(normalize(MIXED, media=True), add_generation_prompt=False)
    assert rendered == ("system:Be brief.|user:<image>Compare <image><audio><image><audio>with this.|"
                        "assistant:They differ.|user:How?<image>|")


@pytest.mark.parametrize("part, says", [
    ({"type": "image_url", "image_url": {"url": "a.png"}},
     "messages[0].content[1]: this model reads text only; images need a model whose vision tower metalkv runs "
     "(Gemma 3 4B and up, Gemma 3n)"),
    ({"type": "image", "path": "a.png"}, "this model reads text only; images need a model whose vision tower"),
    ({"type": "input_audio", "input_audio": {"data": B64, "format": "wav"}},
     "this model reads text only; audio needs a model with an audio tower (Gemma 3n)"),
    ({"type": "video"}, "messages[0].content[1]: only 'text' parts are supported (this model reads text), got "
                        "type 'video'"),
])
def test_a_text_model_refuses_media_saying_which_models_read_it(part, says):
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"}, part]}]
    with pytest.raises(ArgumentError) as e:
        normalize(messages)
    assert says in str(e.value) and e.value.argument == "messages"


def test_a_vision_model_refuses_audio_by_name():
    messages = [{"role": "user", "content": [{"type": "audio", "path": "a.wav"}]}]
    with pytest.raises(ArgumentError, match=r"messages\[0\].content\[0\]: this model reads text and images; audio "
                                            r"needs a model with an audio tower \(Gemma 3n\)"):
        normalize(messages, media=("image",))
    assert normalize(messages, media=("audio",))[0]["content"] == [{"type": "audio"}]


@pytest.mark.parametrize("message, says", [
    ({"role": "system", "content": [{"type": "image_url", "image_url": "a.png"}]},
     "messages[0].content[0]: images go in user messages, not system messages (Gemma's templates keep only "
     "the text of a system message; a reply is text)"),
    ({"role": "developer", "content": [{"type": "image", "path": "a.png"}]},
     "images go in user messages, not developer messages"),
    ({"role": "assistant", "content": [{"type": "input_audio", "input_audio": {"data": B64, "format": "wav"}}]},
     "audio clips go in user messages, not assistant messages"),
])
def test_media_outside_user_messages_is_refused(message, says):
    with pytest.raises(ArgumentError) as e:
        normalize([message], media=True)
    assert says in str(e.value)


@pytest.mark.parametrize("part, says", [
    ({"type": "image_url"}, "content[0].image_url: {'url': a data URL, a path, a file:// or http(s) URL}, or that "
                            "URL as a str; got None"),
    ({"type": "image_url", "image_url": {"url": ""}}, "content[0].image_url: {'url'"),
    ({"type": "image_url", "image_url": {"link": "a.png"}}, "content[0].image_url: {'url'"),
    ({"type": "input_audio", "input_audio": "a.wav"}, "content[0].input_audio: {'data': the file's bytes in base64, "
                                                      "'format': 'wav'}"),
    ({"type": "input_audio", "input_audio": {"data": B64}}, "content[0].input_audio: {'data'"),
    ({"type": "image"}, "content[0]: an image part needs its source under 'image' or 'url' or 'path'"),
    ({"type": "audio", "base64": B64}, "content[0]: an audio part needs its source under 'audio' or 'url' or 'path'"),
    ({"type": "video", "path": "v.mp4"}, "content[0]: a part's type is one of 'text', 'image_url', 'input_audio', "
                                         "'image', 'audio'; got 'video'"),
    ({"type": "text", "text": 3}, "content[0].text: a text part needs a str 'text'"),
    ("photo.jpg", "content[0]: a content part is an object, got str"),
])
def test_malformed_parts_are_refused_by_path(part, says):
    with pytest.raises(ArgumentError) as e:
        normalize([{"role": "user", "content": [part]}], media=True)
    assert f"messages[0].{says}" in str(e.value)


def test_media_must_name_kinds():
    with pytest.raises(ArgumentError, match=r"\[chat\] media=\('video',\): expected True, False, or kinds"):
        normalize([{"role": "user", "content": "hi"}], media=("video",))
