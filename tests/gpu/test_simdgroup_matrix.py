"""simdgroup_matrix<T, 8, 8> (metal/test/simdgroup_matrix.metal) against numpy:
loads from device and threadgroup memory with strides, origins and transposes,
products and stores, for float, half and bfloat elements; the element layout
each lane holds (docs/HOST_EXECUTOR.md "simdgroup_matrix") and the
constructors. On the host executor the products follow its documented order
(float, k = 0 .. 7, one rounding per operation), so they are checked bit for
bit there; other devices may sum in another order (a tolerance)."""
from __future__ import annotations

import numpy as np
import pytest

from .kernels import run

FIELDS = ["lda", "ldb", "ldc", "ldd", "a_x", "a_y", "b_x", "b_y", "d_x", "d_y", "ta", "tb", "td", "k_tiles",
          "accumulate"]


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, round to nearest even (as MSL's conversion)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_float(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


# (numpy storage dtype, to storage, from storage): bfloat travels as its bits.
TYPES = {
    "f32": (np.float32, lambda x: x.astype(np.float32), lambda s: s.astype(np.float32)),
    "f16": (np.float16, lambda x: x.astype(np.float16), lambda s: s.astype(np.float32)),
    "bf16": (np.uint16, bf16_bits, bf16_float),
}


def rounded(t: str, x: np.ndarray) -> np.ndarray:
    """x (float32) as type t holds it, back in float32."""
    _, to, back = TYPES[t]
    return back(to(x))


def host_order_product(a, b, c):
    """8x8 a @ b + c in float32, k in order, one rounding per multiply and add."""
    d = c.astype(np.float32).copy()
    for k in range(8):
        d = d + np.outer(a[:, k], b[k, :]).astype(np.float32)
    return d


def block(m, ld, x, y, transpose):
    """The 8x8 block at origin (column x, row y) of a row-major matrix with ld elements a row."""
    rows = m.reshape(-1, ld)
    blk = rows[y:y + 8, x:x + 8]
    return blk.T if transpose else blk


def exact(dev) -> bool:
    return dev.kind == "host"


def params(**kw) -> bytes:
    return np.array([kw[f] for f in FIELDS], np.uint32).tobytes()


@pytest.mark.parametrize("t", list(TYPES))
@pytest.mark.parametrize("k_tiles,accumulate", [(1, 1), (1, 0), (3, 1), (2, 0)])
@pytest.mark.parametrize("ta,tb,td", [(0, 0, 0), (1, 0, 0), (0, 1, 1), (1, 1, 0)])
def test_product_of_blocks(dev, t, k_tiles, accumulate, ta, tb, td):
    rng = np.random.default_rng(k_tiles * 16 + accumulate * 8 + ta * 4 + tb * 2 + td)
    storage, to, back = TYPES[t]
    # Matrices larger than the blocks, blocks away from the origin: strides and origins count.
    k = 8 * k_tiles
    lda, ldb, ldc, ldd = (k + 5 if not ta else 11), (13 if not tb else k + 3), 9, 10
    a_x, a_y, b_x, b_y, d_x, d_y = 2, 1, 3, 2, 1, 2
    a_rows = (1 + 8) if not ta else (a_y + k)
    a = rng.integers(-8, 9, (a_rows + 1) * lda).astype(np.float32) / 4
    b_rows = (b_y + k) if not tb else (b_y + 8)
    b = rng.integers(-8, 9, (b_rows + 1) * ldb).astype(np.float32) / 8
    c = rng.standard_normal(8 * ldc).astype(np.float32)
    d0 = np.full((d_y + 9) * ldd, 7.0, np.float32)  # what the store must not touch stays 7
    p = params(lda=lda, ldb=ldb, ldc=ldc, ldd=ldd, a_x=a_x, a_y=a_y, b_x=b_x, b_y=b_y, d_x=d_x, d_y=d_y,
               ta=ta, tb=tb, td=td, k_tiles=k_tiles, accumulate=accumulate)
    out = run(dev, f"test_sgm_mma_{t}", [to(a), to(b), to(c), to(d0), p], 1, 32)[3]
    got = back(out)

    a_r, b_r, c_r = rounded(t, a), rounded(t, b), rounded(t, c)
    acc = rounded(t, block(c_r, ldc, 0, 0, False)) if accumulate else np.zeros((8, 8), np.float32)
    for i in range(k_tiles):
        ao = (a_x, a_y + 8 * i) if ta else (a_x + 8 * i, a_y)
        bo = (b_x + 8 * i, b_y) if tb else (b_x, b_y + 8 * i)
        acc = rounded(t, host_order_product(block(a_r, lda, *ao, ta), block(b_r, ldb, *bo, tb), acc))
    want = np.full_like(rounded(t, d0), 7.0).reshape(-1, ldd)
    (want[d_y:d_y + 8, d_x:d_x + 8]).__setitem__(slice(None), acc.T if td else acc)
    got = got.reshape(-1, ldd)
    if exact(dev):
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol={"f32": 1e-5, "f16": 2e-3, "bf16": 1.6e-2}[t], atol=1e-2)


@pytest.mark.parametrize("t", list(TYPES))
def test_product_through_threadgroup_memory(dev, t):
    rng = np.random.default_rng(4)
    storage, to, back = TYPES[t]
    a, b, c = (rng.integers(-4, 5, 64).astype(np.float32) / 2 for _ in range(3))
    out = run(dev, f"test_sgm_mma_threadgroup_{t}", [to(a), to(b), to(c), np.zeros(64, storage)], 1, 32)[3]
    want = rounded(t, host_order_product(*(rounded(t, m).reshape(8, 8) for m in (a, b, c))))
    np.testing.assert_array_equal(back(out).reshape(8, 8), want)  # small integers over 2: exact anywhere


@pytest.mark.parametrize("t", ["f16", "bf16"])
def test_half_inputs_into_a_float_accumulator(dev, t):
    """d (float) = a b + c with a, b in half or bfloat; b loaded transposed with origin 0."""
    rng = np.random.default_rng(9)
    storage, to, back = TYPES[t]
    a = rng.standard_normal(64).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    c = rng.standard_normal(64).astype(np.float32)
    d = run(dev, f"test_sgm_mixed_{t}", [to(a), to(b), c, np.zeros(64, np.float32)], 1, 32)[3].reshape(8, 8)
    a_r, b_r = rounded(t, a).reshape(8, 8), rounded(t, b).reshape(8, 8)
    want = host_order_product(a_r, b_r.T, c.reshape(8, 8))  # products of the rounded inputs, in float
    if exact(dev):
        np.testing.assert_array_equal(d, want)
    else:
        np.testing.assert_allclose(d, want, rtol=1e-5, atol=1e-5)


def lane_layout(layout: str):
    """(row, column) of lane l's two elements on a device of this matrix_layout
    (metal/fragment.h): Apple's (the host follows it) or mma.sync's (cuda)."""
    rc = []
    for l in range(32):
        bit = [(l >> i) & 1 for i in range(5)]
        if layout == "apple":
            r, c = 4 * bit[4] + 2 * bit[2] + bit[1], 4 * bit[3] + 2 * bit[0]
        else:
            assert layout == "mma", layout
            r, c = l // 4, 2 * (l % 4)
        rc.append([(r, c), (r, c + 1)])
    return rc


@pytest.mark.parametrize("t", list(TYPES))
def test_layout_and_constructors(dev, t):
    storage, to, back = TYPES[t]
    src = np.arange(64, dtype=np.float32)  # element (r, c) holds 8r + c, exact in every type
    out = back(run(dev, f"test_sgm_layout_{t}", [to(src), np.zeros(320, storage)], 1, 32)[1])
    held = out[:64].reshape(32, 2)
    lanes = lane_layout(dev.properties["matrix_layout"])
    for lane, pair in enumerate(lanes):
        assert [held[lane, i] for i in range(2)] == [8 * r + c for r, c in pair], lane
    layout = sorted(rc for pair in lanes for rc in pair)
    assert layout == [(r, c) for r in range(8) for c in range(8)]  # every element exactly once
    np.testing.assert_array_equal(out[64:128].reshape(8, 8), 3 * np.eye(8))
    np.testing.assert_array_equal(out[128:192], np.full(64, 2.0))
    # every lane doubled its own elements; the product sees them all: 2 M x 3 I,
    # and with the changed matrix as B (the cuda device gathers its B operand then)
    np.testing.assert_array_equal(out[192:256].reshape(8, 8), 6 * src.reshape(8, 8))
    np.testing.assert_array_equal(out[256:320].reshape(8, 8), 6 * src.reshape(8, 8))


def test_a_product_needs_the_whole_simdgroup(dev):
    """16 threads: half the matrix belongs to lanes that do not exist."""
    if dev.kind != "host":
        pytest.skip("the host executor's validation")
    with pytest.raises(Exception, match="simdgroup_multiply_accumulate"):
        run(dev, "test_sgm_mma_threadgroup_f32", [np.zeros(64, np.float32)] * 3 + [np.zeros(64, np.float32)], 1, 16)


# (elements a row, step1, step2, start): a 40-element tile stepping rows then
# columns (the gemm's a operands), a 24-element one columns then rows.
LOAD4_SHAPES = [(40, 320, 8, 88), (24, 8, 192, 16)]


@pytest.mark.parametrize("t", list(TYPES))
@pytest.mark.parametrize("role", ["a", "b"])
@pytest.mark.parametrize("transpose", [0, 1])
@pytest.mark.parametrize("shape", LOAD4_SHAPES)
def test_load4_is_four_loads_in_either_role(dev, t, role, transpose, shape):
    """simdgroup_load4<B> (metal/simdgroup_tile.h) gives simdgroup_load's fragments
    whichever operand it loads them for (the CUDA device: one ldmatrix.x4 in that
    operand's layout only), and each serves as the other operand too."""
    epr, step1, step2, start = shape
    rng = np.random.default_rng(epr + 2 * transpose + (role == "b"))
    storage, to, back = TYPES[t]
    src = rng.integers(-3, 4, 1024).astype(np.float32)  # small integers: every product exact in every type
    p = np.array([epr, step1, step2, transpose, start], np.uint32).tobytes()
    out = back(run(dev, f"test_sgm_load4_{role}_{t}", [to(src), np.zeros(384, storage), p], 1, 32)[1])
    frags = []
    for q in range(4):
        at = start + (q % 2) * step1 + (q // 2) * step2
        blk = src[at:at + 8 * epr].reshape(8, epr)[:, :8]
        frags.append(blk.T if transpose else blk)
        np.testing.assert_array_equal(out[64 * q:64 * (q + 1)].reshape(8, 8), frags[q])
    np.testing.assert_array_equal(out[256:320].reshape(8, 8), frags[0] @ frags[1])
    np.testing.assert_array_equal(out[320:384].reshape(8, 8), frags[2] @ frags[3])


@pytest.mark.parametrize("t", list(TYPES))
def test_load4_refuses_unaligned_rows_on_the_host(dev, t):
    """Rows that do not start 16 bytes apart (ldmatrix's rule on the CUDA device, where
    nothing checks) are an error on the host executor, so every test run catches them."""
    if dev.kind != "host":
        pytest.skip("the host executor's validation")
    storage, to, _ = TYPES[t]
    start = 8 // np.dtype(storage).itemsize  # 8 bytes in
    p = np.array([24, 8, 192, 0, start], np.uint32).tobytes()
    with pytest.raises(Exception, match="simdgroup_load4: a fragment row is not 16-byte aligned"):
        run(dev, f"test_sgm_load4_a_{t}", [to(np.zeros(1024, np.float32)), np.zeros(384, storage), p], 1, 32)
