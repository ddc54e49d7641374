"""half arithmetic, vectors and swizzles, and atomics, against numpy."""
import numpy as np

from .kernels import run


def test_half_arithmetic_rounds_like_numpy_float16(dev):
    rng = np.random.default_rng(0)
    n = 4096
    a = rng.uniform(-60, 60, n).astype(np.float16)
    b = rng.uniform(-60, 60, n).astype(np.float16)
    _, _, out = run(dev, "test_half_arith", [a, b, np.zeros(6 * n, np.float16)], n // 256, 256)
    out = out.reshape(6, n)
    # numpy float16 rounds after every operation, like _Float16 here.
    np.testing.assert_array_equal(out[0], a + b)
    np.testing.assert_array_equal(out[1], a * b)
    np.testing.assert_array_equal(out[2], (a * b) + a)
    np.testing.assert_array_equal(out[3], a / (np.abs(b) + np.float16(1)))
    np.testing.assert_array_equal(out[4], (a.astype(np.float32) * np.float32(3)).astype(np.float16))
    np.testing.assert_array_equal(out[5], np.maximum(a, b))


def test_vectors_and_swizzles(dev):
    n = 256
    v = (np.random.default_rng(1).integers(-16, 17, (n, 4)) / 8).astype(np.float32)
    _, out = run(dev, "test_vectors", [v, np.zeros((7 * n, 4), np.float32)], 2, 128)
    out = out.reshape(7, n, 4)
    x, y, z, w = v.T
    np.testing.assert_array_equal(out[0], v[:, ::-1])
    np.testing.assert_array_equal(out[1], np.stack([x + z, y + w, z, w], 1))
    np.testing.assert_array_equal(out[2], np.stack([x * 2, y * 2, z - w, z - w], 1))
    np.testing.assert_array_equal(out[3], v.astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(out[4], np.stack([y, np.zeros(n), y, (v * v).sum(1)], 1))
    np.testing.assert_array_equal(out[5], np.where(v > 0.5, v, -1.0))
    bits = v[:, :2].copy().view(np.uint32)
    np.testing.assert_array_equal(out[6, :, 0], v[:, 1])
    np.testing.assert_array_equal(out[6, :, 1], v[:, 0])
    np.testing.assert_array_equal(out[6, :, 2], (bits[:, 0] >> 31).astype(np.float32))


def test_atomics_across_threadgroups(dev):
    n, threads = 64 * 1024, 256
    bins = np.random.default_rng(2).integers(0, 1000, n).astype(np.uint32)
    _, hist, tg_hist, total = run(
        dev, "test_atomics",
        [bins, np.zeros(16, np.uint32), np.zeros(16, np.uint32), np.zeros(1, np.int32)],
        n // threads, threads)
    expect = np.bincount(bins % 16, minlength=16)
    np.testing.assert_array_equal(hist, expect)
    np.testing.assert_array_equal(tg_hist, expect)
    assert total[0] == int((bins % 16).astype(np.int64).sum() - 8 * n)


def test_vector_operators_match_numpy(dev):
    """The operators the host runs on the compiler's vectors (mkv_prelude_native.h)
    and those it keeps per element, against numpy: integer wrap-around, shifts,
    division, uchar arithmetic, comparisons with NaN into bool vectors,
    conversions (uint to float rounds, float to half to nearest even)."""
    rng = np.random.default_rng(3)
    n = 512
    u = rng.integers(0, 2**32, (2 * n, 4), dtype=np.uint64).astype(np.uint32)
    f = rng.uniform(-8, 8, (2 * n, 4)).astype(np.float32)
    f[::7, 1] = np.nan
    f[1::2][::5, 2] = -f[::2][::5, 2]  # -x == y somewhere
    _, _, uo, fo = run(dev, "test_vector_ops", [u, f, np.zeros((8 * n, 4), np.uint32), np.zeros((5 * n, 4), np.float32)],
                       n // 128, 128)
    a, b, x, y = u[0::2], u[1::2], f[0::2], f[1::2]
    uo, fo = uo.reshape(8, n, 4), fo.reshape(5, n, 4)
    with np.errstate(over="ignore", invalid="ignore"):
        np.testing.assert_array_equal(uo[0], a + b * np.uint32(3) - (a ^ b))
        np.testing.assert_array_equal(uo[1], (a << (b & 31)) | (a >> 7))
        np.testing.assert_array_equal(uo[2], ~a & (b | np.uint32(0xF0F0F0F0)))
        np.testing.assert_array_equal(uo[3], a // (b | 1) + a % (b | 1))
        ai, bi = a.view(np.int32).astype(np.int64), b.view(np.int32).astype(np.int64)
        q = np.trunc(ai / -3).astype(np.int64)  # C division truncates toward zero
        np.testing.assert_array_equal(uo[4], ((q - bi * 2) % 2**32).astype(np.uint32))
        c, d = a[:, 0].copy().view(np.uint8).reshape(n, 4), b[:, 0].copy().view(np.uint8).reshape(n, 4)
        np.testing.assert_array_equal(uo[5, :, 0], (c + d).view(np.uint32).ravel())
        np.testing.assert_array_equal(uo[5, :, 1], (c << 1).astype(np.uint8).view(np.uint32).ravel())
        np.testing.assert_array_equal(uo[5, :, 2], (c * d).view(np.uint32).ravel())
        np.testing.assert_array_equal(uo[5, :, 3], c[:, 0].astype(np.uint32) + d[:, 3])
        flags = (x < y) * 1 + (a >= b) * 2 + (x != x) * 4 + (-x == y) * 8
        np.testing.assert_array_equal(uo[6], flags.astype(np.uint32))
        in_range = np.where(np.isnan(x), np.float32(0), np.abs(x))  # what the kernel truncates
        np.testing.assert_array_equal(uo[7], np.trunc(in_range).astype(np.uint32))
        # Products and sums: exact on the host (no contraction); a GPU compiler may fuse
        # a*b + c into one FMA (one rounding instead of two), a few ulps of values < 256.
        exact = np.testing.assert_array_equal if dev.kind == "host" else \
            (lambda got, want: np.testing.assert_allclose(got, want, rtol=0, atol=2.0 ** -13))
        exact(fo[0], x * y + np.float32(2.5) - y / (np.abs(x) + np.float32(1)))
        np.testing.assert_array_equal(fo[1], a.astype(np.float32))
        np.testing.assert_array_equal(fo[2], (x * np.float32(1000)).astype(np.float16).astype(np.float32))
        dots = (x * y).astype(np.float32)
        exact(fo[3, :, 0], ((dots[:, 0] + dots[:, 1]) + dots[:, 2]) + dots[:, 3])
        exact(fo[3, :, 1], x[:, 0] * y[:, 2] + x[:, 1] * y[:, 3])
        np.testing.assert_array_equal(fo[3, :, 2], -x[:, 2])
        np.testing.assert_array_equal(fo[3, :, 3], c[:, 3].astype(np.float32))
        np.testing.assert_array_equal(fo[4, :, :3], x[:, :3] * np.float32(2) + y[:, :3])
