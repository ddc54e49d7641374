"""Reductions and scans with barriers inside loops and threadgroup arrays,
against numpy (float64), in every fiber order."""
import numpy as np
import pytest

from devices import host_only  # tests/ is on sys.path
from .kernels import run, u32


def chunk_sums(x: np.ndarray, chunk: int) -> np.ndarray:
    n_groups = -(-len(x) // chunk)
    return np.array([x[g * chunk:(g + 1) * chunk].astype(np.float64).sum() for g in range(n_groups)])


@pytest.mark.parametrize("threads", [32, 128, 256])
def test_tree_reduction(dev, threads):
    rng = np.random.default_rng(threads)
    x = rng.uniform(-1, 1, 5000).astype(np.float32)
    chunk = 700
    groups = -(-len(x) // chunk)
    partial = np.zeros(groups, np.float32)
    _, _, out, _ = run(dev, "test_reduce_tree", [u32(len(x), chunk), x, partial, None],
                       groups, threads, threadgroup_memory={0: threads * 4})
    # float32 accumulation of <= 700 terms of magnitude <= 1
    np.testing.assert_allclose(out, chunk_sums(x, chunk), rtol=0, atol=1e-4)


@pytest.mark.parametrize("threads", [32, 96, 100, 1024])
def test_simd_two_level_reduction(dev, threads):
    rng = np.random.default_rng(threads)
    x = rng.uniform(-1, 1, 20000).astype(np.float32)
    chunk = 3000
    groups = -(-len(x) // chunk)
    _, _, out = run(dev, "test_reduce_simd", [u32(len(x), chunk), x, np.zeros(groups, np.float32)],
                    groups, threads)
    np.testing.assert_allclose(out, chunk_sums(x, chunk), rtol=0, atol=1e-3)


@pytest.mark.parametrize("threads", [1, 7, 64, 256, 1024])
def test_scan_with_barriers_in_loop(dev, threads):
    groups = 3
    # Quarters: every partial sum is exact in float32, so equality is exact.
    x = (np.random.default_rng(1).integers(-8, 9, groups * threads) / 4).astype(np.float32)
    _, out = run(dev, "test_scan_inclusive", [x, np.zeros_like(x)], groups, threads)
    expect = np.cumsum(x.reshape(groups, threads), axis=1).reshape(-1)
    np.testing.assert_array_equal(out, expect)


def test_barrier_makes_neighbour_exchange_correct(dev):
    x = np.arange(200, dtype=np.float32)
    _, out = run(dev, "test_neighbour_barrier", [x, np.zeros_like(x)], 1, 200)
    np.testing.assert_array_equal(out, np.roll(x, -1))


@host_only  # poisoned threadgroup memory and fiber orders are the host executor's
def test_poisoned_memory_exposes_missing_barrier(dev):
    """Without the barrier some thread reads a slot before its owner wrote it;
    the executor's poison (NaN) makes that visible in every fiber order."""
    x = np.arange(200, dtype=np.float32)
    _, out = run(dev, "test_neighbour_no_barrier", [x, np.zeros_like(x)], 1, 200)
    assert np.isnan(out).any()
    ok = ~np.isnan(out)
    np.testing.assert_array_equal(out[ok], np.roll(x, -1)[ok])
