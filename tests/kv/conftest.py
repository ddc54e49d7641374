"""Fixtures of the KV-cache tests."""
from __future__ import annotations

import pytest

import metalkv
from devices import TEST_DEVICE, test_device  # tests/ is on sys.path


@pytest.fixture
def host() -> metalkv.Device:
    """One host device, for tests that only check bookkeeping and errors."""
    return test_device()


# The attention kernels' shapes a test runs (the variant of ops.attention_decode
# and ops.attention_prefill): on the host its own ("", the _h kernels of
# metal/attention_decode_host.metal and attention_prefill_host.metal) and the
# GPU's ("gpu"), which only the host validates where no GPU is; elsewhere the
# device's own.
DECODE_SHAPES = ["", "gpu"] if TEST_DEVICE == "host" else [""]


@pytest.fixture(params=DECODE_SHAPES, ids=lambda v: f"{v or 'device'}-shape")
def shape(request) -> str:
    return request.param


# Prefill's shapes: the decode ones and matrix units ("mma", simdgroup_matrix),
# which every device runs (emulated where it has none).
PREFILL_SHAPES = DECODE_SHAPES + ["mma"]


@pytest.fixture(params=PREFILL_SHAPES, ids=lambda v: f"{v or 'device'}-shape")
def prefill_shape(request) -> str:
    return request.param
