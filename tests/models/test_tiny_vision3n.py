"""The Gemma 3n vision fixture (tiny_vision3n) against computations of its own: the saved
tower loaded into a fresh timm model, the embedder by hand in numpy, the image runs in the
logits, the processor's pixels by PIL.

    pytest tests/models/test_tiny_vision3n.py
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch")
try:
    from .timm_import import import_timm
    import_timm()
except ImportError:
    pytest.skip("timm is not installed (pip install --no-deps timm==1.0.20)", allow_module_level=True)

from . import tiny_audio, tiny_vision3n  # noqa: E402

PREFIX = "model.vision_tower.timm_model."


# (S, R): the default (MSFA pools 2x2), a smaller image, and R = S/16 (no pooling)
@pytest.fixture(scope="module", params=[(96, 3), (64, 2), (96, 6)], ids=lambda p: f"S{p[0]}_R{p[1]}")
def case(request):
    side, res = request.param
    return side, res, tiny_vision3n.build(res)


def test_saved_tower_is_timms_encoder(case, tmp_path):
    """The saved vision tensors load strictly into a fresh mobilenetv5_300m_enc and give
    tower_features. Every residual block moves its input by 5 % or more, on a stream of
    std O(1): at timm's layer scale (1e-5) the stream would shrink to ~1e-5, where
    RmsNorm2d's eps (1e-6) outweighs the mean square and the norms stop normalizing."""
    import torch
    from safetensors.torch import load_file
    side, res, model = case
    state = load_file(tiny_vision3n.save(model, tmp_path) / "model.safetensors")
    fresh = import_timm().create_model("mobilenetv5_300m_enc", pretrained=False, channel_multiplier=0.0625,
                                       msfa_output_resolution=res).eval()
    fresh.load_state_dict({k.removeprefix(PREFIX): v for k, v in state.items() if k.startswith(PREFIX)}, strict=True)
    x = tiny_vision3n.pixels(2, side)
    want = tiny_vision3n.tower_features(model, x)
    assert want.shape == (2, tiny_vision3n.WIDTH, res, res)
    with torch.no_grad():
        np.testing.assert_array_equal(fresh.forward_features(torch.from_numpy(x)).numpy(), want)
        h = fresh.conv_stem(torch.from_numpy(x))
        for name, block in fresh.blocks.named_modules():
            if name.count(".") == 1:  # "stage.block"
                h, before = block(h), h
                assert 0.2 < h.std() < 5, name
                if h.shape == before.shape:
                    assert (h - before).norm() > 0.05 * before.norm(), name


def test_image_features_are_the_embedder_by_hand(case):
    """image_features = RMSNorm(W RMSNorm(tower * sqrt(2048)) * w_soft), rows HW-major."""
    side, res, model = case
    x = tiny_vision3n.pixels(2, side, seed=1)
    tower = tiny_vision3n.tower_features(model, x).astype(np.float64)         # (n, 2048, R, R)
    emb = {k: v.detach().double().numpy() for k, v in model.model.embed_vision.state_dict().items()}
    eps = model.config.vision_config.rms_norm_eps
    rows = tower.reshape(2, tiny_vision3n.WIDTH, res * res).transpose(0, 2, 1) * tiny_vision3n.WIDTH ** 0.5
    rows = rows / np.sqrt((rows ** 2).mean(-1, keepdims=True) + eps) * emb["soft_embedding_norm.weight"]
    rows = rows @ emb["embedding_projection.weight"].T                      # (n, R*R, text hidden)
    rows = rows / np.sqrt((rows ** 2).mean(-1, keepdims=True) + eps)
    got = tiny_vision3n.image_features(model, x)
    assert got.shape == (2, res * res, tiny_audio.TEXT["hidden_size"]) and got.dtype == np.float32
    np.testing.assert_allclose(got, rows, rtol=1e-4, atol=1e-5)
    assert np.abs(got[0] - got[1]).mean() > 0.1  # two images, two sets of tokens


def test_logits_take_the_image_run(case):
    """Logits before the run do not see the image (causal); from the run on, another image
    changes them."""
    side, res, model = case
    lay = tiny_audio.LAYOUT
    ids = [2, 17, lay["boi"], *[lay["image"]] * (res * res), lay["eoi"], 30, 31]
    a, b = (tiny_vision3n.logits(model, ids, tiny_vision3n.pixels(1, side, seed=s)) for s in (2, 3))
    start = ids.index(lay["image"])
    np.testing.assert_allclose(a[:start], b[:start], rtol=1e-5, atol=1e-5)
    assert np.abs(a[start:] - b[start:]).max(-1).min() > 1e-3


def test_processor_pixels_are_pils_bilinear_over_255():
    """The released config does not normalize: pixels are PIL's bilinear resize / 255."""
    from PIL import Image
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (50, 70, 3), dtype=np.uint8))
    got = tiny_vision3n.processor_pixels(image, side=64)
    want = np.asarray(image.resize((64, 64), Image.BILINEAR), np.float64).transpose(2, 0, 1)[None] / 255
    assert got.shape == (1, 3, 64, 64) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
