"""A gemm over stacked matrices whose epilogue writes three token-major outputs
(q, k and v from [W_q; W_k; W_v]: matmul's split): in each gemm shape (and the
16-bit activations' tile), the same floats, bit for bit, as three gemms of that
shape (test_matmul.py holds those to numpy), with and without bias; and the
arguments refused by name."""
from __future__ import annotations

import numpy as np
import pytest

import metalkv
from metalkv._core import ops

from .reference import WTYPES, f32, fit, kernel_bytes, make_weights
from .test_gemm_glu import shapes


def gemm(dev, x, stored, wtype, n_out, kernel, bias=None, x16=False):
    n_tokens, n_in = x.shape
    y = dev.buffer(n_tokens * n_out * 4)
    ops.matmul(dev, dev.buffer_from(x), dev.buffer_from(kernel_bytes(wtype, stored)), y, n_tokens=n_tokens,
               n_in=n_in, n_out=n_out, wtype=wtype, kernel=kernel, bias=None if bias is None else dev.buffer_from(bias),
               activations_16bit=x16)
    return f32(y, (n_tokens, n_out))


def kernels(dev, x16):
    """The shapes to compare: every gemm shape, or with 16-bit activations the matrix units' (gemm_mma16.h)."""
    return ["gemm_mma"] if x16 else shapes(dev)


@pytest.mark.parametrize("wtype,x16", [(w, False) for w in WTYPES] + [("f16", True), ("bf16", True)])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("n_tokens,widths", [(3, (24, 8, 8)), (40, (72, 24, 24)), (33, (64, 64, 64)),
                                             (70, (136, 8, 120))])
def test_equals_three_gemms(dev, wtype, x16, with_bias, n_tokens, widths):
    n_in = fit(wtype, 64)
    rng = np.random.default_rng(n_tokens + sum(widths))
    n_out = sum(widths)
    stored, _ = make_weights(wtype, n_out, n_in, rng)
    x = rng.standard_normal((n_tokens, n_in)).astype(np.float32)
    bias = rng.standard_normal(n_out).astype(np.float32) if with_bias else None
    a, b = widths[0], widths[0] + widths[1]
    for kernel in kernels(dev, x16):
        outs = [dev.buffer(n_tokens * w * 4) for w in widths]
        ops.matmul(dev, dev.buffer_from(x), dev.buffer_from(kernel_bytes(wtype, stored)), outs[0],
                   n_tokens=n_tokens, n_in=n_in, n_out=n_out, wtype=wtype, kernel=kernel,
                   bias=None if bias is None else dev.buffer_from(bias), split=(a, b), y2=outs[1], y3=outs[2],
                   activations_16bit=x16)
        for out, lo, hi in zip(outs, (0, a, b), (a, b, n_out)):
            want = gemm(dev, x, stored[lo:hi], wtype, hi - lo, kernel, None if bias is None else bias[lo:hi], x16)
            np.testing.assert_array_equal(f32(out, (n_tokens, hi - lo)).view(np.uint32), want.view(np.uint32),
                                          err_msg=f"{kernel} columns {lo}:{hi}")


def test_refused_arguments():
    dev = metalkv.Device("host")
    rng = np.random.default_rng(1)
    stored, _ = make_weights("f32", 12, 8, rng)
    x = dev.buffer_from(rng.standard_normal((4, 8)).astype(np.float32))
    w = dev.buffer_from(kernel_bytes("f32", stored))
    y, y2, y3 = dev.buffer(4 * 4 * 4), dev.buffer(4 * 4 * 4), dev.buffer(4 * 4 * 4)
    kw = dict(n_tokens=4, n_in=8, n_out=12, wtype="f32", y2=y2, y3=y3)
    ops.matmul(dev, x, w, y, kernel="gemm", split=(4, 8), **kw)  # valid
    with pytest.raises(metalkv.GpuError, match=r"\[matmul\] split_a and split_b must cut n_out in three"):
        ops.matmul(dev, x, w, y, kernel="gemm", split=(8, 4), **kw)
    with pytest.raises(metalkv.GpuError, match=r"\[matmul\] split outputs \(split_a\) need a gemm kernel"):
        ops.matmul(dev, x, w, y, kernel="gemv", split=(4, 8), **kw)
    with pytest.raises(metalkv.GpuError, match=r"\[matmul\] y2 \(n_tokens, split_b - split_a\) float32 needs 64 bytes"):
        ops.matmul(dev, x, w, y, kernel="gemm", split=(4, 8), n_tokens=4, n_in=8, n_out=12, wtype="f32",
                   y2=dev.buffer(16), y3=y3)
    with pytest.raises(metalkv.GpuError, match=r"\[matmul\] y3 \(n_tokens, n_out - split_b\) f16 needs 32 bytes"):
        ops.matmul(dev, x, w, y, kernel="gemm", split=(4, 8), split_f16=True, y2=y2, y3=dev.buffer(31), n_tokens=4,
                   n_in=8, n_out=12, wtype="f32")
    with pytest.raises(metalkv.GpuError, match=r"\[matmul\] split_f16 is for split outputs"):
        ops.matmul(dev, x, w, y, kernel="gemm", split_f16=True, n_tokens=4, n_in=8, n_out=4, wtype="f32")
    with pytest.raises(metalkv.GpuError, match=r"\[matmul\] accumulate adds to float outputs; split_f16 writes f16"):
        ops.matmul(dev, x, w, y, kernel="gemm", split=(4, 8), split_f16=True, accumulate=True, **kw)


@pytest.mark.parametrize("wtype,x16", [("f32", False), ("bf16", False), ("q4_0", False), ("f16", True),
                                       ("bf16", True)])
@pytest.mark.parametrize("activation", ["none", "gelu_tanh"])
def test_f16_outputs_are_the_float_ones_rounded(dev, wtype, x16, activation):
    """split_f16 (a tower's K and V straight into its f16 pool): y takes the float
    outputs, y2 and y3 the same values each rounded once to f16 (numpy's
    round-to-nearest-even), in every gemm shape."""
    n_tokens, widths = 70, (136, 8, 120)
    n_in = fit(wtype, 64)
    rng = np.random.default_rng(5)
    n_out = sum(widths)
    stored, _ = make_weights(wtype, n_out, n_in, rng)
    x = dev.buffer_from(rng.standard_normal((n_tokens, n_in)).astype(np.float32))
    w = dev.buffer_from(kernel_bytes(wtype, stored))
    bias = dev.buffer_from(rng.standard_normal(n_out).astype(np.float32))
    a, b = widths[0], widths[0] + widths[1]
    for kernel in kernels(dev, x16):
        kw = dict(n_tokens=n_tokens, n_in=n_in, n_out=n_out, wtype=wtype, kernel=kernel, bias=bias, split=(a, b),
                  activations_16bit=x16, activation=activation)
        floats = [dev.buffer(n_tokens * w_ * 4) for w_ in widths]
        ops.matmul(dev, x, w, floats[0], y2=floats[1], y3=floats[2], **kw)
        y, k, v = (dev.buffer(n_tokens * width * size) for width, size in zip(widths, (4, 2, 2)))
        ops.matmul(dev, x, w, y, y2=k, y3=v, split_f16=True, **kw)
        np.testing.assert_array_equal(f32(y, (n_tokens, a)), f32(floats[0], (n_tokens, a)))
        for out, ref, width in ((k, floats[1], widths[1]), (v, floats[2], widths[2])):
            want = f32(ref, (n_tokens, width)).astype(np.float16)
            got = out.numpy().view(np.float16)[:n_tokens * width].reshape(n_tokens, width)
            np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16), err_msg=kernel)
