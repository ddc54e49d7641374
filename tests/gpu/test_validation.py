"""Every validation error of the host executor, provoked on purpose and
asserted by its message: kernel, .metal line, threadgroup and lanes."""
import re

import numpy as np
import pytest

import metalkv
from .kernels import line_of, run
from devices import host_only  # tests/ is on sys.path

pytestmark = host_only

BROKEN = "metal/test/broken.metal"


def expect_error(dev, kernel, args, groups, threads, *fragments):
    with pytest.raises(metalkv.GpuError) as info:
        run(dev, kernel, args, groups, threads)
    message = str(info.value)
    assert f"kernel '{kernel}'" in message
    for fragment in fragments:
        assert re.search(fragment, message), f"{fragment!r} not in: {message}"
    return message


def at(needle, after):
    return re.escape(f"{BROKEN}:{line_of(BROKEN, needle, after)}")


def test_barrier_divergence(dev):
    expect_error(dev, "broken_barrier_divergence", [np.zeros(64, np.float32)], (2, 1, 1), 64,
                 "barrier divergence", r"threadgroup \([01],0,0\)",  # either group may fail first
                 at("threadgroup_barrier", "broken_barrier_divergence"),
                 at("threadgroup_barrier", "} else {"))


def test_barrier_after_return(dev):
    msg = expect_error(dev, "broken_barrier_after_return", [np.zeros(64, np.float32)], 1, 64,
                       "barrier divergence", at("threadgroup_barrier", "broken_barrier_after_return"))
    assert re.search(r"threads? \d+", msg)


def test_collective_reached_by_part_of_the_lanes(dev):
    expect_error(dev, "broken_partial_collective", [np.zeros(32, np.float32)], 1, 32,
                 "reached by only part of the live lanes of SIMD-group 0",
                 r"threads 0-15 at simd_sum \(" + at("simd_sum", "broken_partial_collective"),
                 r"threads 16-31 at threadgroup_barrier \(" +
                 at("threadgroup_barrier", "broken_partial_collective"))


def test_mismatched_collectives(dev):
    expect_error(dev, "broken_mismatched_collectives", [np.zeros(32, np.float32)], 1, 32,
                 "mismatched collectives in SIMD-group 0",
                 r"threads 0-15 at simd_sum \(" + at("simd_sum", "broken_mismatched"),
                 r"threads 16-31 at simd_max \(" + at("simd_max", "broken_mismatched"))


def test_reading_an_inactive_lane(dev):
    expect_error(dev, "broken_inactive_lane", [np.zeros(32, np.float32)], 1, 16,
                 "reading an inactive lane", r"thread 0 \(lane 0 of SIMD-group 0\) read lane 16",
                 "simd_shuffle_down", at("simd_shuffle_down", "broken_inactive_lane"))


def test_lanes_that_returned_before_a_collective(dev):
    """Every lane of a SIMD-group must reach each simd_* call: the CUDA device runs
    them as full-warp operations, undefined once lanes have exited."""
    expect_error(dev, "broken_return_before_simd", [np.zeros(32, np.float32)], 1, 32,
                 r"thread\(s\) 20, 21, .*, 31 of SIMD-group 0 returned before simd_sum",
                 at("simd_sum", "broken_return_before_simd"), "every lane of a SIMD-group must reach")


def test_threadgroup_memory_limit(dev):
    expect_error(dev, "broken_threadgroup_memory", [np.zeros(64, np.float32)], 1, 64,
                 "threadgroup memory exceeds 32768 bytes", "36000-byte")


def test_threadgroup_memory_limit_for_bound_lengths(dev):
    cb = dev.command_buffer()
    enc = cb.compute()
    enc.set_pipeline(dev.pipeline("test_reduce_tree"))
    enc.set_threadgroup_memory(0, 40000)
    with pytest.raises(metalkv.GpuError, match="40000 bytes exceeds the 32768-byte limit"):
        enc.dispatch((1, 1, 1), (32, 1, 1))


def test_too_many_threads(dev):
    expect_error(dev, "test_neighbour_barrier", [np.zeros(4, np.float32), np.zeros(4, np.float32)],
                 1, (1025, 1, 1), r"\(1025,1,1\) = 1025 threads; this pipeline holds 1 to 1024 \(a threadgroup's limit\)")


def test_more_threads_than_the_kernel_declares(dev):
    """rms_norm_f32 is [[max_total_threads_per_threadgroup(kRmsNormSimds * 32)]]: a
    dispatch that passes the device's limit but not the kernel's is refused, as Metal
    refuses it."""
    x = np.zeros(512, np.float32)
    expect_error(dev, "rms_norm_f32", [np.zeros(20, np.uint8), x, x, x], 1, (512, 1, 1),
                 r"512 threads; this pipeline holds 1 to 256 \(\[\[max_total_threads_per_threadgroup\]\]\)")


def test_unknown_kernel(dev):
    with pytest.raises(metalkv.GpuError, match=r"unknown kernel 'no_such_kernel'; known kernels: .*gemv_f16"):
        dev.pipeline("no_such_kernel")


def test_unbound_buffer(dev):
    expect_error(dev, "test_neighbour_barrier", [np.zeros(4, np.float32), None], 1, 4,
                 r"parameter 'out' needs buffer index 1, which is not bound",
                 re.escape("metal/test/reduce.metal:") + str(line_of("metal/test/reduce.metal", "test_neighbour_barrier")))


def test_constant_struct_larger_than_bound_bytes(dev):
    expect_error(dev, "broken_wide_constant", [np.zeros(3, np.float32).tobytes(), np.zeros(8, np.float32)],
                 1, 8, r"parameter 'p' refers to a 32-byte struct but buffer index 0 has only 12 bytes bound")


def test_unset_threadgroup_memory(dev):
    expect_error(dev, "test_reduce_tree", [b"\0" * 8, np.zeros(4, np.float32), np.zeros(1, np.float32)],
                 1, 32, r"parameter 'scratch' needs threadgroup memory index 0, whose length was never set")


def test_api_misuse_is_reported():
    dev = metalkv.device("host")
    cb = dev.command_buffer()
    with pytest.raises(metalkv.GpuError, match="wait\\(\\) called before commit\\(\\)"):
        cb.wait()
    enc = cb.compute()
    with pytest.raises(metalkv.GpuError, match="only one encoder may be open"):
        cb.blit()
    with pytest.raises(metalkv.GpuError, match="at most 4096"):
        enc.set_bytes(0, b"\0" * 5000)
    with pytest.raises(metalkv.GpuError, match="dispatch_threadgroups before set_pipeline"):
        enc.dispatch((1, 1, 1), (1, 1, 1))
    with pytest.raises(metalkv.GpuError, match="end_encoding\\(\\) on the open encoder before commit"):
        cb.commit()
    enc.end()
    with pytest.raises(metalkv.GpuError, match="the encoder has ended"):
        enc.set_bytes(0, b"\0")
    cb.commit()
    cb.wait()
    with pytest.raises(metalkv.GpuError, match="commit\\(\\) called twice"):
        cb.commit()
    with pytest.raises(metalkv.GpuError, match="unknown device kind 'gpu'"):
        metalkv.device("gpu")
    with pytest.raises(metalkv.GpuError, match="unknown fiber order 'sideways'"):
        metalkv.device("host", fiber_order="sideways")


def test_a_failed_dispatch_leaves_the_device_usable(dev):
    with pytest.raises(metalkv.GpuError):
        run(dev, "broken_mismatched_collectives", [np.zeros(32, np.float32)], 4, 32)
    x = np.arange(64, dtype=np.float32)
    _, out = run(dev, "test_neighbour_barrier", [x, np.zeros_like(x)], 1, 64)
    np.testing.assert_array_equal(out, np.roll(x, -1))
