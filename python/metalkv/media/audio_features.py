"""Gemma 3n's audio features: a 16 kHz clip -> log-mel frames, as Gemma3nAudioFeatureExtractor
computes them for one clip (its batch of one: padded to a multiple of 128 samples).

    feats = log_mel_features(load_audio("clip.wav"), AudioFeatureConfig.from_preprocessor_config(cfg))
    feats.features   # (frames, 128) float32, frames = (padded - 513) // 160 + 1
    feats.mask       # (frames,) bool, True where a frame starts inside the clip

Per frame: frame_length + 1 samples, pre-emphasized (HTK: the first sample scaled by
1 - coeff, the extra last sample unused), times a periodic Hann window, |FFT| of fft_length,
mel filters, natural log floored at mel_floor. The frames and their FFT are float32, the mel
product and log float64, as in the reference, so the two agree to the last float32 bit or so.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .audio_config import AudioFeatureConfig
from .errors import MediaError
from .mel import mel_filters, periodic_hann


@dataclass(frozen=True)
class AudioFeatures:
    features: np.ndarray  # (frames, feature_size) float32 log-mel
    mask: np.ndarray      # (frames,) bool: the frame's first sample is the clip's, not padding


def log_mel_features(samples: np.ndarray, config: AudioFeatureConfig) -> AudioFeatures:
    """Features of one mono clip at config.sampling_rate (load_audio gives one)."""
    x = np.asarray(samples, dtype=np.float32)
    if x.ndim != 1:
        raise MediaError(f"[audio] samples of shape {x.shape}: expected one mono clip, shape (n,)")
    rate, m = config.sampling_rate, config.pad_to_multiple_of
    if len(x) > config.max_samples:
        raise MediaError(f"[audio] a clip of {len(x):,} samples ({len(x) / rate:.1f} s): Gemma 3n's features take at "
                         f"most {config.max_samples:,} ({config.max_samples / rate:g} s; transformers cuts the rest "
                         "off): cut it into shorter clips")
    padded = np.full(-(-len(x) // m) * m, config.padding_value, dtype=np.float32)
    padded[:len(x)] = x
    span = config.frame_length + 1  # one sample more than a frame: the pre-emphasis reads it
    if len(padded) < span:
        shortest = (-(-span // m) - 1) * m + 1  # padded to a multiple of m, it holds one frame
        raise MediaError(f"[audio] a clip of {len(x)} samples ({1000 * len(x) / rate:.0f} ms): expected at least "
                         f"{shortest} samples, one {1000 * config.frame_length / rate:g} ms frame after padding")
    if config.input_scale_factor != 1.0:
        padded = padded * np.float32(config.input_scale_factor)
    windows = np.lib.stride_tricks.sliding_window_view(padded, span)[::config.hop_length]  # (frames, span)
    frames = _preemphasize(windows, config) * periodic_hann(config.frame_length)
    magnitude = np.abs(np.fft.rfft(frames, n=config.fft_length, axis=-1))    # float32 in, complex64 out
    filters = mel_filters(config.feature_size, config.min_frequency, config.max_frequency, rate, config.fft_length)
    log_mel = np.log(np.maximum(magnitude @ filters, config.mel_floor))       # float64
    if config.per_bin_mean is not None:
        log_mel = log_mel - np.asarray(config.per_bin_mean)
    if config.per_bin_stddev is not None:
        log_mel = log_mel / np.asarray(config.per_bin_stddev)
    starts = np.arange(len(windows)) * config.hop_length
    return AudioFeatures(features=log_mel.astype(np.float32), mask=starts < len(x))


def _preemphasize(windows: np.ndarray, config: AudioFeatureConfig) -> np.ndarray:
    """(frames, frame_length + 1) -> (frames, frame_length)."""
    c = config.preemphasis
    if c <= 0:
        return windows[:, :-1]
    if config.preemphasis_htk_flavor:  # HTK: y[0] = x[0] - c x[0], then y[i] = x[i] - c x[i-1] within the frame
        return np.concatenate([windows[:, :1] * (1.0 - c), windows[:, 1:-1] - c * windows[:, :-2]], axis=-1)
    return windows[:, 1:] - c * windows[:, :-1]
