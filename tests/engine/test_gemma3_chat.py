"""An image through every interface, on a tiny Gemma 3 checkpoint with a tokenizer and a
chat template (tests/models/tiny_vlm.save_chat): Engine.chat with OpenAI content parts (a data
URL and a local path), the prompt laid out as the processor lays it out, the reply the model's
greedy continuation of what transformers computes for the same prompt; a repeated image costs
no tower time and its blocks come from the prefix cache (last_stats); a chat continued with
its cache feeds only the new turn; metalkv generate --image; the server's content parts."""
from __future__ import annotations

import base64
import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import metalkv  # noqa: E402
from metalkv import cli  # noqa: E402
from metalkv.multimodal import MediaPrompt  # noqa: E402

from media.drawn import encode, gradient  # tests/ is on sys.path  # noqa: E402
from models import tiny_vlm  # noqa: E402
from devices import TEST_DEVICE  # noqa: E402


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    return tiny_vlm.save_chat(tmp_path_factory.mktemp("gemma3_chat"), seed=2)


@pytest.fixture(scope="module")
def engine(vlm):
    return metalkv.Engine.load(vlm[1], device=TEST_DEVICE, context=256, prefill_chunk=64)


@pytest.fixture(scope="module")
def photo(tmp_path_factory):
    png = encode(gradient(40, 28), "PNG")
    path = tmp_path_factory.mktemp("photo") / "photo.png"
    path.write_bytes(png)
    return path, "data:image/png;base64," + base64.b64encode(png).decode()


def ask(image: str, text: str = "What is this?") -> list[dict]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}},
                                         {"type": "text", "text": text}]}]


def test_chat_ids_lay_out_the_image(engine, photo):
    prompt = engine.chat_ids(ask(photo[1]))
    assert isinstance(prompt, MediaPrompt) and len(prompt.spans) == 1
    start, n, bidirectional = prompt.spans[0]
    assert n == tiny_vlm.TOKENS_PER_IMAGE and bidirectional
    ids = prompt.ids.tolist()
    boi, eoi = engine.media.tokens.image.begin, engine.media.tokens.image.end
    assert engine.tokenizer.id_to_token(ids[start - 1]) == boi and engine.tokenizer.id_to_token(ids[start + n]) == eoi
    assert all(i < 0 for i in ids[start:start + n]) and all(i >= 0 for i in ids[:start] + ids[start + n:])


def test_reply_is_transformers_greedy(vlm, engine, photo):
    """The first reply token is the argmax of transformers' logits for the same prompt and pixels."""
    model, _ = vlm
    prompt = engine.chat_ids(ask(photo[1]))
    ids = prompt.ids.copy()
    start, n, _ = prompt.spans[0]
    ids[start:start + n] = model.config.image_token_index
    pv = metalkv.media.preprocess_image(metalkv.media.load_image(photo[0]), engine.media.image_config).pixel_values
    x = torch.tensor([ids.tolist()])
    with torch.no_grad():
        want = model(input_ids=x, pixel_values=torch.from_numpy(pv), token_type_ids=(x == ids[start]).long()
                     ).logits[0, -1].numpy()
    got = engine.logits(prompt)[-1]
    np.testing.assert_allclose(got, want, atol=4e-3 * np.abs(want).max(), rtol=0)
    first = engine.generate_ids(prompt, max_tokens=1, stop_ids=())[0]
    assert first == int(np.argmax(got))


def test_a_repeated_image_costs_no_tower_time(engine, photo):
    path, url = photo
    first = engine.chat(ask(str(path), "Describe it."), max_tokens=5)
    assert engine.last_stats["media_items"] == 1
    again = engine.chat(ask(url, "Describe it."), max_tokens=5)  # the same pixels, sent as a data URL
    stats = engine.last_stats
    assert again == first
    assert stats["media_cached"] == 1 and stats["tower_seconds"] == 0.0
    assert stats["prompt_tokens_cached"] >= 16  # the image's blocks: its keys are the same


def test_a_chat_continued_with_its_cache_feeds_only_the_new_turn(engine, photo):
    cache = engine.new_cache()
    messages = ask(photo[1])
    reply = engine.chat(messages, cache=cache, max_tokens=4)
    held = len(cache.tokens)
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "And its colour?"}]
    engine.chat(messages, cache=cache, max_tokens=4)
    whole = engine.chat_ids(messages)
    start, n, _ = whole.spans[0]
    # fed: what follows the common prefix, which holds the image (the reply's re-tokenized ids may part earlier)
    assert engine.last_stats["prompt_tokens"] <= len(whole) - (start + n) and held > start + n
    with pytest.raises(metalkv.ArgumentError, match="continue it with Engine.chat"):
        engine.generate("And now?", cache=cache, max_tokens=1)


def test_generate_with_image_flag(vlm, photo, capsys):
    rc = cli.main(["generate", "--model", str(vlm[1]), "--device", TEST_DEVICE, "--context", "256",
                   "--max-tokens", "3", "--image", str(photo[0]), "What is this?"])
    assert rc == 0


def test_server_takes_an_image_part(engine, photo):
    from server.conftest import chat_once  # tests/ is on sys.path
    r = chat_once(engine, ask(photo[1]), "tiny-vlm", max_tokens=3)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] > tiny_vlm.TOKENS_PER_IMAGE


def test_pan_and_scan_crops_are_transformers(vlm, tmp_path):
    """With do_pan_and_scan on, a wide image goes in as the whole image then its crops, each a
    run of its own (the processor's text between them): logits at every position are
    transformers' given the same views, each run bidirectional on its own."""
    import json
    import shutil
    model, d = vlm
    pan = tmp_path / "pan"
    shutil.copytree(d, pan)
    pre = json.loads((pan / "preprocessor_config.json").read_text())
    pre.update(do_pan_and_scan=True, pan_and_scan_min_crop_size=8, pan_and_scan_max_num_crops=3,
               pan_and_scan_min_ratio_to_activate=1.2)
    (pan / "preprocessor_config.json").write_text(json.dumps(pre))
    engine = metalkv.Engine.load(pan, device=TEST_DEVICE, context=256, prefill_chunk=64)
    png = encode(gradient(72, 24), "PNG")
    prepared = engine.media.prepare_image(png)
    assert prepared.num_crops >= 2
    prompt = engine.chat_ids(ask("data:image/png;base64," + base64.b64encode(png).decode()))
    assert len(prompt.spans) == 1 + prepared.num_crops and all(n == tiny_vlm.TOKENS_PER_IMAGE and bidi
                                                               for _, n, bidi in prompt.spans)
    ids = prompt.ids.copy()
    for start, n, _ in prompt.spans:
        ids[start:start + n] = model.config.image_token_index
    x = torch.tensor([ids.tolist()])
    with torch.no_grad():
        want = model(input_ids=x, pixel_values=torch.from_numpy(prepared.pixel_values),
                     token_type_ids=(x == model.config.image_token_index).long()).logits[0].numpy()
    got = engine.logits(prompt)
    np.testing.assert_allclose(got, want, atol=4e-3 * np.abs(want).max(), rtol=0)
