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
