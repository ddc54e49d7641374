"""The device the kernel and engine suites run on.

    METALKV_TEST_DEVICE=cuda pytest tests/gpu tests/kv tests/ops tests/engine

runs them unchanged on a CUDA GPU (default: host, the executor every machine
has). Tests about the host executor itself (fibers, its validation errors, its
profiler) are marked host_only and skip elsewhere.
"""
from __future__ import annotations

import os

import pytest

import metalkv

TEST_DEVICE = os.environ.get("METALKV_TEST_DEVICE", "host")
host_only = pytest.mark.skipif(TEST_DEVICE != "host",
                               reason=f"about the host executor itself (METALKV_TEST_DEVICE={TEST_DEVICE})")


def test_device(**host_options) -> metalkv.Device:
    """A device of TEST_DEVICE; host_options (fiber_order, seed) apply to the host executor only."""
    if TEST_DEVICE == "host":
        return metalkv.device("host", **host_options)
    return metalkv.device(TEST_DEVICE)


test_device.__test__ = False  # a helper, not a test, for pytest's collector
