"""Gemma 3n's per-row kernels (metal/altup.metal) against float64 numpy written
from transformers' Gemma3nTextAltUp, Gemma3nTextMLP and Gemma3nTextModel
(docs/research/issue37-gemma3n-gguf.md §1): AltUp's predict and correct, the
streams' magnitude matching and mean, the Gaussian top-k, the per-layer gate.
Run with one SIMD-group (the host's shape) and eight (a GPU's)."""
from __future__ import annotations

import numpy as np
import pytest
from gpu.kernels import run

from .reference import gelu_pytorch_tanh

N, ROWS, DIM, EPS = 4, 3, 96, 1e-6
SIMDS = [1, 8]


def params(*fields) -> bytes:
    return b"".join(np.float32(f).tobytes() if isinstance(f, float) else np.uint32(f).tobytes() for f in fields)


def route(x, norm_w, router):
    """tanh(router (rms_norm(x) norm_w) / dim), per row: (rows, N)."""
    xn = x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * norm_w
    return np.tanh((xn / x.shape[-1]) @ router.T)


def weights(rng):
    return (rng.normal(size=(N, ROWS, DIM)).astype(np.float32), rng.normal(size=DIM).astype(np.float32),
            rng.normal(size=(N, DIM)).astype(np.float32) * 4)


@pytest.mark.parametrize("simds", SIMDS)
@pytest.mark.parametrize("active", [0, 2])
def test_predict(dev, simds, active):
    rng = np.random.default_rng(active)
    X, norm_w, router = weights(rng)
    coefs = rng.normal(size=(N * N, N)).astype(np.float32)
    m = route(X[active].astype(np.float64), norm_w, router)           # (rows, N)
    C = (m @ coefs.T.astype(np.float64)).reshape(ROWS, N, N)          # C[r, k, j]
    want = X + np.einsum("rkj,jrd->krd", C, X)
    out = run(dev, "altup_predict_f32", [params(ROWS, DIM, N, active, ROWS * DIM, EPS), X, norm_w, router, coefs,
                                         np.zeros_like(X), np.zeros((ROWS, DIM), np.float32)], ROWS, 32 * simds)
    np.testing.assert_allclose(out[5], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out[6], out[5][active])


@pytest.mark.parametrize("simds", SIMDS)
def test_correct(dev, simds):
    rng = np.random.default_rng(7)
    pred, norm_w, router = weights(rng)
    act = rng.normal(size=(ROWS, DIM)).astype(np.float32)
    coefs = rng.normal(size=(N, N)).astype(np.float32)
    scale = rng.normal(size=DIM).astype(np.float32)
    active = 1
    coef = route(act.astype(np.float64), norm_w, router) @ coefs.T.astype(np.float64) + 1.0  # (rows, N)
    want = pred + coef.T[:, :, None] * (act - pred[active])[None]
    out = run(dev, "altup_correct_f32", [params(ROWS, DIM, N, active, ROWS * DIM, EPS), pred, act, norm_w, router,
                                         coefs, scale, np.zeros_like(pred), np.zeros_like(act)], ROWS, 32 * simds)
    np.testing.assert_allclose(out[7], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out[8], want[active] * scale, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("simds", SIMDS)
def test_magnitude_and_mean(dev, simds):
    rng = np.random.default_rng(3)
    ref = rng.normal(size=(ROWS, DIM)).astype(np.float32)
    y = (rng.normal(size=(N - 1, ROWS, DIM)) * [[[3.0]], [[0.1]], [[1e-4]]]).astype(np.float32)  # the last floored
    ms = np.maximum((y.astype(np.float64) ** 2).mean(-1, keepdims=True), 1e-5)
    want = y * np.sqrt((ref.astype(np.float64) ** 2).mean(-1, keepdims=True)) / np.sqrt(ms)
    out = run(dev, "altup_magnitude_f32", [params(ROWS, DIM, ROWS * DIM, 1e-5), ref, y], (ROWS, N - 1), 32 * simds)
    np.testing.assert_allclose(out[2], want, rtol=1e-5, atol=1e-7)
    mean = run(dev, "altup_mean_f32", [params(ROWS * DIM, N - 1, ROWS * DIM), ref, want.astype(np.float32),
                                      np.zeros_like(ref)], 1, 256)
    np.testing.assert_allclose(mean[3], (ref + want.sum(0)) / N, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("simds", SIMDS)
@pytest.mark.parametrize("p", [0.95, 0.5])
def test_gaussian_topk(dev, simds, p):
    from statistics import NormalDist

    rng = np.random.default_rng(11)
    x = (rng.normal(size=(ROWS, 640)) + 0.3).astype(np.float32)
    std_mul = np.float32(NormalDist().inv_cdf(p))
    x64 = x.astype(np.float64)
    cutoff = x64.mean(-1, keepdims=True) + x64.std(-1, keepdims=True) * std_mul  # population std (ddof 0)
    want = np.maximum(x64 - cutoff, 0)
    out = run(dev, "gaussian_topk_f32", [params(ROWS, 640, float(std_mul)), x], ROWS, 32 * simds)
    np.testing.assert_allclose(out[1], want, rtol=1e-5, atol=1e-5)
    kept = (out[1] > 0).mean()
    assert abs(kept - (1 - p)) < 0.05  # a Gaussian row keeps about 1 - p of its values


def test_per_layer_gate(dev):
    rng = np.random.default_rng(5)
    rows, P, layers = 5, 16, 3
    g = rng.normal(size=(rows, P)).astype(np.float32)
    inputs = rng.normal(size=(rows, layers * P)).astype(np.float32)
    layer = 2
    layer_columns = inputs.reshape(-1)[layer * P:]  # (the op's view: row r at r * layers * P)
    out = run(dev, "per_layer_gate_f32", [params(rows, P, layers * P), g, layer_columns], 1, 256)
    want = gelu_pytorch_tanh(g.astype(np.float64)) * inputs[:, layer * P:(layer + 1) * P]
    np.testing.assert_allclose(out[1], want, rtol=1e-5, atol=1e-6)
