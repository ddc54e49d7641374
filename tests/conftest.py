"""Shared pytest fixtures. Kernel tests run in every fiber order of the host
executor, so a missing barrier or an order-dependent race fails somewhere."""
from __future__ import annotations

import pathlib

import pytest

import metalkv
from devices import TEST_DEVICE, test_device

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIBER_ORDERS = ["forward", "reverse", "random"]


@pytest.fixture(params=FIBER_ORDERS if TEST_DEVICE == "host" else [TEST_DEVICE])
def dev(request) -> metalkv.Device:
    """A host device per fiber order (random is seeded so failures reproduce), or
    the one device METALKV_TEST_DEVICE names (tests/devices.py)."""
    if TEST_DEVICE != "host":
        return test_device()
    return metalkv.device("host", fiber_order=request.param, seed=20261201)
