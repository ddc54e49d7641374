"""The audio tower's kernels (metal/audio.metal) against float64 numpy written from
transformers' Gemma 3n audio modules: im2col of a padded strided convolution, the
cumulative group norm (+ ReLU), the conformer's local attention with relative positions
and a soft cap, the causal depthwise convolution, GLU, strided rows and SiLU. Rows that
reduce run with one SIMD-group (the host's shape) and eight (a GPU's)."""
from __future__ import annotations

import numpy as np
import pytest
from gpu.kernels import run

ELEMENTS = 256  # threads a threadgroup of the one-thread-an-element kernels


def params(*fields) -> bytes:
    return b"".join(np.float32(f).tobytes() if isinstance(f, float) else np.uint32(f).tobytes() for f in fields)


def groups(n: int) -> int:
    return -(-n // ELEMENTS)


@pytest.mark.parametrize("t_in,f_in,c_in,k,s", [(7, 10, 1, (3, 3), (2, 2)), (6, 5, 3, (3, 2), (1, 2))])
def test_im2col(dev, t_in, f_in, c_in, k, s):
    rng = np.random.default_rng(t_in)
    x = rng.normal(size=(t_in, f_in, c_in)).astype(np.float32)
    (kt, kf), (st, sf) = k, s
    # transformers' padding: time kt - 1 after, frequency 1 each side
    padded = np.pad(x, ((0, kt - 1), (1, 1), (0, 0)))
    t_out, f_out = (t_in - 1) // st + 1, (f_in + 2 - kf) // sf + 1
    width = c_in * kt * kf
    cols = -(-width // 4) * 4
    want = np.zeros((t_out * f_out, cols), np.float32)
    for t in range(t_out):
        for f in range(f_out):
            patch = padded[t * st:t * st + kt, f * sf:f * sf + kf, :]  # (kt, kf, c)
            want[t * f_out + f, :width] = patch.transpose(2, 0, 1).reshape(-1)  # (c, i, j), torch's weight order
    out = np.full_like(want, np.nan)
    got = run(dev, "im2col_f32", [params(t_in, f_in, c_in, kt, kf, st, sf, 0, 1, t_out, f_out, cols), x, out],
              groups(out.size), ELEMENTS)
    np.testing.assert_array_equal(got[2], want)


@pytest.mark.parametrize("simds", [1, 8])
@pytest.mark.parametrize("rows,dim,channels", [(1, 8, 4), (9, 24, 8), (40, 300, 3)])
def test_cumulative_norm(dev, simds, rows, dim, channels):
    rng = np.random.default_rng(rows)
    x = (rng.normal(size=(rows, dim)) * 2 + np.linspace(-3, 3, rows)[:, None]).astype(np.float32)
    w = (1 + 0.2 * rng.normal(size=channels)).astype(np.float32)
    eps = 1e-3
    x64 = x.astype(np.float64)
    want = np.zeros_like(x64)
    for t in range(rows):  # statistics over every value of rows 0..t
        seen = x64[:t + 1]
        mean = seen.sum() / seen.size
        # Gemma 3n's variance: each row's squared differences from *its own* cumulative mean, summed
        var = sum(((x64[u] - x64[:u + 1].mean()) ** 2).sum() for u in range(t + 1)) / seen.size
        want[t] = np.maximum((x64[t] - mean) / np.sqrt(var + eps) * np.tile(w, dim // channels), 0)
    stats = np.zeros(2 * rows, np.float32)
    out = np.zeros_like(x)
    for p in range(3):
        got = run(dev, "cumulative_norm_f32", [params(rows, dim, channels, p, eps), x, w, stats, out], rows, 32 * simds)
        stats, out = got[3], got[4]
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


def attention_reference(q, k, v, pos, qscale, heads, left, right, n_valid, cap):
    """One query at a time, as Gemma3nAudioAttention computes it on its blocks."""
    n, width = q.shape
    d = width // heads
    q, k, v, pos = (a.astype(np.float64).reshape(len(a), heads, d) for a in (q, k, v, pos))
    out = np.zeros((n, heads, d))
    for t in range(n):
        keys = [u for u in range(t - left, t + right + 1) if 0 <= u < n_valid]
        if not keys:
            continue
        for h in range(heads):
            qs = q[t, h] * qscale
            s = np.array([qs @ (k[u, h] + pos[left - (t - u), h]) for u in keys])
            s = cap * np.tanh(s / cap)
            p = np.exp(s - s.max())
            out[t, h] = (p / p.sum()) @ v[keys, h]
    return out.reshape(n, width)


@pytest.mark.parametrize("n,heads,d,left,right,n_valid", [
    (20, 4, 16, 4, 0, 20),     # causal window, every key valid
    (17, 2, 48, 3, 2, 11),     # keys ahead; padding past 11 (queries there see the valid ones)
    (9, 1, 192, 12, 0, 9),     # Gemma 3n's head_dim and window
    (6, 2, 8, 2, 1, 3),        # queries past the padding whose window holds no valid key: zeros
])
def test_audio_attention(dev, n, heads, d, left, right, n_valid):
    rng = np.random.default_rng(n + d)
    width = heads * d
    q, k, v = (rng.normal(size=(n, width)).astype(np.float32) for _ in range(3))
    pos = rng.normal(size=(left + right + 1, width)).astype(np.float32)
    qscale = (0.5 + rng.random(d)).astype(np.float32)
    cap = 3.0  # low enough to bend the scores
    want = attention_reference(q, k, v, pos, qscale, heads, left, right, n_valid, cap)
    out = np.full((n, width), np.nan, np.float32)
    got = run(dev, "audio_attention_f32", [params(n, n_valid, heads, d, left, right, cap), q, k, v, pos, qscale, out],
              n * heads, 32)
    np.testing.assert_allclose(got[6], want, rtol=2e-5, atol=2e-5)


def test_depthwise_conv(dev):
    rng = np.random.default_rng(5)
    n, c, taps = 13, 7, 5
    x = rng.normal(size=(n, c)).astype(np.float32)
    w = rng.normal(size=(taps, c)).astype(np.float32)  # torch's (c, 1, taps), stored (taps, c)
    padded = np.concatenate([np.zeros((taps - 1, c)), x.astype(np.float64)])
    want = np.stack([(padded[t:t + taps] * w).sum(0) for t in range(n)])
    got = run(dev, "depthwise_conv_f32", [params(n, c, taps), x, w, np.zeros_like(x)], groups(x.size), ELEMENTS)
    np.testing.assert_allclose(got[3], want, rtol=1e-6, atol=1e-6)


def test_glu(dev):
    x = np.random.default_rng(6).normal(size=(5, 2 * 33)).astype(np.float32) * 4
    a, b = x[:, :33].astype(np.float64), x[:, 33:].astype(np.float64)
    got = run(dev, "glu_f32", [params(5, 33, 0), x, np.zeros((5, 33), np.float32)], groups(5 * 33), ELEMENTS)
    np.testing.assert_allclose(got[2], a / (1 + np.exp(-b)), rtol=1e-6, atol=1e-6)


def test_take_rows(dev):
    x = np.arange(10 * 6, dtype=np.float32).reshape(10, 6)
    got = run(dev, "take_rows_f32", [params(3, 6, 4), x, np.zeros((3, 6), np.float32)], 1, ELEMENTS)
    np.testing.assert_array_equal(got[2], x[::4])


def test_silu(dev):
    x = np.linspace(-20, 20, 3001, dtype=np.float32)
    got = run(dev, "silu_f32", [params(x.size, 0.0), x.copy()], -(-x.size // 2048), 256)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(got[1], x64 / (1 + np.exp(-x64)), rtol=1e-6, atol=1e-6)
