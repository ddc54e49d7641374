"""Gemma 3's vision tower from llama.cpp's mmproj file (models/mmproj.py): a tiny checkpoint
written as convert_hf_to_gguf.py writes one (tiny_vlm.write_mmproj: gguf-py's own tensor
names, soft_emb_norm stored as 1 + w, the projection untransposed), against transformers'
get_image_features and the same tower read from safetensors; what it refuses; and the
engine taking it (Engine.load(mmproj=...), --mmproj)."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

import metalkv  # noqa: E402
from metalkv import _core, cli  # noqa: E402
from metalkv.models.errors import ModelLoadError  # noqa: E402
from metalkv.models.mmproj import load_mmproj  # noqa: E402
from metalkv.models.vision import Gemma3Vision  # noqa: E402

from . import tiny_vlm  # noqa: E402
from devices import TEST_DEVICE  # tests/ is on sys.path  # noqa: E402


@pytest.fixture(scope="module", params=["tiny", "d72"])
def checkpoint(request, tmp_path_factory):
    model = tiny_vlm.build(request.param)
    d = tiny_vlm.save(model, tmp_path_factory.mktemp(f"mmproj_{request.param}"))
    return model, d, tiny_vlm.write_mmproj(model, d.parent / f"mmproj-{request.param}.gguf")


@pytest.fixture(scope="module")
def device():
    return _core.Device(TEST_DEVICE)


def pixels(n: int, size: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, size=(n, 3, size, size)).astype(np.float32)


def test_the_mmproj_tower_is_transformers(device, checkpoint):
    model, d, mmproj = checkpoint
    vision, image_config, per_image = load_mmproj(device, mmproj, operands_16bit=False)  # float: tight bounds
    assert per_image == tiny_vlm.TOKENS_PER_IMAGE
    size = model.config.vision_config.image_size
    assert (image_config.height, image_config.width) == (size, size)
    pv = pixels(2, size, seed=5)
    got = vision.encode(pv)
    want = tiny_vlm.image_features(model, pv)
    np.testing.assert_allclose(got, want, atol=3e-3 * np.abs(want).max(), rtol=0)
    # the same weights from safetensors: the same tower (f16-exact weights, f16 matrices in the file)
    config = json.loads((d / "config.json").read_text())
    np.testing.assert_allclose(got, Gemma3Vision.load(device, d, config, operands_16bit=False).encode(pv), atol=1e-5 * np.abs(want).max())


def test_what_an_mmproj_cannot_be(device, checkpoint, tmp_path):
    model, _, _ = checkpoint
    q8 = tiny_vlm.write_mmproj(model, tmp_path / "q8.gguf", matrix_type="Q8_0")
    with pytest.raises(ModelLoadError, match="is q8_0; metalkv reads an mmproj of f32, f16 or bf16"):
        load_mmproj(device, q8)
    llava = tmp_path / "llava.gguf"
    w = gguf.GGUFWriter(str(llava), "clip")
    w.add_clip_projector_type("mlp")
    w.add_tensor("v.patch_embd.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelLoadError, match="projector type 'mlp': metalkv reads Gemma 3's mmproj files"):
        load_mmproj(device, llava)


def test_an_engine_takes_the_mmproj(tmp_path):
    """A Gemma 3 checkpoint's tower replaced by the mmproj file's: the same logits for a chat
    with an image (the tokenizer's image ids found by their text)."""
    import base64
    from media.drawn import encode, gradient  # tests/ is on sys.path
    model, d = tiny_vlm.save_chat(tmp_path / "chat", seed=4)
    mmproj = tiny_vlm.write_mmproj(model, tmp_path / "mmproj.gguf")
    own = metalkv.Engine.load(d, device=TEST_DEVICE, context=256, prefill_chunk=64)
    other = metalkv.Engine.load(d, device=TEST_DEVICE, context=256, prefill_chunk=64, mmproj=mmproj)
    png = encode(gradient(40, 28), "PNG")
    (tmp_path / "photo.png").write_bytes(png)
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                             {"type": "text", "text": "What is this?"}]}]
    a, b = own.chat_ids(messages), other.chat_ids(messages)
    np.testing.assert_array_equal(a.ids, b.ids)
    want = own.logits(a)
    np.testing.assert_allclose(other.logits(b), want, atol=1e-4 * np.abs(want).max(), rtol=0)
    rc = cli.main(["generate", "--model", str(d), "--mmproj", str(mmproj), "--device", TEST_DEVICE,
                   "--context", "256", "--max-tokens", "2", "--image", str(tmp_path / "photo.png"), "What is this?"])
    assert rc == 0


def test_an_mmproj_needs_a_gemma3_model(tmp_path):
    from metalkv.models import default_model_path, ModelNotFoundError
    try:
        smollm = default_model_path()
    except ModelNotFoundError:
        pytest.skip("the default model is not installed")
    model = tiny_vlm.build("tiny")
    mmproj = tiny_vlm.write_mmproj(model, tmp_path / "mmproj.gguf")
    with pytest.raises(ModelLoadError, match="needs a Gemma 3 or Gemma 3n model, not llama"):
        metalkv.Engine.load(smollm, device=TEST_DEVICE, context=64, mmproj=mmproj)
