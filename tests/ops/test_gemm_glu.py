"""The prefill gemm with the GLU in its epilogue (matmul_glu with a gemm kernel:
metal/gemm_common.h), in each gemm shape: the same floats, bit for bit, as two
gemms of that shape and swiglu_f32 / geglu_f32 (which test_matmul.py and
test_elementwise.py hold to numpy), for every weight format, both activations
and ragged tiles (outputs not a multiple of a GLU tile's 32, tokens past a
32-token tile)."""
from __future__ import annotations

import numpy as np
import pytest

from metalkv._core import ops

from .reference import WTYPES, f32, fit, kernel_bytes, make_weights


def shapes(dev):
    return ["gemm_gpu", "gemm_mma"] + (["gemm_host"] if dev.properties["has_host_shapes"] else [])


def fused(dev, x, stored, n_out, wtype, act, kernel):
    n_tokens, n_in = x.shape
    y = dev.buffer(n_tokens * n_out * 4)
    ops.matmul_glu(dev, dev.buffer_from(x), dev.buffer_from(kernel_bytes(wtype, stored)), y, n_tokens=n_tokens,
                   n_in=n_in, n_out=n_out, wtype=wtype, act=act, kernel=kernel)
    return f32(y, (n_tokens, n_out))


def unfused(dev, x, stored, n_out, wtype, act, kernel):
    n_tokens, n_in = x.shape
    half = []
    for rows in (stored[:n_out], stored[n_out:]):
        y = dev.buffer(n_tokens * n_out * 4)
        ops.matmul(dev, dev.buffer_from(x), dev.buffer_from(kernel_bytes(wtype, rows)), y, n_tokens=n_tokens,
                   n_in=n_in, n_out=n_out, wtype=wtype, kernel=kernel)
        half.append(y)
    (ops.swiglu if act == "silu" else ops.geglu)(dev, half[0], half[1], half[0], n=n_tokens * n_out)
    return f32(half[0], (n_tokens, n_out))


@pytest.mark.parametrize("wtype", WTYPES)
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("n_tokens,n_out", [(3, 37), (40, 70), (33, 32)])
def test_equals_two_gemms_and_the_activation(dev, wtype, act, n_tokens, n_out):
    n_in = fit(wtype, 96)
    rng = np.random.default_rng(n_tokens * 7 + n_out)
    stored, _ = make_weights(wtype, 2 * n_out, n_in, rng)
    x = rng.standard_normal((n_tokens, n_in)).astype(np.float32)
    for kernel in shapes(dev):
        got = fused(dev, x, stored, n_out, wtype, act, kernel)
        want = unfused(dev, x, stored, n_out, wtype, act, kernel)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=kernel)


def test_the_engine_shape_smollm2_ffn(dev):
    """SmolLM2's FFN (1536 of 576, q4_1) over a 64-token chunk, the device's own gemm."""
    rng = np.random.default_rng(3)
    stored, _ = make_weights("q4_1", 2 * 1536, 576, rng)
    x = rng.standard_normal((64, 576)).astype(np.float32)
    np.testing.assert_array_equal(fused(dev, x, stored, 1536, "q4_1", "silu", "gemm"),
                                  unfused(dev, x, stored, 1536, "q4_1", "silu", "gemm"))
