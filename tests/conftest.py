"""Shared pytest fixtures. Kernel tests run in every fiber order of the host
executor, so a missing barrier or an order-dependent race fails somewhere.
METALKV_TEST_FIBER_ORDERS (a comma list of them) runs fewer: CI splits them, the
release stage forward and reverse, the sanitizer stage random (an out-of-bounds
read is one in any order), so each runs every kernel test once (.ci/run)."""
from __future__ import annotations

import os
import pathlib
import sys

import pytest

import metalkv
from devices import TEST_DEVICE, test_device

ROOT = pathlib.Path(__file__).resolve().parents[1]
ALL_FIBER_ORDERS = ["forward", "reverse", "random"]
FIBER_ORDERS = (os.environ.get("METALKV_TEST_FIBER_ORDERS") or ",".join(ALL_FIBER_ORDERS)).split(",")
if not FIBER_ORDERS or not set(FIBER_ORDERS) <= set(ALL_FIBER_ORDERS):
    raise pytest.UsageError(f"METALKV_TEST_FIBER_ORDERS={os.environ['METALKV_TEST_FIBER_ORDERS']!r}: "
                            f"a comma list of {', '.join(ALL_FIBER_ORDERS)}")

# No test may change sys.path or the environment for the tests after it: bench/gpu put on
# sys.path once let its kernels.py shadow the PyPI package `kernels`, which transformers
# imports, and every transformers test after it failed. pytest itself adds test directories.
_SYS_PATH = list(sys.path)
_ENVIRON = dict(os.environ)
# Set by pytest itself, by torch's inductor when first imported, and by torch's import where it
# loads Intel's OpenMP (the KMP_* two, seen on the H200 machine): a library's, not a test's.
_LIBRARY_ENV = {"PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR", "KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK"}


def _sys_path_leaks() -> list[str]:
    tests = ROOT / "tests"
    return [p for p in sys.path if p not in _SYS_PATH
            and not (pathlib.Path(p).resolve() == tests or tests in pathlib.Path(p).resolve().parents)]


def pytest_collection_finish(session):
    leaks = _sys_path_leaks()
    if leaks:
        raise pytest.UsageError(f"collecting the tests put {leaks} on sys.path; load such a module by its path "
                                "(tests/scripts.py load_script) instead")


@pytest.fixture(autouse=True)
def _no_leaks_between_tests():
    yield
    leaks = _sys_path_leaks()
    env = {k for k in set(os.environ) | set(_ENVIRON) if os.environ.get(k) != _ENVIRON.get(k) and k not in _LIBRARY_ENV}
    sys.path[:] = [p for p in sys.path if p not in leaks]
    for k in env:
        if k in _ENVIRON:
            os.environ[k] = _ENVIRON[k]
        else:
            del os.environ[k]
    assert not leaks and not env, (f"this test left {leaks} on sys.path and changed the environment's {sorted(env)}: "
                                   "use monkeypatch (it undoes both)")


@pytest.fixture(params=FIBER_ORDERS if TEST_DEVICE == "host" else [TEST_DEVICE])
def dev(request) -> metalkv.Device:
    """A host device per fiber order (random is seeded so failures reproduce), or
    the one device METALKV_TEST_DEVICE names (tests/devices.py)."""
    if TEST_DEVICE != "host":
        return test_device()
    return metalkv.device("host", fiber_order=request.param, seed=20261201)
