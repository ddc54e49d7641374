"""Gemma 3n's log-mel features against transformers' Gemma3nAudioFeatureExtractor, on generated
signals (a tone, a chirp, white noise, silence) of several lengths, one of them not a whole
number of hops and one the 30 s maximum.

The bound is one float32 rounding of the largest feature (|log-mel| <= 12: about 1e-6): what a
reordered float64 sum could move. Today the two agree bit for bit, because metalkv takes the
same dtypes at each step (float32 frames and FFT, float64 mel product and log).
"""
from __future__ import annotations

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")

from metalkv.media import AudioFeatureConfig, MediaError, log_mel_features  # noqa: E402
from metalkv.media.mel import mel_filters, periodic_hann  # noqa: E402

from . import checkpoints  # noqa: E402
from .sounds import signal  # noqa: E402

# 513: the shortest clip with a frame; 16_037: not a whole number of hops nor of the 128-sample padding
LENGTHS = [513, 1000, 16_000, 16_037, 160_000, 480_000]


def reference(samples: np.ndarray, **config):
    extractor = transformers.Gemma3nAudioFeatureExtractor(**config)
    out = extractor(samples, return_tensors="np")
    return out["input_features"][0], out["input_features_mask"][0]


def assert_close_to_float32_rounding(ours: np.ndarray, theirs: np.ndarray):
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype == np.float32
    bound = np.spacing(np.abs(theirs).max())  # one float32 step at the largest feature
    assert np.abs(ours - theirs).max() <= bound


@pytest.mark.parametrize("kind", ["tone", "chirp", "noise", "silence"])
@pytest.mark.parametrize("n", LENGTHS)
def test_features_and_mask_equal_the_extractors(kind, n):
    samples = signal(kind, n)
    ours = log_mel_features(samples, AudioFeatureConfig.from_preprocessor_config(checkpoints.GEMMA3N))
    features, mask = reference(samples)
    assert_close_to_float32_rounding(ours.features, features)
    padded = -(-n // 128) * 128
    assert ours.features.shape == ((padded - 513) // 160 + 1, 128) and ours.mask.dtype == bool
    assert np.array_equal(ours.mask, mask)


def test_shapes_and_mask_of_a_clip_not_a_whole_number_of_hops():
    """16,037 samples pad to 16,128: (16,128 - 513) // 160 + 1 = 98 frames; frame 97 starts at
    sample 15,520, inside the clip, so every frame is marked."""
    ours = log_mel_features(signal("tone", 16_037), AudioFeatureConfig.from_preprocessor_config({}))
    assert ours.features.shape == (98, 128) and ours.mask.all()
    thirty = log_mel_features(signal("tone", 480_000), AudioFeatureConfig.from_preprocessor_config({}))
    assert thirty.features.shape == (2997, 128)


@pytest.mark.parametrize("config", [
    {"preemphasis_htk_flavor": False},
    {"preemphasis": 0.0},
    {"input_scale_factor": 0.5, "mel_floor": 1e-3},
    {"frame_length_ms": 25.0, "hop_length_ms": 12.5, "fft_overdrive": False},
    {"feature_size": 80, "min_frequency": 60.0, "max_frequency": 7000.0},
    {"per_bin_mean": list(np.linspace(-8, 2, 128)), "per_bin_stddev": list(np.linspace(1, 3, 128))},
])
def test_every_setting_is_honoured(config):
    samples = signal("chirp", 20_000)
    ours = log_mel_features(samples, AudioFeatureConfig.from_preprocessor_config(config))
    features, mask = reference(samples, **config)
    assert_close_to_float32_rounding(ours.features, features)
    assert np.array_equal(ours.mask, mask)


def test_defaults_are_the_extractors():
    extractor = transformers.Gemma3nAudioFeatureExtractor()
    ours = AudioFeatureConfig.from_preprocessor_config({})
    assert ours == AudioFeatureConfig.from_preprocessor_config(checkpoints.GEMMA3N)
    assert (ours.frame_length, ours.hop_length, ours.fft_length) == (
        extractor.frame_length, extractor.hop_length, extractor.fft_length) == (512, 160, 1024)
    filters = mel_filters(ours.feature_size, ours.min_frequency, ours.max_frequency, 16_000, ours.fft_length)
    assert np.array_equal(filters, extractor.mel_filters) and filters.shape == (513, 128)
    assert np.array_equal(periodic_hann(512), extractor.window)


def test_refusals():
    config = AudioFeatureConfig.from_preprocessor_config({})
    with pytest.raises(MediaError, match=r"\[audio\] a clip of 480,001 samples \(30.0 s\): Gemma 3n's features take "
                                         r"at most 480,000 \(30 s; transformers cuts the rest off\)"):
        log_mel_features(np.zeros(480_001, np.float32), config)
    with pytest.raises(MediaError, match=r"a clip of 512 samples \(32 ms\): expected at least 513 samples, one 32 ms "
                                         r"frame after padding"):
        log_mel_features(np.zeros(512, np.float32), config)
    with pytest.raises(MediaError, match=r"samples of shape \(2, 1000\): expected one mono clip, shape \(n,\)"):
        log_mel_features(np.zeros((2, 1000), np.float32), config)
    for bad, message in [({"dither": 1e-4}, r"dither=0.0001: expected 0 \(transformers adds unseeded noise"),
                         ({"padding_side": "left"}, r"padding_side='left': expected 'right'"),
                         ({"per_bin_mean": [0.0] * 3}, r"per_bin_mean: expected 128 numbers \(one per mel bin\), "
                                                       r"got list of 3"),
                         ({"sampling_rate": 0}, r"sampling_rate=0: expected a positive int"),
                         ({"feature_size": 12.5}, r"feature_size=12.5: expected a positive int")]:
        with pytest.raises(MediaError, match=r"\[audio\] preprocessor config " + message):
            AudioFeatureConfig.from_preprocessor_config(bad)
