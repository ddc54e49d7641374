"""The host executor's gemm shape (gemm_<fmt>_h, metal/gemm_host.h) against the
GPU shape (gemm_<fmt>) on the same device: equal bit for bit, for every weight
format, ragged tiles (tokens past a 32-token tile, rows past a 64-row tile and
past one lane's 8), float rows whose length is no multiple of the 16-input
step, bias, and the fused residual add. Both are checked against numpy in
test_matmul.py; equality here pins that the host's default changes no result."""
from __future__ import annotations

import numpy as np
import pytest

import metalkv
from metalkv._core import ops

from .reference import WTYPES, f32, fit, kernel_bytes, make_weights


def gemm(dev, kernel, x, stored, wtype, n_out, bias=None, y0=None, activations_16bit=False):
    n_tokens, n_in = x.shape
    y = dev.buffer_from(y0) if y0 is not None else dev.buffer(n_tokens * n_out * 4)
    ops.matmul(dev, dev.buffer_from(np.ascontiguousarray(x)), dev.buffer_from(kernel_bytes(wtype, stored)), y,
               n_tokens=n_tokens, n_in=n_in, n_out=n_out, wtype=wtype,
               bias=None if bias is None else dev.buffer_from(bias), kernel=kernel, accumulate=y0 is not None,
               activations_16bit=activations_16bit)
    return f32(y, (n_tokens, n_out))


def both(dev, wtype, n_tokens, n_out, n_in, seed, with_bias=False, accumulate=False):
    rng = np.random.default_rng(seed)
    stored, _ = make_weights(wtype, n_out, n_in, rng)
    x = rng.standard_normal((n_tokens, n_in)).astype(np.float32)
    bias = rng.standard_normal(n_out).astype(np.float32) if with_bias else None
    y0 = rng.standard_normal((n_tokens, n_out)).astype(np.float32) if accumulate else None
    gpu = gemm(dev, "gemm_gpu", x, stored, wtype, n_out, bias, y0)
    host = gemm(dev, "gemm_host", x, stored, wtype, n_out, bias, y0)
    return gpu, host


def host_shapes(dev):
    if not dev.properties["has_host_shapes"]:
        pytest.skip("the host executor's shapes are built for it only")


@pytest.mark.parametrize("wtype", WTYPES)
@pytest.mark.parametrize("n_tokens,n_out", [(1, 8), (5, 3), (33, 70), (64, 130)])
def test_equal_to_the_gpu_shape(dev, wtype, n_tokens, n_out):
    host_shapes(dev)
    gpu, host = both(dev, wtype, n_tokens, n_out, fit(wtype, 96), seed=n_tokens * n_out)
    np.testing.assert_array_equal(host.view(np.uint32), gpu.view(np.uint32))


@pytest.mark.parametrize("wtype", WTYPES)
def test_bias_and_residual_add(dev, wtype):
    host_shapes(dev)
    gpu, host = both(dev, wtype, 40, 75, fit(wtype, 64), seed=11, with_bias=True, accumulate=True)
    np.testing.assert_array_equal(host.view(np.uint32), gpu.view(np.uint32))


# n_in % 16 != 0 (float rows take any multiple of 4), and % 64 != 0 (the GPU
# shape's last step is partial): the tail steps of both shapes.
@pytest.mark.parametrize("wtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("n_in", [4, 20, 100])
def test_float_rows_with_partial_steps(dev, wtype, n_in):
    host_shapes(dev)
    gpu, host = both(dev, wtype, 9, 17, n_in, seed=n_in, with_bias=True)
    np.testing.assert_array_equal(host.view(np.uint32), gpu.view(np.uint32))


def test_signed_zero_sums(dev):
    """All-zero weights times negative activations sum to -0.0 in both shapes'
    loops: the epilogue's + 0.0f makes both +0.0 (why gemm_host.h need not
    replay the GPU shape's zero products past n_in)."""
    host_shapes(dev)
    n_tokens, n_out, n_in = 3, 4, 20
    x = -np.ones((n_tokens, n_in), np.float32)
    stored = np.zeros((n_out, n_in), np.float32)
    for kernel in ("gemm_gpu", "gemm_host"):
        y = gemm(dev, kernel, x, stored, "f32", n_out)
        assert not np.signbit(y).any(), kernel


def test_the_host_runs_its_own_shape_for_gemm():
    """kernel='gemm' (the model's prefill) runs gemm_<fmt>_h on the host executor:
    the profile's kernel names say which ran."""
    dev = metalkv.Device("host", profile=True)
    rng = np.random.default_rng(5)
    stored, _ = make_weights("q4_1", 64, 64, rng)
    gemm(dev, "gemm", rng.standard_normal((40, 64)).astype(np.float32), stored, "q4_1", 64)
    assert set(dev.kernel_times()) == {"gemm_q4_1_h"}


def test_host_shape_refused_where_there_is_none(dev):
    if dev.properties["has_host_shapes"]:
        pytest.skip("this device has the host shapes")
    rng = np.random.default_rng(6)
    stored, _ = make_weights("f16", 8, 16, rng)
    with pytest.raises(Exception, match="gemm_host"):
        gemm(dev, "gemm_host", rng.standard_normal((2, 16)).astype(np.float32), stored, "f16", 8)
