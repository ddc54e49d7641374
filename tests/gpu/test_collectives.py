"""Every SIMD-group collective against a numpy model of one SIMD-group, with
full groups and the partial last group of a threadgroup whose size is not a
multiple of 32. (Lanes that return before a collective break the contract:
tests/gpu/test_validation.py.)"""
import numpy as np
import pytest

from .kernels import run, u32

W = 32  # SIMD-group width

DTYPES = {"f32": np.float32, "f16": np.float16, "i32": np.int32, "u32": np.uint32}


def groups_of(n_threads_per_tg: int, n_tg: int):
    """(start, width) of each SIMD-group in the flattened grid."""
    for tg in range(n_tg):
        for s in range(0, n_threads_per_tg, W):
            yield tg * n_threads_per_tg + s, min(W, n_threads_per_tg - s)


def exact_values(rng, dtype, n):
    """Values whose sums are exact in the type: quarters for floats."""
    if np.issubdtype(dtype, np.floating):
        return (rng.integers(-8, 9, n) / 4).astype(dtype)
    lo = 0 if dtype == np.uint32 else -50
    return rng.integers(lo, 50, n).astype(dtype)


@pytest.mark.parametrize("suffix", list(DTYPES))
@pytest.mark.parametrize("threads,tgs,active", [(32, 1, 32), (64, 3, 32), (48, 2, 32), (84, 2, 32)])
def test_reductions_and_scans(dev, suffix, threads, tgs, active):
    dtype = DTYPES[suffix]
    n = threads * tgs
    x = exact_values(np.random.default_rng(threads + active), dtype, n)
    _, out, _ = run(dev, f"test_simd_reduce_{suffix}", [x, np.zeros(6 * n, dtype), u32(active)],
                    tgs, threads)
    out = out.reshape(6, n)
    for start, width in groups_of(threads, tgs):
        live = min(width, active)
        v = x[start:start + live]
        lanes = slice(start, start + live)
        np.testing.assert_array_equal(out[0, lanes], np.full(live, v.sum(dtype=dtype)))
        np.testing.assert_array_equal(out[1, lanes], np.full(live, v.max()))
        np.testing.assert_array_equal(out[2, lanes], np.full(live, v.min()))
        np.testing.assert_array_equal(out[3, lanes], np.cumsum(v, dtype=dtype))
        np.testing.assert_array_equal(out[4, lanes], np.cumsum(v, dtype=dtype) - v)
        np.testing.assert_array_equal(out[5, lanes], np.full(live, v[0]))
        # lanes that returned early wrote nothing
        np.testing.assert_array_equal(out[:, start + live:start + width], 0)


def test_products(dev):
    x = np.random.default_rng(3).choice([1.0, -1.0, 2.0, 0.5], 64).astype(np.float32)
    _, out = run(dev, "test_simd_product_f32", [x, np.zeros(3 * 64, np.float32)], 1, 64)
    out = out.reshape(3, 64)
    for g in range(2):
        v = x[g * W:(g + 1) * W]
        s = slice(g * W, (g + 1) * W)
        np.testing.assert_array_equal(out[0, s], np.full(W, np.prod(v)))
        np.testing.assert_array_equal(out[1, s], np.cumprod(v))
        np.testing.assert_array_equal(out[2, s], np.cumprod(v) / v)


@pytest.mark.parametrize("suffix", ["f32", "f16", "i32"])
def test_permutations(dev, suffix):
    dtype = DTYPES[suffix]
    n = 128
    x = exact_values(np.random.default_rng(7), dtype, n)
    _, out = run(dev, f"test_simd_permute_{suffix}", [x, np.zeros(6 * n, dtype)], 2, 64)
    out = out.reshape(6, n)
    lane = np.arange(W)
    for start in range(0, n, W):
        v = x[start:start + W]
        s = slice(start, start + W)
        np.testing.assert_array_equal(out[0, s], v[(lane * 7 + 3) % W])
        np.testing.assert_array_equal(out[1, s], v[lane ^ 5])
        np.testing.assert_array_equal(out[2, s], np.where(lane + 3 < W, v[np.minimum(lane + 3, W - 1)], v))
        np.testing.assert_array_equal(out[3, s], np.where(lane >= 3, v[np.maximum(lane - 3, 0)], v))
        np.testing.assert_array_equal(out[4, s], np.full(W, v[7]))
        np.testing.assert_array_equal(out[5, s], np.where(lane < 16, v[np.minimum(lane + 16, W - 1)], v))


@pytest.mark.parametrize("threads", [128, 109])  # 109: a last group of 13 lanes
def test_votes_and_bitwise(dev, threads):
    n = threads
    rng = np.random.default_rng(threads)
    x = rng.integers(0, 2**31, n).astype(np.uint32)
    pred = np.ones(n, bool)
    pred[32:64] = rng.integers(0, 2, 32).astype(bool)  # mixed group
    pred[64:96] = False                                 # nobody votes
    x = np.where(pred, x | 1, 0).astype(np.uint32)
    _, out, _ = run(dev, "test_simd_vote", [x, np.zeros(7 * n, np.uint32), u32(W)], 1, n)
    out = out.reshape(7, n)
    for start, width in groups_of(threads, 1):
        v = x[start:start + width]
        p = v != 0
        s = slice(start, start + width)
        ballot = sum(1 << i for i in range(width) if p[i])
        np.testing.assert_array_equal(out[0, s], int(p.all()))
        np.testing.assert_array_equal(out[1, s], int(p.any()))
        np.testing.assert_array_equal(out[2, s], ballot)
        np.testing.assert_array_equal(out[3, s], (np.arange(width) == 0).astype(np.uint32))
        np.testing.assert_array_equal(out[4, s], np.bitwise_and.reduce(v))
        np.testing.assert_array_equal(out[5, s], np.bitwise_or.reduce(v))
        np.testing.assert_array_equal(out[6, s], np.bitwise_xor.reduce(v))


def test_vector_collectives(dev):
    n = 64
    x = (np.random.default_rng(5).integers(-8, 9, (n, 4)) / 4).astype(np.float32)
    _, out = run(dev, "test_simd_vector", [x, np.zeros((3 * n, 4), np.float32)], 1, n)
    out = out.reshape(3, n, 4)
    lane = np.arange(n)
    for g in range(2):
        s = slice(g * W, (g + 1) * W)
        np.testing.assert_array_equal(out[0, s], np.broadcast_to(x[s].sum(axis=0), (W, 4)))
        np.testing.assert_array_equal(out[1, s], np.broadcast_to(x[s].max(axis=0), (W, 4)))
    np.testing.assert_array_equal(out[2, :, :2], x[lane ^ 1, :2])
    np.testing.assert_array_equal(out[2, :, 2:], x[:, 2:])


def test_builtins_of_a_3d_dispatch(dev):
    groups, threads = (3, 2, 2), (8, 4, 2)
    gx, gy, gz = (g * t for g, t in zip(groups, threads))
    n = gx * gy * gz
    (out,) = run(dev, "test_builtins", [np.zeros((n, 20), np.uint32)], groups, threads)
    tpt = threads[0] * threads[1] * threads[2]
    for z in range(gz):
        for y in range(gy):
            for x in range(gx):
                row = out[x + gx * (y + gy * z)]
                local = (x % 8, y % 4, z % 2)
                index = local[0] + 8 * (local[1] + 4 * local[2])
                expect = [x, y, z, *local, index, x // 8, y // 4, z // 2, 80402, 30202,
                          gx * 10000 + gy * 100 + gz, index % W, index // W, W, -(-tpt // W)]
                np.testing.assert_array_equal(row[:17], expect)
