"""ops.embedding, rms_norm, add, scale, swiglu, geglu and argmax against
float64 numpy references."""
from __future__ import annotations

import numpy as np
import pytest

import metalkv
from metalkv._core import ops
from gpu.kernels import run

from .reference import WTYPES, f32, fit, gelu_pytorch_tanh, kernel_bytes, make_weights, rms_norm, silu
from devices import host_only, test_device  # tests/ is on sys.path

# libm's expf/tanhf are within ~1 ulp; a few float32 operations follow.
ACT_RTOL, ACT_ATOL = 4e-7, 1e-7


# ---- embedding -------------------------------------------------------------------

@pytest.mark.parametrize("wtype", WTYPES)
@pytest.mark.parametrize("scale", [1.0, float(np.sqrt(576))])  # Gemma scales by sqrt(hidden)
def test_embedding_every_type(dev, wtype, scale):
    vocab, dim = 50, fit(wtype, 96)  # K-quants: 256, one super-block a row
    rng = np.random.default_rng(vocab + dim)
    stored, table = make_weights(wtype, vocab, dim, rng)
    ids = np.array([0, 49, 7, 7, 31, 1], np.int32)  # first and last row, a repeat
    out = dev.buffer(len(ids) * dim * 4)
    ops.embedding(dev, dev.buffer_from(kernel_bytes(wtype, stored)), dev.buffer_from(ids), out, n_tokens=len(ids),
                  dim=dim, vocab=vocab, ttype=wtype, scale=scale)
    # Dequantizing is one or two float32 roundings per weight (the same operations
    # as gguf's: K-quants d·sc·q − dmin·m), times the scale; atol: a GPU may fuse
    # q·d + m, which moves a cancelling sum by up to an ulp of the larger term.
    ref = table[ids] * scale
    np.testing.assert_allclose(f32(out, (len(ids), dim)), ref, rtol=3e-7, atol=2 ** -23 * np.abs(ref).max())


def test_embedding_kernel_writes_zeros_for_out_of_range_ids(dev):
    """The kernel cannot raise (ids may come from the GPU): bad ids give zero rows."""
    vocab, dim = 4, 8
    table = np.arange(vocab * dim, dtype=np.float32).reshape(vocab, dim) + 1
    ids = np.array([3, -1, 4, 0], np.int32)
    params = np.array([len(ids), dim, vocab], np.uint32).tobytes() + np.float32(2).tobytes()
    *_, out = run(dev, "embedding_f32", [params, table, ids, np.zeros((4, dim), np.float32)], 4, 64)
    np.testing.assert_array_equal(out, [table[3] * 2, np.zeros(dim), np.zeros(dim), table[0] * 2])


def test_embedding_bad_inputs():
    dev = test_device()
    table = dev.buffer(10 * 64 * 2)
    out = dev.buffer(2 * 64 * 4)
    ids = dev.buffer_from(np.array([3, 10], np.int32))
    with pytest.raises(metalkv.GpuError,
                       match=r"\[embedding\] token id 10 at position 1 is outside \[0, 10\)"):
        ops.embedding(dev, table, ids, out, n_tokens=2, dim=64, vocab=10, ttype="f16")
    ok = dev.buffer_from(np.array([3, 9], np.int32))
    with pytest.raises(metalkv.GpuError, match=r"\[embedding\] unknown weight type 'q2_k'"):
        ops.embedding(dev, table, ok, out, n_tokens=2, dim=64, vocab=10, ttype="q2_k")
    with pytest.raises(metalkv.GpuError, match=r"\[embedding\] q6_k weights need a row length .* multiple of "
                                              r"256, got 64 \(GGUF K-quant super-blocks hold 256 weights\)"):
        ops.embedding(dev, table, ok, out, n_tokens=2, dim=64, vocab=10, ttype="q6_k")
    with pytest.raises(metalkv.GpuError, match=r"\[embedding\] q4_0 weights need a row length .* got 48"):
        ops.embedding(dev, table, ok, out, n_tokens=2, dim=48, vocab=10, ttype="q4_0")
    with pytest.raises(metalkv.GpuError,
                       match=r"\[embedding\] table \(vocab, dim\) f32 needs 2560 bytes"):
        ops.embedding(dev, table, ok, out, n_tokens=2, dim=64, vocab=10, ttype="f32")
    with pytest.raises(metalkv.GpuError, match=r"\[embedding\] out \(n_tokens, dim\) float32 needs 768"):
        ops.embedding(dev, table, dev.buffer_from(np.zeros(3, np.int32)), out, n_tokens=3, dim=64,
                      vocab=10, ttype="f16")


# ---- RMSNorm -----------------------------------------------------------------------

@pytest.mark.parametrize("wtype", ["f32", "f16"])
@pytest.mark.parametrize("w_offset", [0.0, 1.0])  # Llama's w, Gemma's (1 + w)
# hidden, QK-norm 3 tok x 9 heads, odd (scalar path), 4096 (GPUs: 8 SIMD-groups), 8192: past the
# host's registers (32 threads x 8 float4: the scalar path there), 4100: not a power of two
@pytest.mark.parametrize("n_rows,dim", [(5, 576), (27, 64), (1, 33), (2, 4096), (1, 8192), (2, 4100)])
def test_rms_norm(dev, wtype, w_offset, n_rows, dim):
    rng = np.random.default_rng(n_rows * dim)
    x = (rng.standard_normal((n_rows, dim)) * 3).astype(np.float32)
    w = rng.standard_normal(dim).astype(np.float16 if wtype == "f16" else np.float32)
    out = dev.buffer(x.nbytes)
    ops.rms_norm(dev, dev.buffer_from(x), dev.buffer_from(w), out, n_rows=n_rows, dim=dim,
                 eps=1e-5, wtype=wtype, w_offset=w_offset)
    # float32 sum of squares over <= 576 terms, then a few roundings per element.
    np.testing.assert_allclose(f32(out, x.shape), rms_norm(x, w, 1e-5, w_offset), rtol=2e-6,
                               atol=1e-6)


# The host's shape (rms_norm_<w>_h, a lane a row) is the GPU shape's arithmetic
# with one SIMD-group: the same bits, so assert_array_equal against the GPU
# kernel run on the host as the op ran it there before (a threadgroup of 32 a
# row). Rows past a threadgroup's 32, both paths (float4s; scalars past 1024
# and for odd dims), both weight types, Gemma's offset, in place.
@pytest.mark.parametrize("wtype", ["f32", "f16"])
@pytest.mark.parametrize("n_rows,dim,w_offset", [(37, 576, 0.0), (5, 64, 1.0), (3, 33, 0.0), (2, 1152, 1.0)])
@pytest.mark.parametrize("in_place", [False, True])
@host_only
def test_rms_norm_host_shape_equals_gpu_shape(wtype, n_rows, dim, w_offset, in_place):
    dev = metalkv.Device("host", profile=True)
    rng = np.random.default_rng([n_rows, dim])
    x = (rng.standard_normal((n_rows, dim)) * 3).astype(np.float32)
    w = rng.standard_normal(dim).astype(np.float16 if wtype == "f16" else np.float32)
    eps = 1e-6
    xb = dev.buffer_from(x)
    out = xb if in_place else dev.buffer(x.nbytes)
    ops.rms_norm(dev, xb, dev.buffer_from(w), out, n_rows=n_rows, dim=dim, eps=eps, wtype=wtype, w_offset=w_offset)
    assert set(dev.kernel_times()) == {f"rms_norm_{wtype}_h"}  # the op's pick on the host
    vec = dim % 4 == 0 and dim <= 4 * 8 * 32  # the op's register path with one SIMD-group
    params = (np.array([n_rows, dim], np.uint32).tobytes() + np.array([eps, w_offset], np.float32).tobytes()
              + np.array([1 if vec else 0], np.uint32).tobytes())
    gpu = run(dev, f"rms_norm_{wtype}", [params, x, w, np.zeros_like(x)], n_rows, 32)[3]
    np.testing.assert_array_equal(f32(out, x.shape), gpu)


def test_rms_norm_in_place(dev):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    w = rng.standard_normal(64).astype(np.float32)
    buf = dev.buffer_from(x)
    ops.rms_norm(dev, buf, dev.buffer_from(w), buf, n_rows=4, dim=64, eps=1e-6)
    np.testing.assert_allclose(f32(buf, x.shape), rms_norm(x, w, 1e-6, 0.0), rtol=2e-6, atol=1e-6)


def test_rms_norm_bad_inputs():
    dev = test_device()
    x, w = dev.buffer(4 * 64 * 4), dev.buffer(64 * 4)
    with pytest.raises(metalkv.GpuError, match=r"\[rms_norm\] weight type must be 'f32' or 'f16', got 'q8_0'"):
        ops.rms_norm(dev, x, w, x, n_rows=4, dim=64, eps=1e-5, wtype="q8_0")
    with pytest.raises(metalkv.GpuError, match=r"\[rms_norm\] w \(dim\) needs 512 bytes"):
        ops.rms_norm(dev, x, w, x, n_rows=1, dim=128, eps=1e-5)
    with pytest.raises(metalkv.GpuError, match=r"\[rms_norm\] x \(n_rows, dim\) float32 needs 1280"):
        ops.rms_norm(dev, x, w, x, n_rows=5, dim=64, eps=1e-5)
    with pytest.raises(metalkv.GpuError, match=r"\[rms_norm\] eps must be >= 0"):
        ops.rms_norm(dev, x, w, x, n_rows=4, dim=64, eps=-1.0)
    with pytest.raises(metalkv.GpuError, match=r"\[rms_norm\] dim must be positive"):
        ops.rms_norm(dev, x, w, x, n_rows=4, dim=0, eps=1e-5)


# ---- add, scale, swiglu, geglu -------------------------------------------------------

N_ELEMENTS = [1, 576, 2048 * 2 + 5]  # less than, within, and past whole threadgroups


@pytest.mark.parametrize("n", N_ELEMENTS)
def test_add_and_scale(dev, n):
    rng = np.random.default_rng(n)
    x, y = rng.standard_normal((2, n + 3)).astype(np.float32)  # 3 extra elements stay untouched
    yb = dev.buffer_from(y)
    ops.add(dev, yb, dev.buffer_from(x), n=n)
    expect = y.copy()
    expect[:n] += x[:n]  # one float32 rounding, as numpy does
    np.testing.assert_array_equal(f32(yb, (n + 3,)), expect)
    ops.scale(dev, yb, n=n, s=0.125)
    expect[:n] *= np.float32(0.125)
    np.testing.assert_array_equal(f32(yb, (n + 3,)), expect)


@pytest.mark.parametrize("n", N_ELEMENTS)
def test_softcap(dev, n):
    rng = np.random.default_rng(n)
    y = (rng.standard_normal(n + 3) * 60).astype(np.float32)  # around and past the cap
    yb = dev.buffer_from(y)
    ops.softcap(dev, yb, n=n, cap=30.0)
    expect = y.astype(np.float64)
    expect[:n] = 30.0 * np.tanh(expect[:n] / 30.0)
    # tanh in float32: a few ulps of a value bounded by the cap
    np.testing.assert_allclose(f32(yb, (n + 3,)), expect, rtol=0, atol=30.0 * 4e-7)
    assert np.all(np.abs(f32(yb, (n,))) <= 30.0)
    with pytest.raises(metalkv.GpuError, match=r"\[softcap\] cap must be a positive finite"):
        ops.softcap(dev, yb, n=n, cap=0.0)


@pytest.mark.parametrize("n", N_ELEMENTS)
@pytest.mark.parametrize("name,act", [("swiglu", silu), ("geglu", gelu_pytorch_tanh)])
def test_gated_activations(dev, n, name, act):
    rng = np.random.default_rng(n)
    gate = (rng.standard_normal(n) * 4).astype(np.float32)
    gate[: min(n, 4)] = [-100.0, 100.0, 0.0, -5e-3][: min(n, 4)]  # saturation and zero
    up = rng.standard_normal(n).astype(np.float32)
    out = dev.buffer(n * 4)
    getattr(ops, name)(dev, dev.buffer_from(gate), dev.buffer_from(up), out, n=n)
    np.testing.assert_allclose(f32(out, (n,)), act(gate) * up, rtol=ACT_RTOL, atol=ACT_ATOL)


@pytest.mark.parametrize("name,act", [("swiglu", silu), ("geglu", gelu_pytorch_tanh)])
def test_gated_activation_in_place_over_one_fused_buffer(dev, name, act):
    """gate and up as two halves of one buffer (as a fused gate/up matmul
    writes them), the result over the gate half. Views at offsets are the C++
    API's BufferView; from Python, copy the halves into separate buffers."""
    rng = np.random.default_rng(5)
    gate, up = rng.standard_normal((2, 1536)).astype(np.float32)
    gb = dev.buffer_from(gate)
    getattr(ops, name)(dev, gb, dev.buffer_from(up), gb, n=1536)
    np.testing.assert_allclose(f32(gb, (1536,)), act(gate) * up, rtol=ACT_RTOL, atol=ACT_ATOL)


def test_elementwise_bad_inputs():
    dev = test_device()
    small, big = dev.buffer(16), dev.buffer(64)
    with pytest.raises(metalkv.GpuError, match=r"\[add\] y \(n\) float32 needs 64 bytes at offset 0, "
                                               r"but the buffer has 16 bytes"):
        ops.add(dev, small, big, n=16)
    with pytest.raises(metalkv.GpuError, match=r"\[add\] n must be positive"):
        ops.add(dev, big, big, n=0)
    with pytest.raises(metalkv.GpuError, match=r"\[scale\] y \(n\) float32 needs 64 bytes"):
        ops.scale(dev, small, n=16, s=2.0)
    with pytest.raises(metalkv.GpuError, match=r"\[swiglu\] up \(n\) float32 needs 64 bytes"):
        ops.swiglu(dev, big, small, big, n=16)
    with pytest.raises(metalkv.GpuError, match=r"\[geglu\] out \(n\) float32 needs 64 bytes"):
        ops.geglu(dev, big, big, small, n=16)


# ---- argmax -------------------------------------------------------------------------

def run_argmax(dev, x):
    n_rows, n = x.shape
    out = dev.buffer(n_rows * 4)
    ops.argmax(dev, dev.buffer_from(np.ascontiguousarray(x, np.float32)), out, n_rows=n_rows, n=n)
    return out.numpy().view(np.int32)[:n_rows].copy()


def test_argmax_vocab_rows_with_ties(dev):
    rng = np.random.default_rng(49152)
    x = rng.standard_normal((4, 49152)).astype(np.float32)
    x[0, [40000, 300, 7]] = 9.0     # a tie across threads and SIMD-groups: lowest wins
    x[1, [49151, 256]] = 9.0        # same thread (stride 256) and the last element
    x[2, 49151] = 9.0               # only the last element
    x[3, :] = -np.inf               # all -inf: the first
    np.testing.assert_array_equal(run_argmax(dev, x), [7, 256, 49151, 0])
    y = rng.standard_normal((3, 49152)).astype(np.float32)
    np.testing.assert_array_equal(run_argmax(dev, y), np.argmax(y, axis=1))


@pytest.mark.parametrize("n", [1, 5, 255, 257])
def test_argmax_short_rows(dev, n):
    x = np.full((2, n), 1.5, np.float32)  # all tied: index 0
    x[1, n // 2] = 2.0
    np.testing.assert_array_equal(run_argmax(dev, x), [0, n // 2])


def test_argmax_never_picks_nan(dev):
    x = np.array([[np.nan, 1.0, 3.0, np.nan, 2.0], [np.nan] * 5], np.float32)
    np.testing.assert_array_equal(run_argmax(dev, x), [2, 0])


def test_argmax_bad_inputs():
    dev = test_device()
    with pytest.raises(metalkv.GpuError, match=r"\[argmax\] x \(n_rows, n\) float32 needs 800 bytes"):
        ops.argmax(dev, dev.buffer(400), dev.buffer(8), n_rows=2, n=100)
    with pytest.raises(metalkv.GpuError, match=r"\[argmax\] out \(n_rows\) int32 needs 8 bytes"):
        ops.argmax(dev, dev.buffer(800), dev.buffer(4), n_rows=2, n=100)
    with pytest.raises(metalkv.GpuError, match=r"\[argmax\] n must be positive"):
        ops.argmax(dev, dev.buffer(800), dev.buffer(8), n_rows=2, n=0)


# ---- softmax ------------------------------------------------------------------------

@pytest.mark.parametrize("n_rows,n", [(2, 49152), (3, 5), (1, 257)])
@pytest.mark.parametrize("scale", [1.0, 1 / 0.7])  # 1 / temperature
def test_softmax(dev, n_rows, n, scale):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal((n_rows, n)) * 5).astype(np.float32)
    x[0, 0] = -np.inf  # a masked entry gets probability 0
    out = dev.buffer(x.nbytes)
    ops.softmax(dev, dev.buffer_from(x), out, n_rows=n_rows, n=n, scale=scale)
    z = x.astype(np.float64) * np.float32(scale)
    ref = np.exp(z - z.max(axis=1, keepdims=True))
    ref /= ref.sum(axis=1, keepdims=True)
    # exp within ~1 ulp; the float32 sum over n terms bounds the relative error.
    np.testing.assert_allclose(f32(out, x.shape), ref, rtol=1e-5, atol=1e-9)


def test_softmax_in_place_and_bad_inputs(dev):
    x = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]], np.float32)
    buf = dev.buffer_from(x)
    ops.softmax(dev, buf, buf, n_rows=2, n=3)
    e = np.exp([-2.0, -1.0, 0.0])
    np.testing.assert_allclose(f32(buf, (2, 3)), [e / e.sum(), [1 / 3] * 3], rtol=1e-6)
    with pytest.raises(metalkv.GpuError, match=r"\[softmax\] scale must be > 0, got 0"):
        ops.softmax(dev, buf, buf, n_rows=2, n=3, scale=0.0)
    with pytest.raises(metalkv.GpuError, match=r"\[softmax\] out \(n_rows, n\) float32 needs 24 bytes"):
        ops.softmax(dev, buf, dev.buffer(20), n_rows=2, n=3)
