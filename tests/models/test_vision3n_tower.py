"""Gemma 3n's vision tower and embedder (cpp/towers/mobilenet.h, models/vision3n.py) against
transformers' Gemma3nModel.get_image_features, whose tower is timm's MobileNet-V5 (all 84
blocks, channels x 1/16; tests/models/tiny_vision3n.py). Three image sides: 96 with a 3 x 3
output (the fusion pools 2 x 2), 64 with 2 x 2 (pools 2 x 2 over 4 x 4), and 80 with 5 x 5 (no
pooling; stage 3's grid of 3 upsampled to 5, odd grids and their "same" padding throughout).
Then the embedder's hard rows and what the loader refuses."""
from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
if importlib.util.find_spec("timm") is None:
    pytest.skip("timm is not installed (README: pip install --no-deps timm==1.0.20)", allow_module_level=True)

from metalkv import _core  # noqa: E402
from metalkv.models.errors import ModelLoadError  # noqa: E402
from metalkv.models.vision3n import Gemma3nVision  # noqa: E402

from . import tiny_vision3n  # noqa: E402
from devices import TEST_DEVICE  # tests/ is on sys.path  # noqa: E402

SIDES = {96: 3, 64: 2, 80: 5}  # image side: output side


@pytest.fixture(scope="module")
def device():
    return _core.Device(TEST_DEVICE)


def write(model, d, side: int):
    tiny_vision3n.save(model, d)
    (d / "preprocessor_config.json").write_text(json.dumps(tiny_vision3n.image_processor_config(side)))
    return d, json.loads((d / "config.json").read_text())


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """side -> (model, directory, config), each built once."""
    made = {}

    def get(side: int):
        if side not in made:
            model = tiny_vision3n.build(SIDES[side])
            made[side] = (model, *write(model, tmp_path_factory.mktemp(f"vision3n_{side}"), side))
        return made[side]
    return get


@pytest.fixture(params=sorted(SIDES))
def checkpoint(request, checkpoints):
    return (*checkpoints(request.param), request.param)


def test_tower_matches_transformers(device, checkpoint):
    model, d, cfg, side = checkpoint
    tower = Gemma3nVision.load(device, d, cfg)
    assert tower.tokens_per_image == SIDES[side] ** 2 and not tower.bidirectional
    px = tiny_vision3n.pixels(2, side, seed=side)
    want = tiny_vision3n.image_features(model, px)
    got = tower.encode(px)
    assert got.shape == want.shape
    # K and V are f16 in the attention blocks; everything else float32 (measured: ~5e-4)
    np.testing.assert_allclose(got, want, atol=2e-3 * np.abs(want).max(), rtol=0)
    # the two images differ by far more than that (the test can tell images apart)
    assert np.abs(got[0] - got[1]).max() > 50 * 2e-3 * np.abs(want).max()


def test_hard_rows_are_the_embedders(device, checkpoint):
    import torch
    model, d, cfg, _ = checkpoint
    tower = Gemma3nVision.load(device, d, cfg)
    offset = cfg["vision_config"]["vocab_offset"]
    ids = torch.arange(offset, offset + cfg["vision_config"]["vocab_size"])
    with torch.no_grad():
        want = model.model.embed_vision(input_ids=ids[None])[0].numpy()
    got = np.stack([tower.hard_row(int(i)) for i in ids])
    np.testing.assert_allclose(got, want, atol=1e-5 * np.abs(want).max(), rtol=0)
    assert tower.hard_row(offset - 1) is None and tower.hard_row(offset + len(ids)) is None


@pytest.mark.parametrize("change,message", [
    (lambda c: c["vision_config"].update(architecture="mobilenetv5_base"), "metalkv runs mobilenetv5_300m_enc"),
    (lambda c: c.update(vision_soft_tokens_per_image=10), "is not msfa_output_resolution"),
])
def test_configs_the_loader_refuses(device, checkpoints, change, message):
    _, d, cfg = checkpoints(96)
    bad = json.loads(json.dumps(cfg))
    change(bad)
    with pytest.raises(ModelLoadError, match=message):
        Gemma3nVision.load(device, d, bad)


def test_a_grid_timm_resizes_bilinearly_is_refused(device, checkpoints):
    """Side 96 leaves stage 2 at 6 x 6; an output of 4 x 4 is no divisor: timm resizes there."""
    _, d, cfg = checkpoints(96)
    bad = json.loads(json.dumps(cfg))
    bad["vision_config"]["model_args"]["msfa_output_resolution"] = 4
    bad["vision_soft_tokens_per_image"] = 16
    with pytest.raises(ModelLoadError, match="grid 6 is not a multiple of the output's 4: timm resizes bilinearly"):
        Gemma3nVision.load(device, d, bad)


def test_a_checkpoint_without_vision_weights_has_no_tower(device, tmp_path):
    from . import tiny_audio
    d = tiny_audio.save(tiny_audio.build(), tmp_path)
    assert Gemma3nVision.load(device, d, json.loads((d / "config.json").read_text())) is None


def test_every_block_of_the_fixture_matters(checkpoints):
    """The test above can only catch a block metalkv runs wrong if the block moves the stream:
    every residual block changes its input by 5 % or more, on a stream of std O(1) (at timm's
    layer scale of 1e-5 the stream would shrink to where RmsNorm2d's eps outweighs it;
    tiny_vision3n's docstring)."""
    import torch
    model, _, _ = checkpoints(96)
    tower = tiny_vision3n.timm_model(model)
    with torch.no_grad():
        h = tower.conv_stem(torch.from_numpy(tiny_vision3n.pixels(2, 96)))
        for name, block in tower.blocks.named_modules():
            if name.count(".") == 1:  # "stage.block"
                h, before = block(h), h
                assert 0.2 < h.std() < 5, name
                if h.shape == before.shape:
                    assert (h - before).norm() > 0.05 * before.norm(), name
