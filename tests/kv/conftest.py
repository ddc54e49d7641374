"""Fixtures of the KV-cache tests."""
from __future__ import annotations

import pytest

import metalkv
from devices import test_device  # tests/ is on sys.path


@pytest.fixture
def host() -> metalkv.Device:
    """One host device, for tests that only check bookkeeping and errors."""
    return test_device()
