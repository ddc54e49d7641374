"""Per-kernel timing of the host executor (Device(profile=True) or $METALKV_PROFILE=1)."""
import numpy as np

import metalkv
from .kernels import run, u32
from devices import host_only  # tests/ is on sys.path

pytestmark = host_only


def reduce_once(dev):
    x = np.ones(4096, np.float32)
    _, _, out = run(dev, "test_reduce_simd", [u32(len(x), 1024), x, np.zeros(4, np.float32)], 4, 128)
    np.testing.assert_array_equal(out, 1024)  # the profiled run still computes


def test_profile_counts_calls_and_time_per_kernel():
    dev = metalkv.Device("host", profile=True)
    assert dev.kernel_times() == {}
    for _ in range(3):
        reduce_once(dev)
    cb = dev.command_buffer()
    blit = cb.blit()
    blit.fill(dev.buffer(64), 0, 64, 1)
    blit.end()
    cb.commit()
    cb.wait()
    times = dev.kernel_times()
    assert set(times) == {"test_reduce_simd", "blit_fill"}
    calls, seconds = times["test_reduce_simd"]
    assert calls == 3 and seconds > 0
    assert times["blit_fill"][0] == 1
    dev.reset_counters()
    assert dev.kernel_times() == {}


def test_profile_is_off_by_default(monkeypatch):
    monkeypatch.delenv("METALKV_PROFILE", raising=False)
    dev = metalkv.Device("host")
    reduce_once(dev)
    assert dev.kernel_times() == {}


def test_profile_from_environment(monkeypatch):
    monkeypatch.setenv("METALKV_PROFILE", "1")
    dev = metalkv.Device("host")
    reduce_once(dev)
    assert dev.kernel_times()["test_reduce_simd"][0] == 1
    monkeypatch.setenv("METALKV_PROFILE", "0")
    assert metalkv.Device("host").kernel_times() == {}
