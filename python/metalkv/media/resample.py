"""Band-limited resampling in numpy: a Kaiser-windowed sinc evaluated at each output instant.

The low-pass cutoff sits at ROLLOFF of the lower rate's Nyquist frequency; the sinc keeps
ZERO_CROSSINGS lobes each side. Measured to 16 kHz from 22.05, 44.1 and 48 kHz
(tests/media/test_resample.py): a tone up to 7.4 kHz keeps its frequency, and its amplitude
within 0.1 % (0.01 dB); at 7.6 kHz, the top of Gemma 3n's mel filters, it loses 0.13 dB; a
tone from 8.2 kHz up, which 16 kHz cannot hold, is attenuated by 90 dB or more rather than
folded back. About 0.6 s for 30 s of 48 kHz on one core. A clip is silent outside its ends.

Output instant n sits at input position n * from_rate / to_rate, whose fractional part takes
only to_rate / gcd values: the filter is tabulated once per phase (polyphase), then applied as
one gather and multiply-add per block of outputs.
"""
from __future__ import annotations

import math

import numpy as np

ZERO_CROSSINGS = 64
ROLLOFF = 0.98
KAISER_BETA = 9.0
_BLOCK = 4096  # outputs per gather: bounds the temporary at _BLOCK x taps float64


def resample(samples: np.ndarray, from_rate: int, to_rate: int) -> np.ndarray:
    """(n,) float32 at from_rate -> (ceil(n * to_rate / from_rate),) float32 at to_rate."""
    x = np.asarray(samples, dtype=np.float32)
    if from_rate == to_rate:
        return x.copy()
    g = math.gcd(from_rate, to_rate)
    up, down = to_rate // g, from_rate // g
    cutoff = ROLLOFF * min(1.0, to_rate / from_rate)   # in cycles per input sample x 2 (1 = input Nyquist)
    half = math.ceil(ZERO_CROSSINGS / cutoff)          # taps each side, in input samples
    offsets = np.arange(-half + 1, half + 1)           # input samples around floor(position)
    table = _filter_table(up, offsets, cutoff, half)   # (up, 2 * half)
    padded = np.concatenate([np.zeros(half), x.astype(np.float64), np.zeros(half + 1)])
    n_out = -(-len(x) * up // down)
    out = np.empty(n_out, dtype=np.float32)
    for start in range(0, n_out, _BLOCK):
        n = np.arange(start, min(start + _BLOCK, n_out), dtype=np.int64)
        base, phase = np.divmod(n * down, up)          # output n at input position base + phase / up
        taps = padded[(base + half)[:, None] + offsets[None, :]]
        out[start:start + len(n)] = np.einsum("ij,ij->i", taps, table[phase])
    return out


def _filter_table(up: int, offsets: np.ndarray, cutoff: float, half: int) -> np.ndarray:
    """Weight of input sample floor(t) + offset for an output at fractional position phase / up."""
    d = (np.arange(up)[:, None] / up) - offsets[None, :]   # output minus input position, input samples
    u = np.clip(d / half, -1.0, 1.0)
    window = np.i0(KAISER_BETA * np.sqrt(1.0 - u * u)) / np.i0(KAISER_BETA)
    return cutoff * np.sinc(cutoff * d) * window
