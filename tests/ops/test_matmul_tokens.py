"""Several-token gemv (metal/gemv.h, gemv_tokens.metal): a batched decode step's
projections read each weight once per gemv_tokens tokens, and every token's
outputs are bit-identical to the same token through the one-token gemv. That
identity is what lets a sequence decoded in a batch get exactly what it gets
alone (docs/BATCHING.md), so it is checked with array_equal, for every weight
format, every width (rows per SIMD-group) and token counts that leave the last
threadgroup row part-full; and against the float64 reference like any gemv."""
from __future__ import annotations

import numpy as np
import pytest

import metalkv
from metalkv._core import ops

from devices import TEST_DEVICE, test_device  # tests/ is on sys.path
from .reference import WTYPES, f32, fit, kernel_bytes, make_weights, matmul, matmul_tolerance, silu

# (rows, tokens): the host's shapes take 8 tokens, the GPU shapes 4. The host
# executor builds both families, GPUs only theirs (metal/gemv_tokens.metal).
HOST_SHAPES = [(8, 8), (32, 8)] if TEST_DEVICE == "host" else []
SHAPES = HOST_SHAPES + [(1, 4), (2, 4)]


def gemv(dev, x, stored, n_out, wtype, rows, tokens, bias=None, accumulate=None):
    n_tokens, n_in = x.shape
    y = dev.buffer_from(accumulate) if accumulate is not None else dev.buffer(n_tokens * n_out * 4)
    ops.matmul(dev, dev.buffer_from(np.ascontiguousarray(x)), dev.buffer_from(kernel_bytes(wtype, stored)), y,
               n_tokens=n_tokens, n_in=n_in, n_out=n_out, wtype=wtype, kernel="gemv", gemv_rows=rows,
               gemv_tokens=tokens, bias=None if bias is None else dev.buffer_from(bias),
               accumulate=accumulate is not None)
    return f32(y, (n_tokens, n_out))


def glu(dev, x, stored, n_out, wtype, rows, tokens):
    n_tokens, n_in = x.shape
    y = dev.buffer(n_tokens * n_out * 4)
    ops.matmul_glu(dev, dev.buffer_from(np.ascontiguousarray(x)), dev.buffer_from(kernel_bytes(wtype, stored)), y,
                   n_tokens=n_tokens, n_in=n_in, n_out=n_out, wtype=wtype, act="silu", gemv_rows=rows,
                   gemv_tokens=tokens)
    return f32(y, (n_tokens, n_out))


@pytest.mark.parametrize("wtype", WTYPES)
@pytest.mark.parametrize("rows,tokens", SHAPES)
@pytest.mark.parametrize("n_tokens", [2, 5, 9])
def test_each_token_is_bit_identical_to_a_one_token_gemv(wtype, rows, tokens, n_tokens):
    dev = test_device()
    rng = np.random.default_rng(n_tokens * 31 + rows)
    n_out, n_in = 37, fit(wtype, 96)  # ragged rows: the last SIMD-group re-reads its last row
    stored, w = make_weights(wtype, n_out, n_in, rng)
    x = rng.standard_normal((n_tokens, n_in)).astype(np.float32)
    bias = rng.standard_normal(n_out).astype(np.float32)
    together = gemv(dev, x, stored, n_out, wtype, rows, tokens, bias=bias)
    for t in range(n_tokens):
        alone = gemv(dev, x[t:t + 1], stored, n_out, wtype, rows, 1, bias=bias)
        np.testing.assert_array_equal(together[t], alone[0], err_msg=f"token {t}")
    assert np.all(np.abs(together - matmul(x, w, bias)) <= matmul_tolerance(x, w))


# Widths that sum a row the same way: the host's simd_sum shape (f16/bf16 in
# 4-weight chunks), its row-a-lane shape (32 rows: gemv_lanes, a lane sums a
# whole row in order) and the GPU's (8-weight chunks). The engine keeps a
# weight in one family whatever the token count (cpp/ops/linear.cpp gemv_rows).
FAMILIES = {"host": [(8, 1), (8, 8)], "host_lanes": [(32, 1), (32, 8)], "gpu": [(1, 4), (2, 4), (4, 1)]}


@pytest.mark.parametrize("wtype", ["f16", "q4_1", "q6_k"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_widths_of_a_family_agree_and_accumulate_adds(wtype, family):
    """The width changes which SIMD-group owns a row, not a row's sums: within a
    family every width and token count gives the same bits; accumulate adds y once."""
    if family.startswith("host") and TEST_DEVICE != "host":
        pytest.skip("the 8-token shapes are the host executor's")
    dev = test_device()
    rng = np.random.default_rng(7)
    n_out, n_in = 70, fit(wtype, 256)
    stored, _ = make_weights(wtype, n_out, n_in, rng)
    x = rng.standard_normal((6, n_in)).astype(np.float32)
    y0 = rng.standard_normal((6, n_out)).astype(np.float32)
    rows0 = FAMILIES[family][0][0]
    base = np.concatenate([gemv(dev, x[t:t + 1], stored, n_out, wtype, rows0, 1) for t in range(6)])
    for rows, tokens in FAMILIES[family]:
        np.testing.assert_array_equal(gemv(dev, x, stored, n_out, wtype, rows, tokens), base)
        np.testing.assert_array_equal(gemv(dev, x, stored, n_out, wtype, rows, tokens, accumulate=y0), y0 + base)


@pytest.mark.parametrize("wtype", WTYPES)
@pytest.mark.parametrize("rows,tokens", SHAPES)
def test_glu_tokens_are_bit_identical_to_one_token(wtype, rows, tokens):
    dev = test_device()
    rng = np.random.default_rng(11)
    n_out, n_in = 45, fit(wtype, 64)
    stored, w = make_weights(wtype, 2 * n_out, n_in, rng)
    x = rng.standard_normal((7, n_in)).astype(np.float32)
    together = glu(dev, x, stored, n_out, wtype, rows, tokens)
    for t in range(7):
        np.testing.assert_array_equal(together[t], glu(dev, x[t:t + 1], stored, n_out, wtype, rows, 1)[0])
    ref = silu(matmul(x, w[:n_out])) * matmul(x, w[n_out:])
    assert np.allclose(together, ref, rtol=1e-3, atol=1e-3 * np.abs(ref).max())


def test_unbuilt_token_shapes_are_clear_errors():
    dev = test_device()
    x, w, y = dev.buffer(4 * 64 * 4), dev.buffer(8 * 64 * 2), dev.buffer(4 * 8 * 4)
    kw = dict(n_tokens=4, n_in=64, n_out=8, wtype="f16", kernel="gemv")
    with pytest.raises(metalkv.GpuError, match=r"gemv_tokens must be 0 \(the device's choice\), 1, 4 or 8, got 3"):
        ops.matmul(dev, x, w, y, gemv_tokens=3, **kw)
    if dev.kind == "host":
        with pytest.raises(metalkv.GpuError, match=r"gemv_tokens 8 is built for 8 or 32 gemv_rows, got 2"):
            ops.matmul(dev, x, w, y, gemv_tokens=8, gemv_rows=2, **kw)
    else:
        with pytest.raises(metalkv.GpuError, match=rf"gemv_tokens 8 is a host executor shape, not built for "
                                                   rf"{dev.kind} \(GPUs: 1 or 4\)"):
            ops.matmul(dev, x, w, y, gemv_tokens=8, gemv_rows=8, **kw)
    with pytest.raises(metalkv.GpuError, match=r"gemv_tokens 4 is built for 1 or 2 gemv_rows, got 32"):
        ops.matmul(dev, x, w, y, gemv_tokens=4, gemv_rows=32, **kw)
    glu_kw = dict(n_tokens=4, n_in=64, n_out=4, wtype="f16", act="silu")
    with pytest.raises(metalkv.GpuError, match=r"gemv_tokens 4 is built for 1 or 2 gemv_rows, got 32"):
        ops.matmul_glu(dev, x, w, y, gemv_tokens=4, gemv_rows=32, **glu_kw)
