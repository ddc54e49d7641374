"""The prefill gemm on simdgroup_matrix (gemm_mma_<fmt>, metal/gemm_mma.h) on any
device: against numpy for every weight format, and, where products follow the
host executor's documented order (the host: devices without matrix units),
equal bit for bit to the SIMD gemm (gemm_gpu): the same products added onto 0
in increasing k. On matrix units (Apple GPUs, the cuda device's tensor cores)
the sums run in the hardware's order, within the float32 tolerance. Ragged tiles, float rows with a partial 32-input step, bias
and the fused residual add."""
from __future__ import annotations

import numpy as np
import pytest
from metalkv._core import GpuError

from .reference import WTYPES, fit, make_weights, matmul, matmul_tolerance, rounded
from .test_gemm_host import gemm


def emulated(dev) -> bool:
    """Matrices in the host's order: the host executor's prelude."""
    return not dev.properties["matrix_units"]


def case(dev, wtype, n_tokens, n_out, n_in, seed, with_bias=False, accumulate=False):
    rng = np.random.default_rng(seed)
    stored, w = make_weights(wtype, n_out, n_in, rng)
    x = rng.standard_normal((n_tokens, n_in)).astype(np.float32)
    bias = rng.standard_normal(n_out).astype(np.float32) if with_bias else None
    y0 = rng.standard_normal((n_tokens, n_out)).astype(np.float32) if accumulate else None
    mma = gemm(dev, "gemm_mma", x, stored, wtype, n_out, bias, y0)
    ref = matmul(x, w, bias) + (y0 if accumulate else 0)
    assert np.all(np.abs(mma - ref) <= matmul_tolerance(x, w) + (np.abs(y0) * 2 ** -22 if accumulate else 0)), \
        np.abs(mma - ref).max()
    if emulated(dev):
        simd = gemm(dev, "gemm_gpu", x, stored, wtype, n_out, bias, y0)
        np.testing.assert_array_equal(mma.view(np.uint32), simd.view(np.uint32))


@pytest.mark.parametrize("wtype", WTYPES)
@pytest.mark.parametrize("n_tokens,n_out", [(1, 8), (5, 3), (33, 70), (64, 130)])
def test_against_numpy_and_the_simd_gemm(dev, wtype, n_tokens, n_out):
    case(dev, wtype, n_tokens, n_out, fit(wtype, 64), seed=n_tokens * 131 + n_out)


@pytest.mark.parametrize("wtype", WTYPES)
def test_bias_and_residual_add(dev, wtype):
    case(dev, wtype, 40, 75, fit(wtype, 96), seed=12, with_bias=True, accumulate=True)


@pytest.mark.parametrize("wtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("n_in", [4, 20, 100])
def test_float_rows_with_partial_steps(dev, wtype, n_in):
    case(dev, wtype, 9, 17, n_in, seed=n_in, with_bias=True)


@pytest.mark.parametrize("wtype", ["f16", "q4_k"])
def test_the_device_default(dev, wtype):
    """kernel='gemm' runs gemm_mma exactly where the device reports matrix units:
    its outputs are gemm_mma's bits there and the SIMD gemm's elsewhere."""
    rng = np.random.default_rng(7)
    stored, _ = make_weights(wtype, 70, fit(wtype, 256), rng)
    x = rng.standard_normal((40, fit(wtype, 256))).astype(np.float32)
    default = gemm(dev, "gemm", x, stored, wtype, 70)
    mma = gemm(dev, "gemm_mma", x, stored, wtype, 70)
    if dev.properties["matrix_units"]:
        np.testing.assert_array_equal(default.view(np.uint32), mma.view(np.uint32))
    else:
        assert dev.kind == "host"  # every GPU we build for has them (Apple7+, sm_80+)
        props = dev.properties
        own = "gemm_host" if props["lanes_are_fibers"] and props["has_host_shapes"] else "gemm_gpu"
        np.testing.assert_array_equal(default.view(np.uint32), gemm(dev, own, x, stored, wtype, 70).view(np.uint32))



def x16_case(dev, wtype, n_tokens, n_out, n_in, seed, kernel="gemm_mma"):
    rng = np.random.default_rng(seed)
    stored, w = make_weights(wtype, n_out, n_in, rng)
    x = rng.standard_normal((n_tokens, n_in)).astype(np.float32)
    bias = rng.standard_normal(n_out).astype(np.float32)
    return x, stored, w, bias, gemm(dev, kernel, x, stored, wtype, n_out, bias, activations_16bit=True)


@pytest.mark.parametrize("wtype", ["f16", "bf16"])
@pytest.mark.parametrize("n_tokens,n_out,n_in", [(5, 3, 20), (33, 70, 64), (64, 130, 100), (100, 260, 36),
                                                  (200, 130, 160), (129, 40, 96)])
def test_16bit_activations_are_the_gemm_of_x_rounded(dev, wtype, n_tokens, n_out, n_in):
    """gemm_mma_<fmt>_x16 (MatmulArgs::activations_16bit, the towers' gemm on matrix
    units; 128 x 128 tiles taking 32 inputs a step, two steps in flight, so the shapes
    cover ragged tiles of both, one step, and odd and even step counts): x rounded once
    to the weights' type, then float sums. Against numpy of that x; on the host, the
    SIMD gemm of the rounded x to the bit."""
    x, stored, w, bias, got = x16_case(dev, wtype, n_tokens, n_out, n_in, seed=n_tokens + n_in)
    xr = rounded(wtype, x)
    ref = matmul(xr, w, bias)
    assert np.all(np.abs(got - ref) <= matmul_tolerance(xr, w)), np.abs(got - ref).max()
    assert np.abs(got - matmul(x, w, bias)).max() > 10 * np.abs(got - ref).max()  # the rounding is real
    if emulated(dev):
        simd = gemm(dev, "gemm_gpu", xr, stored, wtype, n_out, bias)
        np.testing.assert_array_equal(got.view(np.uint32), simd.view(np.uint32))


@pytest.mark.parametrize("kernel", ["gemm_gpu", "gemm"])
def test_16bit_activations_leave_other_shapes_in_float(dev, kernel):
    """Only the matrix units' gemm rounds: the SIMD shape (and the host's own) give their float bits."""
    if kernel == "gemm" and dev.properties["matrix_units"]:
        pytest.skip("the device's gemm is gemm_mma here")
    x, stored, _, bias, got = x16_case(dev, "f16", 40, 70, 64, seed=3, kernel=kernel)
    np.testing.assert_array_equal(got.view(np.uint32), gemm(dev, kernel, x, stored, "f16", 70, bias).view(np.uint32))


@pytest.mark.parametrize("wtype", ["f32", "q4_k"])
def test_16bit_activations_refuse_other_weights(dev, wtype):
    with pytest.raises(GpuError, match=f"activations_16bit is built for f16 and bf16 weights, not {wtype}"):
        x16_case(dev, wtype, 8, 16, 256, seed=1)
