"""Images and audio on the command line: generate's --image/--audio and chat's /image, /audio.
Files are checked before the model loads; they reach Engine.chat_stream as content parts before
the text; a text model's refusal names the flag. The model is a tiny byte-vocabulary llama
(random weights, ChatML): only the plumbing matters here."""
from __future__ import annotations

import io
import os
import re

import pytest

import metalkv
from metalkv import cli

TEXT_ONLY = "this model reads text only; images need a model whose vision tower metalkv runs (Gemma 3 4B and up, Gemma 3n)"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from models.tiny import TINY_VOCAB, write_gguf  # tests/ is on sys.path

    f = tmp_path_factory.mktemp("cli_media") / "tiny.gguf"
    write_gguf(f, tokenizer=TINY_VOCAB, hidden=128, n_heads=2, n_kv_heads=1, head_dim=64, ffn=64, vocab=64)
    return ["--model", str(f), "--device", "host", "--context", "256", "--max-tokens", "3"]


@pytest.fixture
def files(tmp_path):
    (tmp_path / "photo.png").write_bytes(b"\x89PNG not read by the CLI")
    (tmp_path / "clip.wav").write_bytes(b"RIFF not read by the CLI")
    return str(tmp_path / "photo.png"), str(tmp_path / "clip.wav")


@pytest.fixture
def sent(monkeypatch):
    """Engine.chat_stream, recording the messages it is given and answering them as text (each
    media part written as '[image]' or '[audio]', for this text model)."""
    calls = []
    real = metalkv.Engine.chat_stream

    def as_text(messages):
        def text(c):
            return c if isinstance(c, str) else "".join(
                p["text"] if p["type"] == "text" else f"[{'image' if p['type'] == 'image_url' else 'audio'}]"
                for p in c)
        return [dict(m, content=text(m["content"])) for m in messages]

    def chat_stream(self, messages, **options):
        calls.append(messages)
        return real(self, as_text(messages), **options)

    monkeypatch.setattr(metalkv.Engine, "chat_stream", chat_stream)
    return calls


def test_flags_keep_their_order():
    args = cli._parser().parse_args(["generate", "hi", "--image", "a.png", "--audio", "b.wav", "--image", "c.png"])
    assert args.media == [("image", "a.png"), ("audio", "b.wav"), ("image", "c.png")]
    assert cli._parser().parse_args(["generate", "hi"]).media is None


def test_files_are_checked_before_the_model_loads(tmp_path, files, capsys):
    base = ["generate", "hi", "--model", "/nonexistent/m.gguf", "--device", "host"]
    for flags, says in [(["--image", str(tmp_path / "nope.jpg")], f"--image {tmp_path / 'nope.jpg'}: no such file"),
                        (["--audio", files[1], "--audio", str(tmp_path)], f"--audio {tmp_path}: is a folder; give an "
                                                                          f"audio file"),
                        (["--image", files[0], "--no-chat"], "--image needs the chat template (the files go in a "
                                                             "user message, as content parts); drop --no-chat")]:
        assert cli.main(base + flags) == 2
        err = capsys.readouterr().err
        assert err == f"metalkv: error: {says}\n", err  # one line, and not the missing model


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_file_is_named(files, capsys):
    os.chmod(files[0], 0)
    assert cli.main(["generate", "hi", "--model", "/nonexistent/m.gguf", "--image", files[0]]) == 2
    assert f"--image {files[0]}: cannot read it (Permission denied)" in capsys.readouterr().err


def test_generate_sends_the_files_before_the_text(tiny, files, sent, capsys):
    assert cli.main(["generate", "What is in them?", "--system", "Be brief.", "--image", files[0],
                     "--audio", files[1]] + tiny) == 0
    assert sent == [[{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": [{"type": "image_url", "image_url": {"url": files[0]}},
                                                  {"type": "audio", "path": files[1]},
                                                  {"type": "text", "text": "What is in them?"}]}]]
    assert "finish:" in capsys.readouterr().err


def test_a_text_model_refuses_an_image_naming_the_flag(tiny, files, capsys):
    assert cli.main(["generate", "What is this?", "--image", files[0]] + tiny) == 2
    assert capsys.readouterr().err == f"metalkv: error: --image {files[0]}: {TEXT_ONLY}\n"
    assert cli.main(["generate", "What is this?", "--audio", files[1]] + tiny) == 2
    assert capsys.readouterr().err == (f"metalkv: error: --audio {files[1]}: this model reads text only; audio needs "
                                       f"a model with an audio tower (Gemma 3n)\n")


def test_engine_chat_and_chat_ids_refuse_media_on_a_text_model(tiny):
    engine = metalkv.Engine.load(tiny[1], device="host", context=64, progress=False)
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"},
                                             {"type": "image_url", "image_url": {"url": "photo.png"}}]}]
    for call in (engine.chat, engine.chat_stream, engine.chat_ids):
        with pytest.raises(metalkv.ArgumentError) as e:
            call(messages)
        assert str(e.value) == f"[chat] messages[0].content[1]: {TEXT_ONLY}" and e.value.argument == "messages"
    assert engine.media_limits == metalkv.media.MediaLimits()


def chat(monkeypatch, tiny, lines: list[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(lines + ["/exit", ""])))
    assert cli.main(["chat"] + tiny) == 0


def test_chat_attachments_wait_for_the_next_message(monkeypatch, tiny, files, sent, capsys):
    photo, clip = files
    quoted = "'" + photo + "'"  # as a terminal pastes a dropped file
    chat(monkeypatch, tiny, [f"/image {quoted}", "/image nope.jpg", "/audio", f"/audio {clip}", "What are these?",
                             "And now?"])
    err = capsys.readouterr().err
    assert "[attached photo.png; for your next message: photo.png]" in err
    assert "[/image nope.jpg: no such file]" in err
    assert "[/audio needs a file: /audio clip.wav]" in err
    assert "[attached clip.wav; for your next message: photo.png, clip.wav]" in err
    first, second = sent
    assert first[-1] == {"role": "user", "content": [{"type": "image_url", "image_url": {"url": photo}},
                                                     {"type": "audio", "path": clip},
                                                     {"type": "text", "text": "What are these?"}]}
    assert second[:1] == first[-1:] and second[1]["role"] == "assistant"  # the files stay with their message
    assert second[2] == {"role": "user", "content": "And now?"}  # sent once: the next message has none
    assert len(re.findall(r"\[\d+ prompt tokens", err)) == 2


def test_chat_on_a_text_model_says_why_and_goes_on(monkeypatch, tiny, files, capsys):
    chat(monkeypatch, tiny, [f"/image {files[0]}", "What is this?", "hello", f"/image {files[0]}", "/reset"])
    err = capsys.readouterr().err
    assert f"[/image {files[0]}: {TEXT_ONLY}; photo.png dropped]" in err
    assert len(re.findall(r"\[\d+ prompt tokens", err)) == 1  # "hello" was answered
    assert "[conversation cleared, photo.png dropped]" in err
