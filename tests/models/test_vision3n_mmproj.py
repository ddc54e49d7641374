"""llama.cpp's mmproj files of Gemma 3n's vision tower (models/vision3n.py mmproj_model), written
here as convert_hf_to_gguf.py writes them (tests/models/tiny_vision3n.write_mmproj: gguf-py's own
tensor map, the converter's block names, reshapes and types): the tower against the safetensors
tower and transformers; an engine whose checkpoint tower the file replaces gives the same logits,
and another file's tower changes them; `--mmproj`; what is refused."""
from __future__ import annotations

import base64
import importlib.util
import io

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")
if importlib.util.find_spec("timm") is None:
    pytest.skip("timm is not installed (README: pip install --no-deps timm==1.0.20)", allow_module_level=True)

import metalkv  # noqa: E402
from metalkv import _core, cli  # noqa: E402
from metalkv.models.errors import ModelLoadError  # noqa: E402
from metalkv.models.vision3n import Gemma3nVision  # noqa: E402

from . import tiny_vision3n  # noqa: E402
from devices import TEST_DEVICE  # tests/ is on sys.path  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    model, d, layout = tiny_vision3n.save_chat(tmp_path_factory.mktemp("gemma3n_mmproj"), seed=7)
    return model, d, layout, tiny_vision3n.write_mmproj(model, d.parent / "mmproj.gguf")


def ask(seed: int) -> list[dict]:
    from PIL import Image
    px = tiny_vision3n.pixels(1, 100, seed)[0]
    buf = io.BytesIO()
    Image.fromarray((px.transpose(1, 2, 0) * 255).round().astype(np.uint8)).save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": "What is this?"}]}]


def test_the_files_tower_is_the_checkpoints(checkpoint):
    model, d, layout, mmproj = checkpoint
    import json
    device = _core.Device(TEST_DEVICE)
    cfg = json.loads((d / "config.json").read_text())
    ours = Gemma3nVision.from_mmproj(device, mmproj, layout["eoi"])
    theirs = Gemma3nVision.load(device, d, cfg)
    assert (ours.image_size, ours.tokens_per_image, ours.vocab_offset) == (theirs.image_size, 9, layout["eoi"])
    px = tiny_vision3n.pixels(2, tiny_vision3n.SIDE, seed=3)
    want = tiny_vision3n.image_features(model, px)
    got = ours.encode(px)
    # f16 matrices holding the same (f16-exact) values as the checkpoint's f32: the same tower
    np.testing.assert_allclose(got, theirs.encode(px), atol=1e-5 * np.abs(want).max(), rtol=0)
    np.testing.assert_allclose(got, want, atol=2e-3 * np.abs(want).max(), rtol=0)
    np.testing.assert_allclose(ours.hard_row(layout["eoi"]), theirs.hard_row(layout["eoi"]), rtol=0, atol=1e-6)


def test_an_engine_takes_its_tower_from_the_file(checkpoint, tmp_path):
    model, d, _, mmproj = checkpoint
    plain = metalkv.Engine.load(d, device=TEST_DEVICE, context=256)
    with_file = metalkv.Engine.load(d, device=TEST_DEVICE, context=256, mmproj=mmproj)
    want = plain.logits(plain.chat_ids(ask(1)))
    np.testing.assert_allclose(with_file.logits(with_file.chat_ids(ask(1))), want,
                               atol=1e-4 * np.abs(want).max(), rtol=0)
    # another tower in the file: other logits from the image on (the file's tower is the one used)
    other = tiny_vision3n.write_mmproj(tiny_vision3n.build(seed=8), tmp_path / "other.gguf")
    swapped = metalkv.Engine.load(d, device=TEST_DEVICE, context=256, mmproj=other)
    assert np.abs(swapped.logits(swapped.chat_ids(ask(1))) - want).max() > 1e-2 * np.abs(want).max()


def test_generate_with_mmproj_flag(checkpoint, tmp_path):
    _, d, _, mmproj = checkpoint
    from PIL import Image
    path = tmp_path / "i.png"
    Image.fromarray((tiny_vision3n.pixels(1, 64, 4)[0].transpose(1, 2, 0) * 255).astype(np.uint8)).save(path)
    rc = cli.main(["generate", "--model", str(d), "--device", TEST_DEVICE, "--context", "256", "--max-tokens", "2",
                   "--mmproj", str(mmproj), "--image", str(path), "What is this?"])
    assert rc == 0


def test_a_gemma3_mmproj_is_refused_for_gemma3n(checkpoint, tmp_path):
    _, d, _, _ = checkpoint
    from . import tiny_vlm
    gemma3 = tiny_vlm.write_mmproj(tiny_vlm.build(), tmp_path / "gemma3.gguf")
    with pytest.raises(ModelLoadError, match="a Gemma 3n model takes Gemma 3n's mmproj"):
        metalkv.Engine.load(d, device=TEST_DEVICE, context=256, mmproj=gemma3)
