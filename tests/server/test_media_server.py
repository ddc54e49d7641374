"""Images and audio in /v1/chat/completions: OpenAI's content parts reach Engine.chat_ids as sent;
a text model answers 400 naming the part and the models that read it; a path to a file of the
server's is refused; `metalkv serve --allow-remote-media` turns fetching on in the engine's limits."""
from __future__ import annotations

import base64
import json

import pytest

from .conftest import free_port, needs_server_packages

needs_server_packages()
import httpx  # noqa: E402

from metalkv.media import MediaError, MediaLimits  # noqa: E402
from metalkv.server import protocol as proto  # noqa: E402

PNG_URL = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()
WAV = base64.b64encode(b"RIFF....WAVE").decode()
IMAGE = {"type": "image_url", "image_url": {"url": PNG_URL}}
AUDIO = {"type": "input_audio", "input_audio": {"data": WAV, "format": "wav"}}


def user(*parts) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, *parts]}]


def post_chat(server, messages) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/chat/completions", timeout=60,
                      content=json.dumps({"model": server.server.model_name, "messages": messages, "max_tokens": 2}),
                      headers={"content-type": "application/json"})


@pytest.mark.parametrize("part, says", [
    (IMAGE, "messages[0].content[1]: this model reads text only; images need a model whose vision tower metalkv "
            "runs (Gemma 3 4B and up, Gemma 3n)"),
    (AUDIO, "messages[0].content[1]: this model reads text only; audio needs a model with an audio tower (Gemma 3n)"),
    ({"type": "image_url", "image_url": "https://example.com/cat.png"}, "messages[0].content[1]: this model reads "
     "text only; images need a model whose vision tower metalkv runs (Gemma 3 4B and up, Gemma 3n)"),
])
def test_a_text_model_answers_400_naming_the_part(tiny, part, says):
    r = post_chat(tiny, user(part))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages" and err["type"] == "invalid_request_error" and err["message"] == says
    assert post_chat(tiny, [{"role": "user", "content": "hello"}]).status_code == 200  # and goes on serving


@pytest.mark.parametrize("part", [
    {"type": "image_url", "image_url": {"url": "/etc/hostname"}},
    {"type": "image_url", "image_url": "file:///etc/hostname"},
    {"type": "image", "path": "photo.jpg"},
    {"type": "audio", "url": "clip.wav"},
])
def test_a_file_of_the_server_is_refused_before_the_model_sees_it(tiny, part):
    r = post_chat(tiny, user(part))
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    assert "messages[0].content[1]: " in r.json()["error"]["message"]
    assert "names a file on the server, which a request may not read: send the file itself, as a data URL" \
        in r.json()["error"]["message"]


def test_content_parts_reach_chat_ids_as_sent():
    seen = []

    def chat_ids(messages, tools=None):
        seen.append(messages)
        return [1, 2, 3]

    remote = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png", "detail": "high"}}
    messages = [{"role": "system", "content": "Be brief."}, *user(IMAGE, AUDIO, remote)]
    job = proto.parse_chat({"messages": messages}, "m", chat_ids)
    assert seen == [messages] and job.prompts == [[1, 2, 3]]


def test_a_media_error_is_a_400_on_messages():
    def chat_ids(messages, tools=None):
        raise MediaError("[image] the data URL 'data:image/png;base64,...' (32 characters): not an image Pillow "
                         "can read")

    with pytest.raises(proto.ApiError) as e:
        proto.parse_chat({"messages": user(IMAGE)}, "m", chat_ids)
    assert e.value.status == 400 and e.value.param == "messages"
    assert e.value.message == ("messages: the data URL 'data:image/png;base64,...' (32 characters): not an image "
                               "Pillow can read")


@pytest.mark.parametrize("flag, allowed", [([], False), (["--allow-remote-media"], True)])
def test_serve_sets_the_engines_media_limits(tiny_engine, monkeypatch, flag, allowed):
    import metalkv.server
    from metalkv import cli

    served = []

    def serve(engine, *, sock, **options):
        sock.close()
        served.append(engine.media_limits)

    monkeypatch.setattr(metalkv.server, "serve", serve)
    model = str(tiny_engine.model_path)
    assert cli.main(["serve", "--model", model, "--device", "host", "--context", "64", "--port", str(free_port())]
                    + flag) == 0
    assert served == [MediaLimits(allow_remote=allowed)]
