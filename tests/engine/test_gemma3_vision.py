"""Gemma 3 with an image, the whole model (tower, soft tokens in the step, the image's
bidirectional block) against transformers' Gemma3ForConditionalGeneration on a tiny random
checkpoint (tests/models/tiny_vlm.py): logits at every position, prompts fed in chunks
that must not cut the image, the prefix cache reusing an image's blocks by its keys, and
a second image whose keys differ."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import metalkv  # noqa: E402
from metalkv.multimodal import MediaPrompt, media_keys  # noqa: E402

from models import tiny_vlm  # tests/ is on sys.path  # noqa: E402
from devices import TEST_DEVICE  # noqa: E402

IMG, BOI, EOI, N = tiny_vlm.IMAGE_TOKEN, tiny_vlm.BOI, tiny_vlm.EOI, tiny_vlm.TOKENS_PER_IMAGE
# text, an image, text, a second image, text
IDS = [2, 17, 33, BOI] + [IMG] * N + [EOI, 40, 41, 42, BOI] + [IMG] * N + [EOI, 50, 51, 52, 53]
STARTS = [4, 4 + N + 5]


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    model = tiny_vlm.build("tiny", seed=1)
    return model, tiny_vlm.save(model, tmp_path_factory.mktemp("gemma3_vlm"))


@pytest.fixture(scope="module")
def engine(vlm):
    return metalkv.Engine.load(vlm[1], device=TEST_DEVICE, context=256, prefill_chunk=64)


def pixels(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, size=(n, 3, 32, 32)).astype(np.float32)


def media_prompt(engine, pv: np.ndarray, ids=IDS, starts=STARTS) -> MediaPrompt:
    rows = engine.media.vision.encode(pv)
    keyed = np.array(ids, np.int64)
    for i, s in enumerate(starts):
        keyed[s:s + N] = media_keys(pv[i].tobytes(), N)
    return MediaPrompt(keyed, [(s, N, True) for s in starts], rows.reshape(-1, rows.shape[-1]))


def reference(model, pv: np.ndarray, ids=IDS, bidirectional: bool = True) -> np.ndarray:
    x = torch.tensor([ids])
    kw = {"token_type_ids": (x == IMG).long()} if bidirectional else {}
    with torch.no_grad():
        return model(input_ids=x, pixel_values=torch.from_numpy(pv), **kw).logits[0].float().numpy()


def test_engine_loads_the_tower(engine):
    assert engine.media is not None and engine.media.vision.tokens_per_image == N


def test_logits_every_position(vlm, engine):
    model, _ = vlm
    pv = pixels(2, 0)
    got = engine.logits(media_prompt(engine, pv))
    want = reference(model, pv)
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, atol=4e-3 * scale, rtol=0)
    # the image block's mask matters: the causal-only model is further off than our error
    causal = reference(model, pv, bidirectional=False)
    assert np.abs(causal - want).max() > 10 * np.abs(got - want).max()


def test_chunks_never_cut_an_image(vlm, engine):
    """prefill_chunk 16 (an image's length): the chunks end before each image and hold it whole;
    the logits are those of one pass (the prefill kernels are chunk-invariant)."""
    pv = pixels(2, 1)
    small = metalkv.Engine.load(vlm[1], device=TEST_DEVICE, context=256, prefill_chunk=N)
    np.testing.assert_array_equal(small.logits(media_prompt(small, pv)), engine.logits(media_prompt(engine, pv)))


def test_an_image_longer_than_a_chunk_is_refused(vlm):
    small = metalkv.Engine.load(vlm[1], device=TEST_DEVICE, context=256, prefill_chunk=N // 2)
    with pytest.raises(metalkv.ArgumentError, match="one step of at most 8 tokens.*prefill_chunk"):
        small.logits(media_prompt(small, pixels(2, 2)))


def test_the_prefix_cache_reuses_an_image(engine):
    """The same images again: their blocks come from the prefix cache (their keys match), the
    reply the same; other images: keys differ, nothing past the text before them is reused."""
    pv = pixels(2, 3)
    first = engine.generate_ids(media_prompt(engine, pv), max_tokens=6, stop_ids=())
    again = engine.generate_ids(media_prompt(engine, pv), max_tokens=6, stop_ids=())
    block = 32  # kKvBlockTokens: the cache shares whole blocks
    assert engine.last_stats["prompt_tokens_cached"] == (len(IDS) - 1) // block * block
    assert again == first and len(first) == 6
    assert first[0] == int(np.argmax(engine.logits(media_prompt(engine, pv))[-1]))
    engine.generate_ids(media_prompt(engine, pixels(2, 4)), max_tokens=1)
    assert engine.last_stats["prompt_tokens_cached"] == 0  # the first block holds the first image's keys


def test_keys_are_never_vocabulary_ids():
    keys = media_keys(b"\x01" * 32, 4096)
    assert keys.max() < 0 and keys.min() >= -(2 ** 31 - 1) and len(set(keys.tolist())) == 4096


def test_an_image_that_fills_a_chunk_before_one_last_token(vlm):
    """prefill_chunk 16, the image at index 4 and 17 tokens from its start on: the chunker's
    rule against a one-token tail would take 15 and cut the image; the image is taken whole
    instead (the call used to wait for ever)."""
    ids = [2, 17, 33, BOI] + [IMG] * N + [EOI]
    small = metalkv.Engine.load(vlm[1], device=TEST_DEVICE, context=256, prefill_chunk=N)
    pv = pixels(1, 5)
    got = small.logits(media_prompt(small, pv, ids=ids, starts=[4]))
    np.testing.assert_allclose(got, reference(vlm[0], pv, ids=ids), atol=4e-3 * np.abs(got).max(), rtol=0)
    assert len(small.generate_ids(media_prompt(small, pv, ids=ids, starts=[4]), max_tokens=2, stop_ids=())) == 2


def _rows(n: int, width: int = tiny_vlm.TEXT["hidden_size"]) -> np.ndarray:
    return np.zeros((n, width), np.float32)


@pytest.mark.parametrize("ids, media, says", [
    ([1, -5, 2], None, "token id -5 at index 1 is out of range"),                       # a key outside any span
    ([1, -5, -6, 2], ([(1, 2, True)], _rows(3)), "rows hold 384 floats; the spans' 2 tokens need 256"),
    ([1, -5, -6, 2], ([(1, 2, True)], _rows(2, 64)), "rows of width 64 for a model of width 128"),
    ([1, -5, -6, 2], ([(2, 1, True), (1, 1, True)], _rows(2)), "span 1 .* out of order"),
    ([1, -5, -6, 2], ([(3, 2, True)], _rows(2)), "span 0 .* past the prompt's 4 ids"),
    ([1, -5, -6, 2], ((1, 2, True), _rows(2)), "each span is \\(start, length, bidirectional\\)"),
    ([1, -5, -6, 2], ([(1, 2, True)], _rows(2).astype(np.float64)), "rows a C-contiguous 2-D float32 array"),
])
def test_bad_media_is_refused(engine, ids, media, says):
    with pytest.raises(metalkv.ArgumentError, match=says):
        engine._core.submit_logits(engine.new_cache(capacity=64), np.array(ids, np.int64), media=media)


def test_an_image_under_an_eviction_policy_is_refused(vlm, engine):
    evicting = metalkv.Engine.load(vlm[1], device=TEST_DEVICE, context=256, prefill_chunk=64, kv_policy="streaming",
                                   kv_budget=64)
    with pytest.raises(metalkv.ArgumentError, match="needs a cache without an eviction policy"):
        evicting.logits(media_prompt(evicting, pixels(2, 6)))
