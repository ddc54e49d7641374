"""Gemma 3's vision tower and projector (cpp/towers/siglip.h, models/vision.py)
against transformers' Gemma3Model.get_image_features on tiny random checkpoints:
head_dim 16 and SigLIP-so400m's 72 (both padded by the loader), one image and a
batch of three, weights loaded as f32 and as f16."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from metalkv import _core  # noqa: E402
from metalkv.models.errors import ModelLoadError  # noqa: E402
from metalkv.models.vision import Gemma3Vision, siglip_spec  # noqa: E402

from . import tiny_vlm  # noqa: E402
from devices import TEST_DEVICE  # tests/ is on sys.path  # noqa: E402


@pytest.fixture(scope="module", params=["tiny", "d72"])
def checkpoint(request, tmp_path_factory):
    model = tiny_vlm.build(request.param)
    d = tiny_vlm.save(model, tmp_path_factory.mktemp(f"vlm_{request.param}"))
    return model, d, json.loads((d / "config.json").read_text())


@pytest.fixture(scope="module")
def host():
    return _core.Device(TEST_DEVICE)


def pixels(n: int, size: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, size=(n, 3, size, size)).astype(np.float32)


@pytest.mark.parametrize("n", [1, 3])
def test_tower_matches_transformers(host, checkpoint, n):
    """Float operands: within f16 K/V's rounding of transformers in float32 (the 16-bit
    default is held to transformers' own bf16 error below)."""
    model, d, cfg = checkpoint
    tower = Gemma3Vision.load(host, d, cfg, operands_16bit=False)
    assert tower.tokens_per_image == tiny_vlm.TOKENS_PER_IMAGE
    pv = pixels(n, cfg["vision_config"]["image_size"], seed=n)
    got = tower.encode(pv)
    want = tiny_vlm.image_features(model, pv)
    assert got.shape == want.shape == (n, 16, tiny_vlm.TEXT["hidden_size"])
    # K and V pass through f16 in the attention: rounding of ~1e-3 of the features' scale
    np.testing.assert_allclose(got, want, atol=3e-3 * np.abs(want).max(), rtol=0)
    # each image alone gives its own rows (no attention across images)
    np.testing.assert_array_equal(tower.encode(pv[-1:])[0], got[-1])


def test_padded_head_dim_is_a_kernel_one(checkpoint):
    _, _, cfg = checkpoint
    spec = siglip_spec(cfg)
    true = cfg["vision_config"]["hidden_size"] // cfg["vision_config"]["num_attention_heads"]
    assert spec["head_dim"] in _core.ops.attention_head_dims() and spec["head_dim"] >= true
    assert spec["scale"] == pytest.approx(true ** -0.5)


def patches_of(pixel_values: np.ndarray, patch: int, width: int) -> np.ndarray:
    """(n, C, S, S) -> (n, (S / patch)², width): each patch's (channel, y, x) values, then
    zeros, in the row-major order of the patch grid (the layout image_patches_f32 writes,
    tests/ops/test_vision.py)."""
    n, c, s, _ = pixel_values.shape
    g = s // patch
    p = pixel_values.reshape(n, c, g, patch, g, patch).transpose(0, 2, 4, 1, 3, 5).reshape(n, g * g, -1)
    return np.pad(p, ((0, 0), (0, 0), (0, width - p.shape[-1])))


def test_patches_follow_the_convolution(checkpoint):
    """The patch layout · W_patchᵀ is transformers' stride-p Conv2d."""
    import torch
    model, _, cfg = checkpoint
    pv = pixels(2, cfg["vision_config"]["image_size"])
    tower = model.model.vision_tower
    conv = getattr(tower, "vision_model", tower).embeddings.patch_embedding  # (transformers 5.17 / 5.24)
    with torch.no_grad():
        want = conv(torch.from_numpy(pv)).flatten(2).transpose(1, 2).numpy()
    w = conv.weight.detach().numpy().reshape(conv.weight.shape[0], -1)
    w = np.pad(w, ((0, 0), (0, siglip_spec(cfg)["patch_dim"] - w.shape[1])))  # (the loader's zero columns)
    got = patches_of(pv, cfg["vision_config"]["patch_size"], w.shape[1]) @ w.T + conv.bias.detach().numpy()
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_a_text_only_config_has_no_tower(host, tmp_path):
    assert Gemma3Vision.load(host, tmp_path, {"model_type": "gemma3_text"}) is None


def test_a_missing_tensor_is_named(host, checkpoint, tmp_path):
    from safetensors.numpy import load_file, save_file
    _, d, cfg = checkpoint
    tensors = {k: v for f in d.glob("*.safetensors") for k, v in load_file(f).items()
               if "post_layernorm.bias" not in k}
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ModelLoadError, match="post_layernorm.bias"):
        Gemma3Vision.load(host, tmp_path, cfg)


def test_pixels_of_another_size_are_refused(host, checkpoint):
    _, d, cfg = checkpoint
    tower = Gemma3Vision.load(host, d, cfg)
    size = cfg["vision_config"]["image_size"]
    with pytest.raises(ValueError, match=f"pixel_values must be \\(n, 3, {size}, {size}\\)"):
        tower.encode(pixels(1, size + 4))
    # The core checks the pixels it is handed as well (it cuts the patches itself).
    with pytest.raises(ValueError, match=f"pixels must be \\(n_images, 3, {size}, {size}\\) float32"):
        tower._core.encode(pixels(1, size)[:, :2].copy())


def test_16bit_operands_stay_within_transformers_bf16_error(host, checkpoint):
    """operands_16bit, the default (the gemms' activations in the weights' 16-bit type,
    attention's Q and P in half) on matrix units: what it adds to the float path's
    distance from float32 transformers (f16 K/V) is no more than transformers' own
    bf16 run is from it. Devices without matrix units compute in float, to the bit."""
    import copy

    import torch
    model, d, cfg = checkpoint
    pv = pixels(2, cfg["vision_config"]["image_size"], seed=7)
    want = tiny_vlm.image_features(model, pv)
    fast = Gemma3Vision.load(host, d, cfg).encode(pv)  # the default
    plain = Gemma3Vision.load(host, d, cfg, operands_16bit=False).encode(pv)
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    with torch.no_grad():
        out = bf16.model.get_image_features(torch.from_numpy(pv).to(torch.bfloat16))
    theirs = (out.pooler_output if hasattr(out, "pooler_output") else out).float().numpy()
    err = {k: float(np.abs(v - want).max()) for k, v in (("16-bit", fast), ("float", plain), ("bf16", theirs))}
    assert err["16-bit"] <= err["float"] + err["bf16"], err
    if host.properties["matrix_units"]:
        assert not np.array_equal(fast, plain)  # the rounding is real
    else:
        np.testing.assert_array_equal(fast, plain)
