"""ops.matmul: gemv_* and gemm_* for every weight format against float64 numpy
on the weights as gguf dequantizes them. Row lengths are rounded up to what a
format takes (`fit`: K-quants 256), so every shape runs every format."""
from __future__ import annotations

import gguf
import numpy as np
import pytest

import metalkv
from metalkv._core import ops

from devices import test_device  # tests/ is on sys.path
from .reference import (K_QUANTS, QUANTIZED, WTYPES, device_row_bytes, f32, file_row_bytes, fit,
                        gelu_pytorch_tanh, kernel_bytes, make_weights, matmul, matmul_tolerance, rounded, silu)
from gpu.kernels import run


# gemv widths: rows per SIMD-group 1, 2, 4 (the GPU shapes), 8 (the host's f16),
# 32 (the host's others); 0 = the device's.
GEMV_ROWS = [1, 2, 4, 8, 32]


def run_matmul(dev, x, stored, n_out, wtype, bias=None, kernel="auto", gemv_rows=0):
    n_tokens, n_in = x.shape
    y = dev.buffer(n_tokens * n_out * 4)
    ops.matmul(dev, dev.buffer_from(np.ascontiguousarray(x)), dev.buffer_from(kernel_bytes(wtype, stored)), y,
               n_tokens=n_tokens, n_in=n_in, n_out=n_out, wtype=wtype,
               bias=None if bias is None else dev.buffer_from(bias), kernel=kernel, gemv_rows=gemv_rows)
    return f32(y, (n_tokens, n_out))


def check(dev, wtype, n_tokens, n_out, n_in, kernel, with_bias, seed, gemv_rows=0):
    n_in = fit(wtype, n_in)
    rng = np.random.default_rng(seed)
    stored, w = make_weights(wtype, n_out, n_in, rng)
    x = rng.standard_normal((n_tokens, n_in)).astype(np.float32)
    bias = rng.standard_normal(n_out).astype(np.float32) if with_bias else None
    y = run_matmul(dev, x, stored, n_out, wtype, bias, kernel, gemv_rows)
    ref = matmul(x, w, bias)
    assert np.all(np.abs(y - ref) <= matmul_tolerance(x, w)), np.abs(y - ref).max()


# SmolLM2-135M's decode shapes (n_out, n_in): gate/up and down projections.
@pytest.mark.parametrize("wtype", WTYPES)
@pytest.mark.parametrize("n_out,n_in", [(1536, 576), (576, 1536)])
@pytest.mark.parametrize("gemv_rows", GEMV_ROWS)
def test_gemv_smollm2_shapes(dev, wtype, n_out, n_in, gemv_rows):
    check(dev, wtype, 1, n_out, n_in, "auto", False, n_out + n_in, gemv_rows)


# Ragged row counts: the last SIMD-group re-reads the last row and writes only real rows.
@pytest.mark.parametrize("wtype", WTYPES)
@pytest.mark.parametrize("n_out", [1, 5, 33, 70])
@pytest.mark.parametrize("gemv_rows", GEMV_ROWS)
def test_gemv_ragged_rows(dev, wtype, n_out, gemv_rows):
    check(dev, wtype, 2, n_out, 64, "gemv", True, n_out, gemv_rows)


# Prefill chunks: n_out not a multiple of the 64-row tile, tokens not a
# multiple of the 32-token tile; forced gemv runs one weight pass per token.
@pytest.mark.parametrize("wtype", WTYPES)
@pytest.mark.parametrize("n_tokens", [3, 17, 64])
@pytest.mark.parametrize("kernel", ["auto", "gemm", "gemv"])
def test_prefill_tokens(dev, wtype, n_tokens, kernel):
    check(dev, wtype, n_tokens, 130, 96, kernel, False, n_tokens)


@pytest.mark.parametrize("wtype", WTYPES)
@pytest.mark.parametrize("n_tokens,kernel", [(1, "gemv"), (1, "gemm"), (17, "gemm"), (17, "gemv")])
def test_bias(dev, wtype, n_tokens, kernel):
    check(dev, wtype, n_tokens, 70, 64, kernel, True, 7)


# f32/f16/bf16 rows need only n_in % 4 == 0: gemm's last 64-input step is partial.
@pytest.mark.parametrize("wtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("n_tokens", [1, 33])
def test_float_weights_with_partial_last_step(dev, wtype, n_tokens):
    check(dev, wtype, n_tokens, 9, 100, "auto", True, 3)


def test_gemv_lm_head_49152x576():
    """SmolLM2's tied lm_head, once (forward fiber order: it is a size test)."""
    dev = test_device()
    check(dev, "q4_1", 1, 49152, 576, "gemv", False, 49152)


@pytest.mark.parametrize("wtype", WTYPES)
@pytest.mark.parametrize("kernel", ["gemv", "gemm"])
def test_identity_input_reads_every_weight_where_gguf_says(dev, wtype, kernel):
    """X = I gives Y = Wᵀ: each output is one weight as the kernel decoded it, at
    the column gguf's dequantize puts it, so any misplaced nibble, bit, scale or
    block is an error at that weight, not an error hidden in a sum. Two blocks per
    row, so the block stride is pinned too. Each output is one product x·w with
    x = 1 plus zeros (Q4: d·(q − 8·1), K: d·sc·q − dmin·m·1), the same float32
    operations as gguf's, so only a contracted multiply-add (a GPU may) can differ."""
    n_out, n_in = 5, 2 * max(fit(wtype, 32), 32)
    stored, w = make_weights(wtype, n_out, n_in, np.random.default_rng(3))
    x = np.eye(n_in, dtype=np.float32)
    y = run_matmul(dev, x, stored, n_out, wtype, kernel=kernel)
    np.testing.assert_allclose(y, w.T, rtol=2 ** -22, atol=2 ** -22 * np.abs(w).max())


def test_quantized_layout_is_ggufs():
    """One nonzero weight in an otherwise zero matrix lands where gguf says.

    With x = 1, 2, 3, ... the output names the column the kernel read the
    weight from: this pins the nibble order (low nibbles are weights 0..15 of
    a block) and the block order along the row, independent of tolerances.
    """
    dev = test_device()
    n_out, n_in = 3, 64
    for wtype in [t for t in QUANTIZED if t not in K_QUANTS]:  # gguf-py quantizes these
        for col in [0, 5, 15, 16, 31, 32, 47, 63]:
            w = np.zeros((n_out, n_in), np.float32)
            w[1, col] = 1.0
            qtype = gguf.GGMLQuantizationType[wtype.upper()]
            stored = gguf.quants.quantize(w, qtype)
            value = float(gguf.quants.dequantize(stored, qtype)[1, col])  # 1.0 as the format holds it
            x = np.arange(1, n_in + 1, dtype=np.float32)[None, :]
            for kernel in ["gemv", "gemm"]:
                y = run_matmul(dev, x, stored, n_out, wtype, kernel=kernel)
                np.testing.assert_allclose(y[0], [0.0, value * (col + 1), 0.0], rtol=1e-6,
                                           atol=1e-6, err_msg=f"{wtype} {kernel} col {col}")


# ---- bad inputs ----------------------------------------------------------------

def call(dev, *, n_tokens=1, n_in=64, n_out=8, wtype="q8_0", x_bytes=None, w_bytes=None,
         y_bytes=None, bias_bytes=None, kernel="auto"):
    row = device_row_bytes(wtype, n_in)
    buf = lambda n: dev.buffer(max(n, 1))  # noqa: E731
    ops.matmul(dev, buf(x_bytes if x_bytes is not None else n_tokens * n_in * 4),
               buf(w_bytes if w_bytes is not None else n_out * row),
               buf(y_bytes if y_bytes is not None else n_tokens * n_out * 4),
               n_tokens=n_tokens, n_in=n_in, n_out=n_out, wtype=wtype,
               bias=None if bias_bytes is None else buf(bias_bytes), kernel=kernel)


def test_bad_inputs_raise_clear_errors():
    dev = test_device()
    call(dev)  # the defaults are valid
    with pytest.raises(metalkv.GpuError,
                       match=r"\[matmul\] q4_0 weights need a row length that is a positive "
                             r"multiple of 32, got 48 \(GGUF blocks hold 32 weights\)"):
        call(dev, wtype="q4_0", n_in=48)
    with pytest.raises(metalkv.GpuError, match=r"\[matmul\] f16 weights need .* multiple of 4, got 10"):
        call(dev, wtype="f16", n_in=10)
    with pytest.raises(metalkv.GpuError,
                       match=r"\[matmul\] q4_k weights need a row length that is a positive multiple of "
                             r"256, got 576 \(GGUF K-quant super-blocks hold 256 weights\)"):
        call(dev, wtype="q4_k", n_in=576, w_bytes=8 * 1000)
    with pytest.raises(metalkv.GpuError,
                       match=r"\[matmul\] unknown weight type 'q3_k'; expected 'f32', 'f16', 'bf16', "
                             r"'q8_0', 'q4_0', 'q4_1', 'q5_0', 'q5_1', 'q4_k', 'q5_k' or 'q6_k'"):
        call(dev, wtype="q3_k")
    with pytest.raises(metalkv.GpuError, match=r"\[matmul\] unknown kernel 'gemmv'"):
        call(dev, kernel="gemmv")
    with pytest.raises(metalkv.GpuError,
                       match=r"\[matmul\] w \(n_out, n_in\) q8_0 needs 640 bytes at offset 0, "
                             r"but the buffer has 639 bytes"):
        call(dev, w_bytes=8 * 80 - 1)  # 8 rows of 2 blocks (68 bytes) padded to 80
    with pytest.raises(metalkv.GpuError, match=r"\[matmul\] x \(n_tokens, n_in\) float32 needs 768 bytes"):
        call(dev, n_tokens=3, x_bytes=512)
    with pytest.raises(metalkv.GpuError, match=r"\[matmul\] y \(n_tokens, n_out\) float32 needs 96 bytes"):
        call(dev, n_tokens=3, y_bytes=95)
    with pytest.raises(metalkv.GpuError, match=r"\[matmul\] bias \(n_out\) float32 needs 32 bytes"):
        call(dev, bias_bytes=16)
    with pytest.raises(metalkv.GpuError, match=r"\[matmul\] n_tokens and n_out must be positive"):
        call(dev, n_tokens=0)


@pytest.mark.parametrize("wtype", WTYPES)
@pytest.mark.parametrize("n_in", [96, 512])  # 96: rows of 3 blocks, padded when packed
def test_weight_sizes(wtype, n_in):
    """The op's size of a (rows, n_in) matrix is gguf's (GGML_QUANT_SIZES), with
    PACKED rows padded to 16 bytes: pack_weights returns that many, a buffer of
    exactly that size is taken, one byte less is refused with that size."""
    dev = test_device()
    rows, n_in = 8, fit(wtype, n_in)
    need = rows * device_row_bytes(wtype, n_in)
    file = np.zeros((rows, file_row_bytes(wtype, n_in)), np.uint8)
    assert ops.pack_weights(wtype, file, cols=n_in).shape == (rows, need // rows)
    call(dev, wtype=wtype, n_in=n_in, n_out=rows, w_bytes=need)
    with pytest.raises(metalkv.GpuError, match=rf"\[matmul\] w \(n_out, n_in\) {wtype} needs {need} bytes at "
                                              rf"offset 0, but the buffer has {need - 1} bytes"):
        call(dev, wtype=wtype, n_in=n_in, n_out=rows, w_bytes=need - 1)


# ---- fused epilogues -------------------------------------------------------------

@pytest.mark.parametrize("wtype", WTYPES)
@pytest.mark.parametrize("n_tokens,kernel", [(1, "gemv"), (17, "gemm")])
@pytest.mark.parametrize("gemv_rows", GEMV_ROWS)
def test_accumulate_adds_to_y(dev, wtype, n_tokens, kernel, gemv_rows):
    """y += x·Wᵀ + bias: the residual add fused into the epilogue."""
    rng = np.random.default_rng(11)
    n_out, n_in = 70, fit(wtype, 64)
    stored, w = make_weights(wtype, n_out, n_in, rng)
    x = rng.standard_normal((n_tokens, n_in)).astype(np.float32)
    bias = rng.standard_normal(n_out).astype(np.float32)
    y0 = rng.standard_normal((n_tokens, n_out)).astype(np.float32)
    y = dev.buffer_from(y0)
    ops.matmul(dev, dev.buffer_from(x), dev.buffer_from(kernel_bytes(wtype, stored)), y, n_tokens=n_tokens, n_in=n_in,
               n_out=n_out, wtype=wtype, bias=dev.buffer_from(bias), kernel=kernel, accumulate=True,
               gemv_rows=gemv_rows)
    ref = y0.astype(np.float64) + matmul(x, w, bias)
    # the matmul's tolerance plus one float32 rounding of the sum
    tol = matmul_tolerance(x, w) + 2 ** -23 * np.abs(ref)
    assert np.all(np.abs(f32(y, (n_tokens, n_out)) - ref) <= tol)


# Every kernel shape; x16: the 16-bit activations gemm (f16, bf16 weights).
@pytest.mark.parametrize("wtype", ["f32", "f16", "bf16", "q8_0", "q4_k"])
@pytest.mark.parametrize("n_tokens,kernel,x16", [(1, "gemv", False), (17, "gemm_gpu", False), (17, "gemm_host", False),
                                                 (17, "gemm_mma", False), (130, "gemm_mma", True)])
@pytest.mark.parametrize("accumulate", [False, True])
def test_gelu_epilogue(dev, wtype, n_tokens, kernel, x16, accumulate):
    """activation='gelu_tanh': y = gelu_tanh(x·Wᵀ + bias), then + y with accumulate, in the
    matmul's own pass (the SigLIP MLP's up projection). Against numpy's gelu of the
    reference matmul; and, alone, the same floats as the matmul then gelu_f32 (the
    elementwise kernel the fused pass replaces)."""
    if x16 and wtype not in ("f16", "bf16"):
        pytest.skip("activations_16bit is built for f16 and bf16 weights")
    if kernel == "gemm_host" and not dev.properties["has_host_shapes"]:
        pytest.skip("gemm_host is the host executor's shape")
    rng = np.random.default_rng(n_tokens + len(wtype))
    n_out, n_in = 70, fit(wtype, 256)
    stored, w = make_weights(wtype, n_out, n_in, rng)
    x = rng.standard_normal((n_tokens, n_in)).astype(np.float32)
    bias = rng.standard_normal(n_out).astype(np.float32)
    y0 = rng.standard_normal((n_tokens, n_out)).astype(np.float32)
    xb, wb, bb = dev.buffer_from(x), dev.buffer_from(kernel_bytes(wtype, stored)), dev.buffer_from(bias)

    def call(y, **kw):
        ops.matmul(dev, xb, wb, y, n_tokens=n_tokens, n_in=n_in, n_out=n_out, wtype=wtype, bias=bb, kernel=kernel,
                   activations_16bit=x16, **kw)
        return f32(y, (n_tokens, n_out))

    got = call(dev.buffer_from(y0), activation="gelu_tanh", accumulate=accumulate)
    xr = rounded(wtype, x) if x16 else x
    g = matmul(xr, w, bias)
    ref = gelu_pytorch_tanh(g) + (y0 if accumulate else 0.0)
    # gelu_tanh's slope is at most ~1.13: the matmul's error moves it by <= 1.13x; plus
    # float32 rounding of the activation (a few ulps) and of the residual sum.
    tol = 1.2 * matmul_tolerance(xr, w) + 1e-6 * np.abs(gelu_pytorch_tanh(g)) + 2 ** -23 * np.abs(ref) + 1e-30
    assert np.all(np.abs(got - ref) <= tol), np.abs(got - ref).max()
    assert np.abs(got - (g + (y0 if accumulate else 0.0))).max() > 0.1  # the activation is applied
    if not accumulate:  # the unfused pair: matmul, then gelu_f32 over y in place
        y = dev.buffer(n_tokens * n_out * 4)
        call(y)
        plain = run(dev, "gelu_f32", [np.array([n_tokens * n_out, 0], np.uint32).tobytes(), f32(y, (n_tokens, n_out))],
                    -(-n_tokens * n_out // 2048), 256)[1]
        np.testing.assert_array_equal(got.view(np.uint32), plain.reshape(got.shape).view(np.uint32))


def test_activation_is_refused_by_name(dev):
    with pytest.raises(metalkv.GpuError, match=r"\[matmul\] unknown activation 'relu'; expected 'none' or 'gelu_tanh'"):
        ops.matmul(dev, dev.buffer(64), dev.buffer(64), dev.buffer(64), n_tokens=1, n_in=4, n_out=4, wtype="f32",
                   activation="relu")


def run_glu(dev, x, stored, n_out, wtype, act, gemv_rows=0):
    n_tokens, n_in = x.shape
    y = dev.buffer(n_tokens * n_out * 4)
    ops.matmul_glu(dev, dev.buffer_from(np.ascontiguousarray(x)), dev.buffer_from(kernel_bytes(wtype, stored)), y,
                   n_tokens=n_tokens, n_in=n_in, n_out=n_out, wtype=wtype, act=act, gemv_rows=gemv_rows)
    return f32(y, (n_tokens, n_out))


# SmolLM2's FFN (1536 of 576) and ragged shapes: n_out not a multiple of the
# rows a threadgroup owns, several tokens.
@pytest.mark.parametrize("wtype", WTYPES)
@pytest.mark.parametrize("act,fn", [("silu", silu), ("gelu_tanh", gelu_pytorch_tanh)])
@pytest.mark.parametrize("n_tokens,n_out,n_in", [(1, 1536, 576), (3, 37, 96)])
@pytest.mark.parametrize("gemv_rows", GEMV_ROWS)
def test_glu_matches_reference(dev, wtype, act, fn, n_tokens, n_out, n_in, gemv_rows):
    n_in = fit(wtype, n_in)
    rng = np.random.default_rng(n_out)
    stored, w = make_weights(wtype, 2 * n_out, n_in, rng)
    x = rng.standard_normal((n_tokens, n_in)).astype(np.float32)
    y = run_glu(dev, x, stored, n_out, wtype, act, gemv_rows)
    g, u = matmul(x, w[:n_out]), matmul(x, w[n_out:])
    tol_g, tol_u = matmul_tolerance(x, w[:n_out]), matmul_tolerance(x, w[n_out:])
    # act'(g) is at most ~1.13 (silu, gelu_tanh), so an error e_g in g moves
    # act(g)·u by <= 1.13·e_g·|u|; plus act(g)·e_u and float32 rounding of the
    # activation and the product (a few ulps of the result).
    ref = fn(g) * u
    tol = 1.2 * tol_g * (np.abs(u) + tol_u) + np.abs(fn(g)) * tol_u + 1e-6 * np.abs(ref) + 1e-30
    assert np.all(np.abs(y - ref) <= tol), np.abs(y - ref).max()


@pytest.mark.parametrize("gemv_rows", GEMV_ROWS)
def test_glu_equals_unfused_ops_bit_for_bit(gemv_rows):
    """The fused kernel computes the same floats as gemv + gemv + swiglu_f32."""
    dev = test_device()
    rng = np.random.default_rng(5)
    n_out, n_in = 1536, 576
    stored, _ = make_weights("q4_1", 2 * n_out, n_in, rng)
    x = rng.standard_normal((1, n_in)).astype(np.float32)
    fused = run_glu(dev, x, stored, n_out, "q4_1", "silu", gemv_rows)
    gate = run_matmul(dev, x, stored[:n_out], n_out, "q4_1", kernel="gemv", gemv_rows=gemv_rows)
    up = run_matmul(dev, x, stored[n_out:], n_out, "q4_1", kernel="gemv", gemv_rows=gemv_rows)
    g, u = dev.buffer_from(gate), dev.buffer_from(up)
    ops.swiglu(dev, g, u, g, n=n_out)
    np.testing.assert_array_equal(fused, f32(g, (1, n_out)))


def test_glu_bad_inputs():
    dev = test_device()
    x, y = dev.buffer(64 * 4), dev.buffer(8 * 4)
    w = dev.buffer(16 * 80)  # (16, 64) q8_0: 2 x 8 rows of 68 bytes padded to 80
    ops.matmul_glu(dev, x, w, y, n_tokens=1, n_in=64, n_out=8, wtype="q8_0")  # valid
    with pytest.raises(metalkv.GpuError, match=r"\[matmul_glu\] w \(2 n_out, n_in\) q8_0 needs 2560 bytes at offset 0, "
                                              r"but the buffer has 1280 bytes"):
        ops.matmul_glu(dev, x, w, y, n_tokens=1, n_in=64, n_out=16, wtype="q8_0")
    with pytest.raises(metalkv.GpuError, match=r"\[matmul_glu\] unknown activation 'relu'"):
        ops.matmul_glu(dev, x, w, y, n_tokens=1, n_in=64, n_out=8, wtype="q8_0", act="relu")
    with pytest.raises(metalkv.GpuError, match=r"\[matmul_glu\] y overlaps x"):
        ops.matmul_glu(dev, x, w, x, n_tokens=1, n_in=64, n_out=8, wtype="q8_0")
    with pytest.raises(metalkv.GpuError, match=r"\[matmul\] y overlaps x"):
        ops.matmul(dev, x, w, x, n_tokens=1, n_in=64, n_out=8, wtype="q8_0")
    for fn in (ops.matmul, ops.matmul_glu):
        with pytest.raises(metalkv.GpuError, match=r"gemv_rows must be 0 \(the device's choice\), 1, 2, 4, 8 or 32, got 16"):
            fn(dev, x, w, y, n_tokens=1, n_in=64, n_out=8, wtype="q8_0", gemv_rows=16)


def test_every_kernel_weight_type_is_tested():
    """The C++ table (cpp/ops/weight_type.cpp), which the loader reads, is the list these tests run."""
    assert ops.weight_types() == WTYPES
