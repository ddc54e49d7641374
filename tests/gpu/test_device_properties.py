"""What each device reports for launch sizes (cpp/gpu/device.h DeviceProperties,
Pipeline::resident_threadgroups_per_unit), against independent sources: the host
executor's own thread count (its device name states it), torch's view of the
CUDA GPU, and Apple's published core counts for the names Metal gives."""
from __future__ import annotations

import os
import re

import pytest

import metalkv
from devices import TEST_DEVICE, test_device

# Apple's specifications (apple.com/mac/compare, the chips' press releases): the
# smallest GPU of each name; MTLDevice.name is "Apple " + the chip.
APPLE_CORES = {"Apple M1": 7, "Apple M1 Pro": 14, "Apple M1 Max": 24, "Apple M1 Ultra": 48,
               "Apple M2": 8, "Apple M2 Pro": 16, "Apple M2 Max": 30, "Apple M2 Ultra": 60,
               "Apple M3": 8, "Apple M3 Pro": 14, "Apple M3 Max": 30, "Apple M3 Ultra": 60,
               "Apple M4": 8, "Apple M4 Pro": 16, "Apple M4 Max": 32}


@pytest.mark.parametrize("name,cores", sorted(APPLE_CORES.items()))
def test_apple_gpu_cores_by_name(name, cores):
    assert metalkv._core.apple_gpu_cores(name) == cores


@pytest.mark.parametrize("name", ["Apple M9 Hyper", "AMD Radeon Pro 5500M", "", "Apple M1 Pro Max", "apple m1"])
def test_apple_gpu_cores_unknown_is_the_fewest(name):
    assert metalkv._core.apple_gpu_cores(name) == min(APPLE_CORES.values())


def test_properties_are_positive():
    p = test_device().properties
    assert set(p) == {"compute_units", "max_threads_per_unit", "threadgroup_memory_per_unit", "memory_bytes",
                      "lanes_are_fibers", "has_host_shapes", "gemv_rows", "gemv_tokens", "matrix_units",
                      "matrix_layout", "gemm_decode_rows"}
    assert p["matrix_layout"] in ("apple", "mma")
    assert p["compute_units"] >= 1 and p["max_threads_per_unit"] >= 32
    assert p["memory_bytes"] >= 2**30  # every device we run on has a GiB
    assert p["threadgroup_memory_per_unit"] >= 32768  # Metal's per-threadgroup limit fits


@pytest.mark.skipif(TEST_DEVICE != "host", reason="the host executor's own count")
def test_host_units_are_its_threads():
    dev = metalkv.device("host")
    threads = int(re.search(r"\((\d+) threads", dev.name).group(1))
    assert dev.properties["compute_units"] == threads
    assert dev.properties["memory_bytes"] == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    pipe = dev.pipeline("test_reduce_tree")
    assert pipe.resident_threadgroups_per_unit(256) == 1  # a worker runs one threadgroup at a time


def test_shape_traits():
    # What the ops pick shapes from (device.h): the host executor runs lanes as
    # fibers and builds its own shapes; a GPU runs SIMT lanes and chooses gemv
    # widths from its wave.
    p = test_device().properties
    if TEST_DEVICE == "host":
        assert p["lanes_are_fibers"] and p["has_host_shapes"]
        assert (p["gemv_rows"], p["gemv_tokens"], p["gemm_decode_rows"]) == (32, 8, 4)
    else:
        assert not p["lanes_are_fibers"] and not p["has_host_shapes"]
        assert (p["gemv_rows"], p["gemv_tokens"]) == (0, 4)
    names = set(test_device().kernel_names())
    assert p["has_host_shapes"] == ("gemv_f16_r32_t8" in names)  # a host shape (metal/gemv_tokens.metal)


@pytest.mark.skipif(TEST_DEVICE != "cuda", reason="needs METALKV_TEST_DEVICE=cuda and torch")
def test_cuda_properties_match_torch():
    torch = pytest.importorskip("torch")
    want = torch.cuda.get_device_properties(0)
    p = metalkv.device("cuda").properties
    assert p["compute_units"] == want.multi_processor_count
    assert p["max_threads_per_unit"] == want.max_threads_per_multi_processor
    assert p["memory_bytes"] == want.total_memory


@pytest.mark.skipif(TEST_DEVICE != "cuda", reason="occupancy of a compiled CUDA kernel")
def test_cuda_occupancy_falls_with_threadgroup_memory():
    dev = metalkv.device("cuda")
    pipe = dev.pipeline("test_reduce_tree")
    p = dev.properties
    small = pipe.resident_threadgroups_per_unit(256, 0)
    assert 1 <= small <= p["max_threads_per_unit"] // 256
    # 32 KiB each (Metal's per-threadgroup limit; a CUDA block gets 48 KiB without opting in):
    # a few fit in an SM's shared memory, fewer than without it
    big = pipe.resident_threadgroups_per_unit(256, 32768)
    assert 1 <= big <= p["threadgroup_memory_per_unit"] // 32768 and big < small
