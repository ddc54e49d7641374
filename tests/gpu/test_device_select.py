"""device="auto" falls back to the host executor, with a warning that quotes the
compiler, when a GPU backend's kernels do not compile; device="metal" raises.
The C++ rules run against fake backends (device_select_check.cpp), so this is
tested on every machine, not only on a Mac."""
import shutil
import subprocess
import warnings

import pytest

import metalkv
from metalkv import _device

from .kernels import ROOT

GPU = ROOT / "cpp" / "gpu"


def test_selection_rules_with_fake_backends(tmp_path):
    exe = tmp_path / "device_select_check"
    cxx = shutil.which("c++") or "g++"
    subprocess.run([cxx, "-std=c++17", "-O1", "-I", str(GPU), str(ROOT / "tests" / "gpu" / "device_select_check.cpp"),
                    str(GPU / "device_select.cpp"), "-o", str(exe)], check=True, capture_output=True, text=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr


class _FellBack:
    kind = "host"
    fallback = "metal: [metal] kernel source sample.metal did not compile: error: ... -- running on the host"

    def __init__(self, *args, **kwargs):
        pass


def test_a_fallback_is_a_warning(monkeypatch):
    monkeypatch.setattr(_device._core, "Device", _FellBack)
    with pytest.warns(RuntimeWarning, match=r"metalkv: metal: \[metal\] kernel source sample.metal did not compile"):
        assert metalkv.device("auto").kind == "host"


def test_no_warning_without_a_fallback():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dev = metalkv.device("auto")
    assert dev.fallback == "" and dev.kind in metalkv.devices()
