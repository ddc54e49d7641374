"""gemv with an RMS norm fused into its input (ops.matmul / ops.matmul_glu with
norm_w=): the decode step's attention, FFN and output norms on GPUs. Against
float64 numpy: rms_norm(x) first, then the matmul on the weights as gguf
dequantizes them. The fused widths are 1 and 2 rows per SIMD-group (the GPU
shapes); they run on every device, so the host checks the kernels too."""
from __future__ import annotations

import numpy as np
import pytest

import metalkv
from metalkv._core import ops

from devices import test_device  # tests/ is on sys.path
from .reference import (WTYPES, f32, fit, gelu_pytorch_tanh, kernel_bytes, make_weights, matmul, matmul_tolerance,
                        rms_norm, silu)

EPS = 1e-5


def inputs(rng, n_tokens, n_in):
    # rows of different scales: the norm's 1 / rms differs per token
    scale = np.geomspace(0.05, 20.0, n_tokens)[:, None]
    x = (rng.standard_normal((n_tokens, n_in)) * scale).astype(np.float32)
    g = rng.uniform(-1.5, 1.5, n_in).astype(np.float32)
    return x, g


def tolerance(h, w, ref):
    # the matmul's float32 accumulation bound, plus a few ulps of the scale 1 / rms
    return matmul_tolerance(h, w) + 8 * 2.0 ** -24 * np.abs(ref)


@pytest.mark.parametrize("wtype", WTYPES)
@pytest.mark.parametrize("gemv_rows", [1, 2])
@pytest.mark.parametrize("offset", [0.0, 1.0])  # Llama's g, Gemma's 1 + g
@pytest.mark.parametrize("n_tokens,n_out,n_in", [(1, 70, 576), (3, 33, 96)])
def test_gemv_normalizes_its_input(dev, wtype, gemv_rows, offset, n_tokens, n_out, n_in):
    n_in = fit(wtype, n_in)
    rng = np.random.default_rng(n_out + int(offset))
    stored, w = make_weights(wtype, n_out, n_in, rng)
    x, g = inputs(rng, n_tokens, n_in)
    bias = rng.standard_normal(n_out).astype(np.float32)
    y0 = rng.standard_normal((n_tokens, n_out)).astype(np.float32)
    y = dev.buffer_from(y0)
    ops.matmul(dev, dev.buffer_from(x), dev.buffer_from(kernel_bytes(wtype, stored)), y, n_tokens=n_tokens,
               n_in=n_in, n_out=n_out, wtype=wtype, bias=dev.buffer_from(bias), kernel="gemv", accumulate=True,
               gemv_rows=gemv_rows, norm_w=dev.buffer_from(g), norm_eps=EPS, norm_offset=offset)
    h = rms_norm(x, g, EPS, offset)
    ref = y0 + matmul(h, w, bias)
    got = f32(y, (n_tokens, n_out))
    assert np.all(np.abs(got - ref) <= tolerance(h, w, ref) + 2.0 ** -23 * np.abs(y0)), np.abs(got - ref).max()


@pytest.mark.parametrize("wtype", ["f16", "q8_0", "q4_0", "q6_k"])
@pytest.mark.parametrize("gemv_rows", [1, 2])
@pytest.mark.parametrize("act,fn", [("silu", silu), ("gelu_tanh", gelu_pytorch_tanh)])
def test_glu_normalizes_its_input(dev, wtype, gemv_rows, act, fn):
    n_out, n_in = 37, fit(wtype, 576)
    rng = np.random.default_rng(7)
    stored, w = make_weights(wtype, 2 * n_out, n_in, rng)
    x, g = inputs(rng, 2, n_in)
    y = dev.buffer(2 * n_out * 4)
    ops.matmul_glu(dev, dev.buffer_from(x), dev.buffer_from(kernel_bytes(wtype, stored)), y, n_tokens=2,
                   n_in=n_in, n_out=n_out, wtype=wtype, act=act, gemv_rows=gemv_rows, norm_w=dev.buffer_from(g),
                   norm_eps=EPS, norm_offset=1.0)
    h = rms_norm(x, g, EPS, 1.0)
    gate, up = matmul(h, w[:n_out]), matmul(h, w[n_out:])
    tol_g, tol_u = tolerance(h, w[:n_out], gate), tolerance(h, w[n_out:], up)
    ref = fn(gate) * up
    # as test_matmul's GLU bound: act' <= ~1.13, plus float32 rounding of the product
    tol = 1.2 * tol_g * (np.abs(up) + tol_u) + np.abs(fn(gate)) * tol_u + 1e-6 * np.abs(ref) + 1e-30
    got = f32(y, (2, n_out))
    assert np.all(np.abs(got - ref) <= tol), np.abs(got - ref).max()


def test_fused_norm_is_the_norm_then_the_gemv():
    """Against the two dispatches it replaces (rms_norm_f32, then gemv): equal
    within float32 rounding, and the same at both widths."""
    dev = test_device()
    rng = np.random.default_rng(3)
    n_out, n_in = 64, 1024
    stored, w = make_weights("q8_0", n_out, n_in, rng)
    x, g = inputs(rng, 1, n_in)
    wb, xb, gb = dev.buffer_from(kernel_bytes("q8_0", stored)), dev.buffer_from(x), dev.buffer_from(g)
    h = dev.buffer(n_in * 4)
    ops.rms_norm(dev, xb, gb, h, n_rows=1, dim=n_in, eps=EPS, wtype="f32")
    two = dev.buffer(n_out * 4)
    ops.matmul(dev, h, wb, two, n_tokens=1, n_in=n_in, n_out=n_out, wtype="q8_0", kernel="gemv", gemv_rows=2)
    for rows in (1, 2):
        one = dev.buffer(n_out * 4)
        ops.matmul(dev, xb, wb, one, n_tokens=1, n_in=n_in, n_out=n_out, wtype="q8_0", kernel="gemv",
                   gemv_rows=rows, norm_w=gb, norm_eps=EPS)
        a, b = f32(one, (1, n_out)), f32(two, (1, n_out))
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(b).max())


def test_fusable_where_a_norm_variant_exists(dev):
    fusable = ops.gemv_norm_fusable(dev, "q4_0", 4096)
    assert fusable == ops.gemv_norm_fusable(dev, "q4_0", 4096, glu=True)
    # the host executor's gemv widths (8, 32 rows) have no _norm variant; GPUs' (1, 2) do
    assert fusable == (dev.kind != "host")


def test_fused_norm_bad_inputs():
    dev = test_device()
    n_in, n_out = 64, 8
    x, y, w = dev.buffer(n_in * 4), dev.buffer(n_out * 4), dev.buffer(n_out * n_in * 2)

    def call(**kw):
        args = dict(n_tokens=1, n_in=n_in, n_out=n_out, wtype="f16", kernel="gemv", gemv_rows=2,
                    norm_w=dev.buffer(n_in * 4))
        args.update(kw)
        ops.matmul(dev, x, w, y, **args)

    call()  # valid
    with pytest.raises(metalkv.GpuError, match=r"\[matmul\] a fused norm needs the gemv kernel"):
        call(kernel="gemm")
    with pytest.raises(metalkv.GpuError, match=r"a fused norm runs on gemv widths 1 and 2; this call's gemv has 8"):
        call(gemv_rows=8)
    with pytest.raises(metalkv.GpuError, match=r"norm weight \(n_in\) float32 needs 256 bytes"):
        call(norm_w=dev.buffer(16))
    with pytest.raises(metalkv.GpuError, match=r"\[matmul_glu\] a fused norm runs on gemv widths 1 and 2"):
        ops.matmul_glu(dev, x, dev.buffer(2 * n_out * n_in * 2), y, n_tokens=1, n_in=n_in, n_out=n_out, wtype="f16",
                       gemv_rows=32, norm_w=dev.buffer(n_in * 4))
