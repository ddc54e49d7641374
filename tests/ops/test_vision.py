"""The vision towers' kernels (metal/vision.metal) against float64 numpy written
from torch's definitions: LayerNorm with a bias (mean, biased variance), the
tanh GELU, an image's patches as gemm rows (SigLIP's stride-patch convolution),
AvgPool2d over a channels-last patch grid, MobileNet-V5's depthwise
convolution with TensorFlow's "same" padding and its layer scale. Rows run with one
SIMD-group (the host's shape) and eight (a GPU's)."""
from __future__ import annotations

import numpy as np
import pytest
from gpu.kernels import run

from .reference import gelu_pytorch_tanh


def params(*fields) -> bytes:
    return b"".join(np.float32(f).tobytes() if isinstance(f, float) else np.uint32(f).tobytes() for f in fields)


@pytest.mark.parametrize("simds", [1, 8])
@pytest.mark.parametrize("dim", [1, 37, 1152])
def test_layer_norm(dev, simds, dim):
    rng = np.random.default_rng(dim)
    rows, eps = 5, 1e-6
    x = (rng.normal(size=(rows, dim)) * 3 + 7).astype(np.float32)  # a mean far from 0
    w, b = rng.normal(size=dim).astype(np.float32), rng.normal(size=dim).astype(np.float32)
    x64 = x.astype(np.float64)
    mean = x64.mean(-1, keepdims=True)
    var = ((x64 - mean) ** 2).mean(-1, keepdims=True)
    want = (x64 - mean) / np.sqrt(var + eps) * w + b
    out = run(dev, "layer_norm_f32", [params(rows, dim, eps), x, w, b, np.zeros_like(x)], rows, 32 * simds)
    np.testing.assert_allclose(out[4], want, rtol=2e-5, atol=2e-5)


def test_gelu(dev):
    x = np.linspace(-12, 12, 5003, dtype=np.float32)
    out = run(dev, "gelu_f32", [params(x.size, 0.0), x.copy()], -(-x.size // 2048), 256)
    np.testing.assert_allclose(out[1], gelu_pytorch_tanh(x.astype(np.float64)), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("n_images,channels,grid,patch,patch_dim", [(1, 3, 2, 2, 12), (2, 3, 3, 5, 76), (1, 1, 4, 3, 9)])
def test_image_patches(dev, n_images, channels, grid, patch, patch_dim):
    """Row gy grid + gx: the patch at (gy, gx), its (channel, y, x) values, then zeros to patch_dim."""
    rng = np.random.default_rng(grid * patch)
    side = grid * patch
    x = rng.normal(size=(n_images, channels, side, side)).astype(np.float32)
    want = np.zeros((n_images, grid * grid, patch_dim), np.float32)
    for n in range(n_images):
        for gy in range(grid):
            for gx in range(grid):
                window = x[n, :, gy * patch:(gy + 1) * patch, gx * patch:(gx + 1) * patch]  # (channel, y, x)
                want[n, gy * grid + gx, :window.size] = window.reshape(-1)
    out = np.full(want.shape, np.nan, np.float32)  # the padding zeros are written, not left
    got = run(dev, "image_patches_f32", [params(n_images, channels, grid, patch, patch_dim), x, out],
              -(-out.size // 256), 256)
    np.testing.assert_array_equal(got[2], want)


@pytest.mark.parametrize("n_images,side,k,channels", [(1, 8, 2, 3), (2, 12, 4, 5), (1, 64, 4, 16)])
def test_avg_pool(dev, n_images, side, k, channels):
    rng = np.random.default_rng(side)
    x = rng.normal(size=(n_images, side, side, channels)).astype(np.float32)
    o = side // k
    want = x.astype(np.float64).reshape(n_images, o, k, o, k, channels).mean(axis=(2, 4))
    out = np.zeros((n_images, o, o, channels), np.float32)
    got = run(dev, "avg_pool_f32", [params(n_images, side, k, channels), x, out], -(-out.size // 256), 256)
    np.testing.assert_allclose(got[2], want, rtol=1e-6, atol=1e-6)


def same_padding(size: int, k: int, stride: int) -> tuple[int, int, int]:
    """TensorFlow's "same" (timm's pad_type='same'): out = ceil(size / stride), the zeros
    it needs split with the odd one after. (out, before, after)."""
    out = -(-size // stride)
    total = max((out - 1) * stride + k - size, 0)
    return out, total // 2, total - total // 2


@pytest.mark.parametrize("h,w,channels,k,stride", [(6, 6, 3, 3, 1), (8, 8, 5, 3, 2), (7, 9, 4, 5, 2), (5, 4, 2, 5, 1)])
def test_depthwise_conv2d(dev, h, w, channels, k, stride):
    rng = np.random.default_rng(h * w + k)
    x = rng.normal(size=(h, w, channels)).astype(np.float32)
    taps = rng.normal(size=(k, k, channels)).astype(np.float32)
    (ho, top, bottom), (wo, left, right) = same_padding(h, k, stride), same_padding(w, k, stride)
    padded = np.pad(x.astype(np.float64), ((top, bottom), (left, right), (0, 0)))
    want = np.zeros((ho, wo, channels))
    for oy in range(ho):
        for ox in range(wo):
            window = padded[oy * stride:oy * stride + k, ox * stride:ox * stride + k]  # (k, k, channels)
            want[oy, ox] = (window * taps).sum(axis=(0, 1))
    out = np.full((ho, wo, channels), np.nan, np.float32)
    got = run(dev, "depthwise_conv2d_f32",
              [params(h, w, channels, k, stride, top, left, ho, wo), x, taps.reshape(k * k, channels), out],
              -(-out.size // 256), 256)
    np.testing.assert_allclose(got[3], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("accumulate", [0, 1])
def test_layer_scale(dev, accumulate):
    rng = np.random.default_rng(accumulate)
    rows, channels = 9, 37
    x = rng.normal(size=(rows, channels)).astype(np.float32)
    g = rng.normal(size=channels).astype(np.float32)
    y = rng.normal(size=(rows, channels)).astype(np.float32)
    want = g.astype(np.float64) * x + (y if accumulate else 0)
    got = run(dev, "layer_scale_f32", [params(rows * channels, channels, accumulate), x, g, y.copy()], 2, 256)
    np.testing.assert_allclose(got[3], want, rtol=1e-6, atol=1e-6)
