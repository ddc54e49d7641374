"""Kernel variants as data, checked both ways on the test device.

The ops build kernel names from the kernels' own variant lists
(metal/attention_variants.h, quant.h's MKV_FOR_EACH_FORMAT, the gemv shapes);
metalkv._core.ops.kernel_names(device) lists every name they can build there,
each made by the op's own name builder (cpp/ops/kernel_names.h). Every one must
be in the device's library, and every kernel of the library must be one of them
or a test kernel (metal/test/*.metal): a kernel no op can reach is dead weight
in every build, a name an op can build but no file instantiates fails at run time.
"""
from __future__ import annotations

import pathlib
import re

from metalkv._core import ops

from devices import test_device  # tests/ is on sys.path

TEST_KERNELS = pathlib.Path(__file__).resolve().parents[2] / "metal" / "test"


def metal_test_kernels() -> set[str]:
    """The names metal/test/*.metal defines: plain kernels and MKV_KERNEL instantiations."""
    names = set()
    for f in TEST_KERNELS.glob("*.metal"):
        text = f.read_text()
        names |= set(re.findall(r"\bkernel\s+void\s+(\w+)\s*\(", text))
        names |= set(re.findall(r'MKV_KERNEL\("(\w+)"', text))
    return names


def test_every_name_an_op_builds_exists():
    dev = test_device()
    have = set(dev.kernel_names())
    built = ops.kernel_names(dev)
    assert built == sorted(set(built))
    # every family is listed, not just a few names: as many as the library's op kernels
    assert len(built) >= len(have - metal_test_kernels())
    missing = [n for n in built if n not in have]
    assert not missing, f"{len(missing)} names the ops can build are not in the library: {missing[:20]}"


def test_every_kernel_is_reachable_from_an_op_or_a_test():
    dev = test_device()
    reachable = set(ops.kernel_names(dev)) | metal_test_kernels()
    dead = sorted(set(dev.kernel_names()) - reachable)
    assert not dead, f"{len(dead)} kernels no op builds a name for: {dead[:20]}"


def test_the_test_kernels_are_found():
    names = metal_test_kernels()
    assert {"test_reduce_tree", "test_simd_reduce_f32", "broken_inactive_lane"} <= names
