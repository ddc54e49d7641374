"""ops.quantize (cpp/ops/quantize.cpp): float rows -> GGUF Q8_0 / Q4_0 blocks,
byte for byte against gguf-py's gguf.quants.quantize (the numpy twin of ggml's
quantize_row_q8_0_ref / quantize_row_q4_0_ref) on the same float32 values.

The edges are compared too, exactly: ties of the rounding (x / d = k + 0.5), zero
and signed-zero blocks, all-equal blocks, a largest magnitude held twice with
both signs, values near f16's overflow of d, subnormal floats. Blocks so small
that 1 / d overflows float have their own test: there the codes are whatever a
cast of Inf to an integer gives (undefined in ggml's C, the CPU's in numpy)."""
from __future__ import annotations

import platform

import gguf
import numpy as np
import pytest

from metalkv._core import GpuError, ops

GGML = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}
WTYPES = list(GGML)


def reference(x: np.ndarray, wtype: str) -> np.ndarray:
    with np.errstate(all="ignore"):  # the tiny blocks' 1 / d overflow, as in ggml
        return gguf.quants.quantize(x.astype(np.float32), GGML[wtype])


def check_exact(x: np.ndarray, wtype: str) -> None:
    got, want = ops.quantize(x, wtype), reference(x, wtype)
    assert got.dtype == np.uint8 and got.shape == want.shape
    bad = np.flatnonzero((got != want).any(axis=1))
    assert bad.size == 0, f"{bad.size} rows differ, first {bad[0]}: {got[bad[0]]} vs {want[bad[0]]}"


def edge_rows(rng) -> np.ndarray:
    """One block a row, each an edge of the references' arithmetic."""
    rows = [np.zeros(32), -np.zeros(32), np.r_[-0.0, np.zeros(31)], np.full(32, 0.75), np.full(32, -3.0),
            np.r_[5.0, -5.0, rng.standard_normal(30)], np.r_[-5.0, 5.0, rng.standard_normal(30)],
            np.r_[1.0, np.zeros(31)], np.full(32, 65504.0 * 127), np.full(32, 65520.0 * 8),
            np.r_[3e38, -3e38, rng.standard_normal(30) * 1e38], rng.standard_normal(32) * 1e-20,
            np.r_[1e-36, -3e-38, np.zeros(30)], np.r_[1.4e-45, np.zeros(31)], np.full(32, 1.4e-45)]
    # ties: x * (1 / d) lands on k + 0.5 (Q8_0, d = 127 / 127 = 1) or k (Q4_0: + 8.5 is a tie of trunc)
    rows.append(np.r_[127.0, np.arange(-15.5, 15.5, 1.0)])
    rows.append(np.r_[-8.0, np.arange(-7.5, 8.0, 0.5)[:31]])
    return np.array(rows, np.float32)


@pytest.mark.parametrize("wtype", WTYPES)
@pytest.mark.parametrize("shape", [(1, 32), (3, 64), (17, 96), (64, 4096), (300, 256)])
def test_random_f32_matches_gguf_py(wtype, shape):
    rng = np.random.default_rng(shape[0] * 7 + shape[1])
    x = (rng.standard_normal(shape) * rng.choice([1e-3, 1.0, 1e3], size=(shape[0], 1))).astype(np.float32)
    check_exact(x, wtype)


@pytest.mark.parametrize("wtype", WTYPES)
def test_edge_blocks_match_gguf_py(wtype):
    check_exact(edge_rows(np.random.default_rng(1)), wtype)


@pytest.mark.parametrize("wtype", WTYPES)
def test_blocks_whose_inverse_scale_overflows(wtype):
    """|values| below ~3.7e-37 (Q8_0) or ~2.4e-38 (Q4_0): d is a float subnormal and 1 / d
    is Inf, so x / d is +-Inf or NaN. The scale matches everywhere and rounds to zero in f16,
    so the codes are never read; they are what numpy's x86-64 cast of Inf and NaN gives (0,
    through cvttss2si), which the C++ writes on every CPU: compared byte for byte on x86-64,
    where numpy agrees (arm64's saturating cast would give 0xff for +Inf)."""
    x = np.array([np.r_[1e-37, -3e-38, np.zeros(30)], np.full(32, 1e-40), np.r_[-1e-40, 2e-41, np.zeros(30)]],
                 np.float32)
    got, want = ops.quantize(x, wtype), reference(x, wtype)
    block = 34 if wtype == "q8_0" else 18
    d = lambda q: q.reshape(-1, block)[:, :2]
    np.testing.assert_array_equal(d(got), d(want))
    assert (d(got).copy().view(np.float16) == 0).all()
    if platform.machine().lower() in ("x86_64", "amd64"):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("wtype", WTYPES)
def test_every_rounding_tie_matches_gguf_py(wtype):
    """Values on a fine grid of the block's scale: many x / d hit a tie exactly."""
    rng = np.random.default_rng(2)
    k = rng.integers(-254, 255, size=(512, 32)).astype(np.float32) / 2  # multiples of 0.5
    k[:, 0] = 127.0 if wtype == "q8_0" else -8.0  # d = 1: x / d is x
    check_exact(k * np.float32(2.0) ** rng.integers(-20, 20, size=(512, 1)).astype(np.float32), wtype)


@pytest.mark.parametrize("wtype", WTYPES)
def test_f16_and_bf16_sources_match_their_float32_values(wtype):
    """gguf-py takes float32: f16 and bf16 are widened first, exactly."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((40, 128)).astype(np.float32)
    x[0] = np.r_[6.1e-5, 5.96e-8, -5.96e-8, np.zeros(125)]  # f16 subnormals widen exactly
    x[1, :32] = np.float32(65504.0)
    h = x.astype(np.float16)
    np.testing.assert_array_equal(ops.quantize(h, wtype), reference(h.astype(np.float32), wtype))
    bf16 = (x.view(np.uint32) >> 16).astype(np.uint16)
    widened = (bf16.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(ops.quantize(bf16, wtype), reference(widened, wtype))


def test_many_threads_write_every_row():
    """A matrix large enough to be split over threads (>= 2^20 values a thread)."""
    x = np.random.default_rng(4).standard_normal((1031, 4096)).astype(np.float16)
    check_exact(x, "q4_0")


def test_strided_input_is_read_as_its_values():
    x = np.random.default_rng(5).standard_normal((64, 64)).astype(np.float32)
    np.testing.assert_array_equal(ops.quantize(x[:, :32], "q8_0"),
                                  reference(np.ascontiguousarray(x[:, :32]), "q8_0"))


@pytest.mark.parametrize("data, wtype, match", [
    (np.zeros((2, 48), np.float32), "q8_0", r"\[quantize\] q8_0 weights need a row length that is a positive "
                                            r"multiple of 32, got 48"),
    (np.zeros((0, 32), np.float32), "q8_0", r"\[quantize\] rows must be positive"),
    (np.zeros((2, 32), np.float32), "q4_k", r"\[quantize\] cannot quantize to 'q4_k'; expected 'q8_0' or 'q4_0'"),
    (np.zeros((2, 32), np.float32), "f16", r"\[quantize\] cannot quantize to 'f16'"),
    (np.zeros((2, 32), np.float32), "q9", r"\[quantize\] unknown weight type 'q9'"),
    (np.zeros((2, 32), np.float64), "q8_0", r"\[quantize\] data must be float32, float16 or uint16"),
    (np.zeros((2, 32), np.int32), "q8_0", r"\[quantize\] data must be float32, float16 or uint16"),
])
def test_argument_errors(data, wtype, match):
    with pytest.raises(GpuError, match=match):
        ops.quantize(data, wtype)


def test_not_a_matrix_is_refused():
    with pytest.raises(TypeError):
        ops.quantize(np.zeros(64, np.float32), "q8_0")
