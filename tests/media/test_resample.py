"""The windowed-sinc resampler on tones: below the new Nyquist frequency a tone keeps its
frequency and amplitude; above it, it is removed rather than folded back (aliased).

A tone's frequency and amplitude are read by a least-squares fit of a sine at the expected
frequency, 0.1 s in from each end (the filter sees silence past the clip's ends): a wrong
frequency would leave a residual growing with time, a wrong gain a wrong amplitude.
"""
from __future__ import annotations

import numpy as np
import pytest

from metalkv.media import resample

from .sounds import tone

TRIM = 1600  # 0.1 s at 16 kHz


def fitted(y: np.ndarray, frequency: float, rate: int) -> tuple[float, float]:
    """(amplitude, rms residual) of the best sine at `frequency` through y's middle."""
    t = np.arange(len(y)) / rate
    basis = np.stack([np.cos(2 * np.pi * frequency * t), np.sin(2 * np.pi * frequency * t)], axis=1)[TRIM:-TRIM]
    y = y[TRIM:-TRIM].astype(np.float64)
    coefficients, *_ = np.linalg.lstsq(basis, y, rcond=None)
    return float(np.hypot(*coefficients)), float(np.sqrt(np.mean((y - basis @ coefficients) ** 2)))


@pytest.mark.parametrize("rate", [22_050, 44_100, 48_000])
@pytest.mark.parametrize("frequency", [100, 1000, 3000, 5000, 7000, 7400])
def test_a_tone_in_the_passband_keeps_frequency_and_amplitude(rate, frequency):
    """Within 0.1 % of amplitude (0.01 dB), with a residual under 1e-4 of it, up to 7.4 kHz."""
    y = resample(tone(frequency, rate), rate, 16_000)
    assert y.dtype == np.float32 and len(y) == 8000
    amplitude, residual = fitted(y, frequency, 16_000)
    assert abs(amplitude / 0.5 - 1) < 1e-3
    assert residual / 0.5 < 1e-4


@pytest.mark.parametrize("frequency", [500, 3000])
def test_upsampling_from_8khz(frequency):
    amplitude, residual = fitted(resample(tone(frequency, 8000), 8000, 16_000), frequency, 16_000)
    assert abs(amplitude / 0.5 - 1) < 1e-3 and residual / 0.5 < 1e-4


def test_top_of_gemma3n_mel_range_loses_under_a_fifth_of_a_db():
    amplitude, _ = fitted(resample(tone(7600, 48_000), 48_000, 16_000), 7600, 16_000)
    assert -0.2 < 20 * np.log10(amplitude / 0.5) < 0


@pytest.mark.parametrize("rate", [22_050, 44_100, 48_000])
@pytest.mark.parametrize("frequency", [8200, 9000, 10_000])
def test_a_tone_16khz_cannot_hold_is_removed_not_aliased(rate, frequency):
    """At least 90 dB down (an alias of 10 kHz would sit at 6 kHz at full amplitude)."""
    y = resample(tone(frequency, rate), rate, 16_000)[TRIM:-TRIM].astype(np.float64)
    assert 20 * np.log10(np.sqrt(np.mean(y ** 2)) / (0.5 / np.sqrt(2))) < -90


def test_lengths_and_the_same_rate():
    x = tone(440, 44_100, seconds=0.0301)  # 1327 samples
    assert len(resample(x, 44_100, 16_000)) == -(-1327 * 16_000 // 44_100)
    same = resample(x, 16_000, 16_000)
    assert np.array_equal(same, x) and same is not x
