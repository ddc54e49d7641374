"""A clip through every interface, on a tiny Gemma 3n checkpoint with an audio tower, a
tokenizer and a chat template (tests/models/tiny_audio.save_chat): Engine.chat with OpenAI's
input_audio part and a local path; the whole model's logits at every position against
Gemma3nForConditionalGeneration given the features transformers' own feature extractor
computes from the same samples (the clip's run, <end_of_audio> from the audio embedder, the
padding token's rows past the tower's output); chunked prefill; a repeated clip costs no
tower time and its blocks come from the prefix cache; metalkv generate --audio; the server."""
from __future__ import annotations

import base64
import wave

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import metalkv  # noqa: E402
from metalkv import cli  # noqa: E402
from metalkv.multimodal import MediaPrompt  # noqa: E402

from models import tiny_audio  # tests/ is on sys.path  # noqa: E402
from devices import TEST_DEVICE  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_audio.save_chat(tmp_path_factory.mktemp("gemma3n_audio"), seed=3)


@pytest.fixture(scope="module")
def engine(checkpoint):
    return metalkv.Engine.load(checkpoint[1], device=TEST_DEVICE, context=256, prefill_chunk=64)


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    data = tiny_audio.wav_bytes(tiny_audio.tone(1.0))
    path = tmp_path_factory.mktemp("clip") / "clip.wav"
    path.write_bytes(data)
    return path, base64.b64encode(data).decode()


def ask(clip_b64: str, text: str = "What is this?") -> list[dict]:
    return [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": clip_b64, "format": "wav"}},
                                         {"type": "text", "text": text}]}]


def reference(model, prompt: MediaPrompt, layout: dict, wav_path) -> np.ndarray:
    """transformers' logits at every position: the processor's ids (the run of audio soft
    tokens, not our keys) and the feature extractor's features of the wav's samples."""
    ids = prompt.ids.copy()
    for start, n, _ in prompt.spans:
        if n > 1:
            ids[start:start + n] = layout["audio"]
    with wave.open(str(wav_path)) as w:
        samples = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768
    fe = transformers.Gemma3nAudioFeatureExtractor(feature_size=model.config.audio_config.input_feat_size)
    feats = fe(samples, sampling_rate=16_000, return_tensors="pt")
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids.tolist()]), input_features=feats["input_features"],
                    input_features_mask=feats["input_features_mask"])
    return out.logits[0].float().numpy()


def test_chat_ids_lay_out_the_clip(engine, clip, checkpoint):
    _, _, layout = checkpoint
    prompt = engine.chat_ids(ask(clip[1]))
    assert isinstance(prompt, MediaPrompt)
    (start, n, bidi), (end, one, end_bidi) = prompt.spans  # the clip's run, then <end_of_audio>
    assert n == tiny_audio.TOKENS_PER_CLIP and not bidi and (end, one, end_bidi) == (start + n, 1, False)
    ids = prompt.ids.tolist()
    assert ids[start - 1] == layout["boa"] and ids[end] == layout["eoa"]
    assert all(i < 0 for i in ids[start:end]) and all(i >= 0 for i in ids[:start] + ids[end:])
    assert prompt.rows.shape == (n + 1, tiny_audio.TEXT["hidden_size"])


def test_logits_every_position_are_transformers(checkpoint, engine, clip):
    model, _, layout = checkpoint
    prompt = engine.chat_ids(ask(clip[1]))
    want = reference(model, prompt, layout, clip[0])
    got = engine.logits(prompt)
    assert got.shape == want.shape
    # f16 K/V in the cache, float32 elsewhere (test_gemma3n.py's bound)
    np.testing.assert_allclose(got, want, atol=4e-3 * np.abs(want).max(), rtol=0)
    # without the embedder's rows for the clip's tokens the model is far off (the test can fail)
    plain = engine.logits(MediaPrompt(prompt.ids.clip(0, None), [], None))
    assert np.abs(plain - want).max() > 10 * 4e-3 * np.abs(want).max()


def test_chunks_are_one_pass(checkpoint, clip):
    small = metalkv.Engine.load(checkpoint[1], device=TEST_DEVICE, context=256, prefill_chunk=8)
    whole = metalkv.Engine.load(checkpoint[1], device=TEST_DEVICE, context=256, prefill_chunk=128)
    prompt = whole.chat_ids(ask(clip[1]))
    np.testing.assert_array_equal(small.logits(small.chat_ids(ask(clip[1]))), whole.logits(prompt))


def test_reply_and_a_repeated_clip(engine, tmp_path):
    data = tiny_audio.wav_bytes(tiny_audio.tone(0.9, hz=523.0))  # a clip no other test sent
    path = tmp_path / "c5.wav"
    path.write_bytes(data)
    first = engine.chat(ask(base64.b64encode(data).decode(), "Describe it."), max_tokens=4)
    assert engine.last_stats["media_items"] == 1 and engine.last_stats["tower_seconds"] > 0
    again = engine.chat([{"role": "user", "content": [{"type": "audio", "path": str(path)},
                                                      {"type": "text", "text": "Describe it."}]}], max_tokens=4)
    stats = engine.last_stats
    assert again == first  # the same samples from a file: the same keys, the cached rows, the cached blocks
    assert stats["media_cached"] == 1 and stats["tower_seconds"] == 0.0
    assert stats["prompt_tokens_cached"] >= tiny_audio.TOKENS_PER_CLIP


def test_an_image_is_refused_by_name(engine):
    with pytest.raises(metalkv.ArgumentError, match="this model reads text and audio; images need a model whose"):
        engine.chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "a.png"}}]}])


def test_a_clip_too_long_for_its_run_is_refused(engine):
    b64 = base64.b64encode(tiny_audio.wav_bytes(tiny_audio.tone(3.0))).decode()
    with pytest.raises(metalkv.MediaError, match="soft tokens; its run holds 12"):
        engine.chat(ask(b64), max_tokens=1)


def test_generate_with_audio_flag(checkpoint, clip):
    rc = cli.main(["generate", "--model", str(checkpoint[1]), "--device", TEST_DEVICE, "--context", "256",
                   "--max-tokens", "3", "--audio", str(clip[0]), "What is this?"])
    assert rc == 0


def test_server_takes_an_input_audio_part(engine, clip):
    from server.conftest import chat_once  # tests/ is on sys.path
    r = chat_once(engine, ask(clip[1]), "tiny-gemma3n", max_tokens=3)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] > tiny_audio.TOKENS_PER_CLIP


def test_remote_clips_follow_the_engines_media_limits(engine, clip):
    """A clip by http(s) URL is refused unless the engine's media_limits allow fetching (what
    `metalkv serve --allow-remote-media` sets); allowed, it is the same clip as the file."""
    import dataclasses
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    data = clip[0].read_bytes()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/clip.wav"
    by_url = [{"role": "user", "content": [{"type": "audio", "url": url}, {"type": "text", "text": "Hi"}]}]
    before = engine.media_limits
    try:
        with pytest.raises(metalkv.MediaError, match="allow-remote-media"):
            engine.chat(by_url, max_tokens=1)
        engine.media_limits = dataclasses.replace(before, allow_remote=True)
        fetched = engine.chat_ids(by_url)
    finally:
        engine.media_limits = before
        server.shutdown()
    local = engine.chat_ids([{"role": "user", "content": [{"type": "audio", "path": str(clip[0])},
                                                          {"type": "text", "text": "Hi"}]}])
    np.testing.assert_array_equal(fetched.ids, local.ids)


def test_a_saved_cache_keeps_its_clip(checkpoint, engine, clip, tmp_path):
    """A chat with a clip, saved, loaded on a fresh engine (no tower outputs in memory) and
    continued: only the new turn is fed, and the clip, inside the cache's prefix, is not
    encoded again."""
    cache = engine.new_cache()
    messages = ask(clip[1])
    reply = engine.chat(messages, cache=cache, max_tokens=3)
    cache.save(tmp_path / "chat.mkv")
    fresh = metalkv.Engine.load(checkpoint[1], device=TEST_DEVICE, context=256, prefill_chunk=64)
    loaded = fresh.load_cache(tmp_path / "chat.mkv")
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "And then?"}]
    fresh.chat(messages, cache=loaded, max_tokens=3)
    stats = fresh.last_stats
    assert stats["media_items"] == 1 and stats["media_cached"] == 1 and stats["tower_seconds"] == 0.0
    whole = fresh.chat_ids(messages)
    start, n, _ = whole.spans[0]
    assert stats["prompt_tokens"] <= len(whole) - (start + n)  # the clip's run was not fed again
