"""Gemma 3n's audio tower and embedder (cpp/towers/conformer.h, models/audio.py) against
transformers' Gemma3nModel.get_audio_features on tiny random checkpoints (tiny_audio):
a causal window and one with keys ahead, whole clips and clips with padding frames, a
clip shorter than one output row; each run padded to the placeholder's length as
Gemma3nModel pads it. Then what the loader refuses."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from metalkv import _core  # noqa: E402
from metalkv.models.audio import Gemma3nAudio, conformer_spec  # noqa: E402
from metalkv.models.errors import ModelLoadError  # noqa: E402

from . import tiny_audio  # noqa: E402
from devices import TEST_DEVICE  # tests/ is on sys.path  # noqa: E402


@pytest.fixture(scope="module", params=list(tiny_audio.AUDIO))
def checkpoint(request, tmp_path_factory):
    model = tiny_audio.build(request.param)
    d = tiny_audio.save(model, tmp_path_factory.mktemp(f"audio_{request.param}"))
    return model, d, json.loads((d / "config.json").read_text()), request.param


@pytest.fixture(scope="module")
def device():
    return _core.Device(TEST_DEVICE)


@pytest.fixture(scope="module")
def tower(device, checkpoint):
    _, d, cfg, _ = checkpoint
    return Gemma3nAudio.load(device, d, cfg)


# (frames, valid frames): whole clips filling the run, padding frames (their rows become
# the padding token's), one frame
CLIPS = {"tiny": [(160, 160), (160, 100), (41, 41), (1, 1)], "ahead": [(90, 90), (90, 41), (7, 7)]}


def test_tower_matches_transformers(checkpoint, tower):
    model, _, cfg, name = checkpoint
    n_mels = cfg["audio_config"]["input_feat_size"]
    for n_frames, n_valid in CLIPS[name]:
        feats = tiny_audio.features(n_frames, n_mels, seed=n_frames + n_valid)
        want = tiny_audio.audio_features(model, feats, n_valid)
        got = tower.encode(feats, n_valid)
        assert got.shape == want.shape == (tiny_audio.TOKENS_PER_CLIP, tiny_audio.TEXT["hidden_size"])
        # float32 throughout, the reductions in another order: ~1e-6 of the rows' scale
        np.testing.assert_allclose(got, want, atol=1e-5 * np.abs(want).max(), rtol=0,
                                   err_msg=f"{n_frames} frames, {n_valid} valid")


def test_padding_rows_are_the_padding_token(checkpoint, tower):
    model, _, cfg, _ = checkpoint
    import torch
    with torch.no_grad():
        pad = model.model.embed_audio(input_ids=torch.tensor([[tiny_audio.VOCAB - 1]]))[0, 0].numpy()
        eoa = model.model.embed_audio(input_ids=torch.tensor([[tiny_audio.EOA]]))[0, 0].numpy()
    np.testing.assert_allclose(tower.hard_row(tiny_audio.VOCAB - 1), pad, atol=1e-5)
    np.testing.assert_allclose(tower.hard_row(tiny_audio.EOA), eoa, atol=1e-5)
    assert tower.hard_row(tiny_audio.EOA - 1) is None  # a text id: not the embedder's
    feats = tiny_audio.features(20, cfg["audio_config"]["input_feat_size"])
    got = tower.encode(feats, 20)
    made = tower.tokens_for(20)
    assert 0 < made < tiny_audio.TOKENS_PER_CLIP
    np.testing.assert_array_equal(got[made:], np.broadcast_to(tower.hard_row(tiny_audio.VOCAB - 1), got[made:].shape))


def test_bad_calls_are_refused(checkpoint, tower):
    _, _, cfg, _ = checkpoint
    n_mels = cfg["audio_config"]["input_feat_size"]
    with pytest.raises(ValueError, match=f"features must be \\(frames, {n_mels}\\)"):
        tower.encode(np.zeros((10, n_mels + 1), np.float32), 10)
    with pytest.raises(_core.GpuError, match="n_valid 11 must be in 1..10"):
        tower.encode(np.zeros((10, n_mels), np.float32), 11)
    frames = 40 * tiny_audio.TOKENS_PER_CLIP
    with pytest.raises(_core.GpuError, match=f"a clip of {frames} frames makes .* soft tokens; its run holds 12"):
        tower.encode(np.zeros((frames, n_mels), np.float32), frames)


def test_a_config_without_audio_has_no_tower(device, tmp_path):
    assert Gemma3nAudio.load(device, tmp_path, {"model_type": "gemma3n_text"}) is None
    assert Gemma3nAudio.load(device, tmp_path, {"model_type": "gemma3n"}) is None


def test_the_loader_refuses_what_it_cannot_run(device, checkpoint, tmp_path):
    from safetensors.numpy import load_file, save_file
    _, d, cfg, _ = checkpoint
    clipped = dict(cfg, audio_config=dict(cfg["audio_config"], gradient_clipping=10.0))
    with pytest.raises(ModelLoadError, match="gradient_clipping 10 could bind"):
        conformer_spec(clipped)
    short = dict(cfg, audio_config=dict(cfg["audio_config"], vocab_size=8))
    with pytest.raises(ModelLoadError, match="must end the text model's 256 ids"):
        conformer_spec(short)
    tensors = {k: v for f in d.glob("*.safetensors") for k, v in load_file(f).items()
               if not k.endswith("conformer.1.lconv1d.linear_end.weight")}
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ModelLoadError, match="conformer.1.lconv1d.linear_end.weight"):
        Gemma3nAudio.load(device, tmp_path, cfg)
