"""The fixed tables of Gemma 3n's log-mel features: the analysis window and the mel filters."""
from __future__ import annotations

import math

import numpy as np


def periodic_hann(length: int) -> np.ndarray:
    """(length,) float32: 0.5 - 0.5 cos(2 pi n / length), computed in float32 as the reference does."""
    n = np.arange(length, dtype=np.float32)
    return (0.5 * (1 - np.cos(2 * np.pi * n / length))).astype(np.float32)


def mel_filters(n_mels: int, min_hz: float, max_hz: float, sample_rate: int, fft_length: int) -> np.ndarray:
    """(fft_length // 2 + 1, n_mels) float64 triangles, unnormalized (each peaks at 1): filter m
    rises from edge m to edge m + 1 and falls to edge m + 2 of n_mels + 2 edges spaced evenly on
    HTK's mel scale, 2595 log10(1 + hz / 700)."""
    bins = np.arange(fft_length // 2 + 1, dtype=np.float32) * (sample_rate / fft_length)  # Hz, float32 as the reference
    mels = np.linspace(2595.0 * math.log10(1.0 + min_hz / 700.0), 2595.0 * math.log10(1.0 + max_hz / 700.0), n_mels + 2)
    edges = 700.0 * (10 ** (mels / 2595.0) - 1.0)
    lower, centre, upper = edges[:-2], edges[1:-1], edges[2:]
    f = bins[:, None].astype(np.float64)
    rising = (f - lower) / (centre - lower)
    falling = (upper - f) / (upper - centre)
    return np.maximum(0.0, np.minimum(rising, falling))
