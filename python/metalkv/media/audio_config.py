"""How Gemma 3n wants its audio features computed, read from preprocessor_config.json (a dict)
with Gemma3nAudioFeatureExtractor's defaults for absent or null keys.

    feature_size 128 mel bins       sampling_rate 16000         frame 32 ms = 512 samples
    hop 10 ms = 160 samples         FFT 1024 (512 doubled: fft_overdrive)
    mel 125 to 7600 Hz (HTK scale)  preemphasis 0.97 (HTK)      log floor 1e-5

The frame, hop and FFT lengths follow from frame_length_ms, hop_length_ms and fft_overdrive:
transformers ignores the frame_length, hop_length and fft_length keys that released configs
also hold (the same numbers), and so does metalkv. A clip is padded to a multiple of 128
samples and may be at most 480,000 samples (30 s): the extractor's own call defaults.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from .errors import MediaError

_DEFAULTS: dict[str, Any] = {
    "feature_size": 128, "sampling_rate": 16_000, "padding_value": 0.0, "frame_length_ms": 32.0,
    "hop_length_ms": 10.0, "min_frequency": 125.0, "max_frequency": 7600.0, "preemphasis": 0.97,
    "preemphasis_htk_flavor": True, "fft_overdrive": True, "dither": 0.0, "input_scale_factor": 1.0,
    "mel_floor": 1e-5, "per_bin_mean": None, "per_bin_stddev": None, "padding_side": "right",
}


@dataclass(frozen=True)
class AudioFeatureConfig:
    feature_size: int            # mel bins
    sampling_rate: int           # Hz the clip must be at
    frame_length: int            # samples per frame
    hop_length: int              # samples between frame starts
    fft_length: int
    min_frequency: float         # Hz, the lowest mel filter's lower edge
    max_frequency: float         # Hz, the highest mel filter's upper edge
    preemphasis: float           # 0: none
    preemphasis_htk_flavor: bool
    mel_floor: float             # log(max(mel, mel_floor))
    padding_value: float
    input_scale_factor: float
    per_bin_mean: tuple[float, ...] | None    # (feature_size,), subtracted from the log-mel
    per_bin_stddev: tuple[float, ...] | None  # (feature_size,), divided into it
    pad_to_multiple_of: int = 128
    max_samples: int = 480_000

    @classmethod
    def from_preprocessor_config(cls, config: Mapping[str, Any]) -> "AudioFeatureConfig":
        if not isinstance(config, Mapping):
            raise MediaError(f"[audio] preprocessor config is a {type(config).__name__}: expected a dict "
                             "(preprocessor_config.json as json.load gives it)")
        given = {**_DEFAULTS, **{k: v for k, v in config.items() if k in _DEFAULTS and v is not None}}
        if given["dither"] != 0:
            raise MediaError(f"[audio] preprocessor config dither={given['dither']!r}: expected 0 (transformers "
                             "adds unseeded noise, which no two runs share)")
        if given["padding_side"] != "right":
            raise MediaError(f"[audio] preprocessor config padding_side={given['padding_side']!r}: expected 'right'")
        rate = _positive(given, "sampling_rate", int)
        frame_length = int(round(rate * _positive(given, "frame_length_ms") / 1000.0))
        hop_length = int(round(rate * _positive(given, "hop_length_ms") / 1000.0))
        if frame_length < 1 or hop_length < 1:
            raise MediaError(f"[audio] preprocessor config: frames of {frame_length} and hops of {hop_length} samples "
                             "at this sampling_rate: expected at least 1 each")
        fft_length = 2 ** math.ceil(math.log2(frame_length)) * (2 if given["fft_overdrive"] else 1)
        n_mels = _positive(given, "feature_size", int)
        return cls(feature_size=n_mels, sampling_rate=rate, frame_length=frame_length, hop_length=hop_length,
                   fft_length=fft_length, min_frequency=float(given["min_frequency"]),
                   max_frequency=_positive(given, "max_frequency"), preemphasis=float(given["preemphasis"]),
                   preemphasis_htk_flavor=bool(given["preemphasis_htk_flavor"]),
                   mel_floor=_positive(given, "mel_floor"), padding_value=float(given["padding_value"]),
                   input_scale_factor=float(given["input_scale_factor"]),
                   per_bin_mean=_per_bin(given, "per_bin_mean", n_mels),
                   per_bin_stddev=_per_bin(given, "per_bin_stddev", n_mels))


def _positive(given, key: str, kind=float):
    v = given[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or (kind is int and v != int(v)):
        raise MediaError(f"[audio] preprocessor config {key}={v!r}: expected a positive "
                         + ("int" if kind is int else "number"))
    return kind(v)


def _per_bin(given, key: str, n_mels: int) -> tuple[float, ...] | None:
    v = given[key]
    if v is None:
        return None
    if isinstance(v, (list, tuple)) and len(v) == n_mels and all(isinstance(x, (int, float)) for x in v):
        return tuple(float(x) for x in v)
    raise MediaError(f"[audio] preprocessor config {key}: expected {n_mels} numbers (one per mel bin), "
                     f"got {type(v).__name__}" + (f" of {len(v)}" if isinstance(v, (list, tuple)) else ""))
