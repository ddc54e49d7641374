"""An image through every interface, on a tiny Gemma 3n checkpoint with both towers, a
tokenizer and a chat template (tests/models/tiny_vision3n.save_chat: timm's MobileNet-V5 at
1/16 of its channels, 3 x 3 soft tokens an image): Engine.chat with OpenAI's image_url part
and a local path; the whole model's logits at every position against
Gemma3nForConditionalGeneration, given the pixels transformers' own image processor makes of
the same file, for an image alone and for an image and a clip in one message (the image's run
attends causally, <end_of_image> is the vision embedder's row); chunked prefill; a repeated
image costs no tower time and its blocks come from the prefix cache; metalkv generate
--image; the server."""
from __future__ import annotations

import base64
import importlib.util
import io
import wave

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if importlib.util.find_spec("timm") is None:
    pytest.skip("timm is not installed (README: pip install --no-deps timm==1.0.20)", allow_module_level=True)

from PIL import Image  # noqa: E402

import metalkv  # noqa: E402
from metalkv import cli  # noqa: E402
from metalkv.multimodal import MediaPrompt  # noqa: E402

from models import tiny_audio, tiny_vision3n  # tests/ is on sys.path  # noqa: E402
from devices import TEST_DEVICE  # noqa: E402

TOKENS = tiny_vision3n.RES ** 2


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_vision3n.save_chat(tmp_path_factory.mktemp("gemma3n_vision"), seed=5)


@pytest.fixture(scope="module")
def engine(checkpoint):
    return metalkv.Engine.load(checkpoint[1], device=TEST_DEVICE, context=256, prefill_chunk=64)


def png(seed: int, side: int = 120) -> bytes:
    """A drawn image (not the tower's side: the processor resizes it)."""
    px = tiny_vision3n.pixels(1, side, seed)[0]
    buf = io.BytesIO()
    Image.fromarray((px.transpose(1, 2, 0) * 255).round().astype(np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    data = png(1)
    path = tmp_path_factory.mktemp("image") / "image.png"
    path.write_bytes(data)
    return path, "data:image/png;base64," + base64.b64encode(data).decode()


def ask(url: str, text: str = "What is this?", clip_b64: str | None = None) -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": url}}]
    if clip_b64:
        parts.append({"type": "input_audio", "input_audio": {"data": clip_b64, "format": "wav"}})
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def reference(model, prompt: MediaPrompt, layout: dict, image_path, clip: bytes | None = None) -> np.ndarray:
    """transformers' logits at every position: the processor's ids (each run's soft tokens, not
    our keys), the image processor's pixels of the file, the feature extractor's features of the clip."""
    ids = prompt.ids.copy()
    runs = [(s, n) for s, n, _ in prompt.spans if n > 1]
    for (start, n), token in zip(runs, ["image", "audio"]):
        ids[start:start + n] = layout[token]
    kw = dict(pixel_values=torch.from_numpy(tiny_vision3n.processor_pixels(Image.open(image_path))))
    if clip is not None:
        with wave.open(io.BytesIO(clip)) as w:
            samples = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768
        fe = transformers.Gemma3nAudioFeatureExtractor(feature_size=model.config.audio_config.input_feat_size)
        feats = fe(samples, sampling_rate=16_000, return_tensors="pt")
        kw.update(input_features=feats["input_features"], input_features_mask=feats["input_features_mask"])
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids.tolist()]), **kw).logits[0].float().numpy()


def test_chat_ids_lay_out_the_image(engine, image, checkpoint):
    _, _, layout = checkpoint
    prompt = engine.chat_ids(ask(image[1]))
    (start, n, bidi), (end, one, end_bidi) = prompt.spans  # the image's run, then <end_of_image>
    assert n == TOKENS and not bidi and (end, one, end_bidi) == (start + n, 1, False)  # causal, as Gemma 3n's
    ids = prompt.ids.tolist()
    assert ids[start - 1] == layout["boi"] and ids[end] == layout["eoi"]
    assert all(i < 0 for i in ids[start:end]) and all(i >= 0 for i in ids[:start] + ids[end:])


@pytest.mark.parametrize("with_clip", [False, True], ids=["image", "image+clip"])
def test_logits_every_position_are_transformers(checkpoint, engine, image, with_clip):
    model, _, layout = checkpoint
    clip = tiny_audio.wav_bytes(tiny_audio.tone(1.0)) if with_clip else None
    prompt = engine.chat_ids(ask(image[1], clip_b64=base64.b64encode(clip).decode() if clip else None))
    assert len([s for s in prompt.spans if s[1] > 1]) == 1 + with_clip
    want = reference(model, prompt, layout, image[0], clip)
    got = engine.logits(prompt)
    assert got.shape == want.shape
    # f16 K/V in the cache and the tower's attention, float32 elsewhere (test_gemma3n_audio.py's bound)
    np.testing.assert_allclose(got, want, atol=4e-3 * np.abs(want).max(), rtol=0)
    # another image changes the logits from its run on by far more (the test can tell images apart)
    other = engine.chat_ids(ask("data:image/png;base64," + base64.b64encode(png(2)).decode(),
                                clip_b64=base64.b64encode(clip).decode() if clip else None))
    start = prompt.spans[0][0]
    diff = np.abs(engine.logits(other) - got)
    assert diff[:start].max() == 0 and diff[start:].max() > 10 * 4e-3 * np.abs(want).max()


def test_chunks_are_one_pass(checkpoint, image):
    small = metalkv.Engine.load(checkpoint[1], device=TEST_DEVICE, context=256, prefill_chunk=4)
    whole = metalkv.Engine.load(checkpoint[1], device=TEST_DEVICE, context=256, prefill_chunk=128)
    np.testing.assert_array_equal(small.logits(small.chat_ids(ask(image[1]))), whole.logits(whole.chat_ids(ask(image[1]))))


def test_reply_and_a_repeated_image(engine, tmp_path):
    data = png(7)  # an image no other test sent
    path = tmp_path / "seven.png"
    path.write_bytes(data)
    first = engine.chat(ask("data:image/png;base64," + base64.b64encode(data).decode(), "Describe it."), max_tokens=4)
    assert engine.last_stats["media_items"] == 1 and engine.last_stats["tower_seconds"] > 0
    again = engine.chat(ask(str(path), "Describe it."), max_tokens=4)
    stats = engine.last_stats
    assert again == first  # the same pixels from a file: the same keys, the cached rows, the cached blocks
    assert stats["media_cached"] == 1 and stats["tower_seconds"] == 0.0
    assert stats["prompt_tokens_cached"] >= TOKENS


def test_an_image_under_an_eviction_policy(checkpoint, image):
    """Gemma 3n's image runs are causal, so an eviction policy takes them as it takes text
    (Gemma 3's bidirectional runs are refused: test_gemma3_vision.py). A prompt within the
    budget gives the plain cache's logits; generation goes on past the budget, evicting."""
    plain = metalkv.Engine.load(checkpoint[1], device=TEST_DEVICE, context=256, prefill_chunk=4)
    evicting = metalkv.Engine.load(checkpoint[1], device=TEST_DEVICE, context=256, prefill_chunk=4,
                                   kv_policy="streaming", kv_budget=40)
    prompt = evicting.chat_ids(ask(image[1]))
    assert len(prompt.ids) <= 40 and prompt.spans[0][1] == TOKENS
    np.testing.assert_array_equal(evicting.logits(prompt), plain.logits(plain.chat_ids(ask(image[1]))))
    cache = evicting.new_cache()
    out = evicting.generate_ids(prompt, max_tokens=60, stop_ids=(), cache=cache)
    assert len(out) == 60 and evicting.last_stats["finish_reason"] == "length" and cache.evicted > 0
    assert out[0] == plain.generate_ids(prompt, max_tokens=1, stop_ids=())[0]


def test_generate_with_image_flag(checkpoint, image):
    rc = cli.main(["generate", "--model", str(checkpoint[1]), "--device", TEST_DEVICE, "--context", "256",
                   "--max-tokens", "3", "--image", str(image[0]), "What is this?"])
    assert rc == 0


def test_server_takes_an_image_url_part(engine, image):
    from server.conftest import chat_once  # tests/ is on sys.path
    r = chat_once(engine, ask(image[1]), "tiny-gemma3n", max_tokens=3)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] > TOKENS
