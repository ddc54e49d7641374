"""The fiber switch on its own: x86-64 assembly, the ucontext fallback, and the
arm64 assembly under qemu-user (when the cross compiler and qemu are present;
.ci/run installs them)."""
import shutil
import subprocess

import pytest

from .kernels import ROOT
from devices import host_only  # tests/ is on sys.path

pytestmark = host_only

HOST = ROOT / "cpp" / "gpu" / "host"
SOURCES = [str(ROOT / "tests" / "gpu" / "fiber_check.cpp"), str(HOST / "fiber.cpp")]


def build_and_run(tmp_path, cxx, flags=(), runner=()):
    exe = tmp_path / "fiber_check"
    subprocess.run([cxx, "-std=c++17", "-O2", "-I", str(HOST), *flags, *SOURCES, "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    out = subprocess.run([*runner, str(exe)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr


def test_native_switch(tmp_path):
    build_and_run(tmp_path, shutil.which("c++") or "g++")


def test_ucontext_fallback(tmp_path):
    build_and_run(tmp_path, shutil.which("c++") or "g++", ["-DMKV_FIBER_UCONTEXT"])


def test_native_switch_under_asan(tmp_path):
    build_and_run(tmp_path, shutil.which("c++") or "g++", ["-fsanitize=address,undefined", "-g"])


@pytest.mark.skipif(not (shutil.which("aarch64-linux-gnu-g++") and shutil.which("qemu-aarch64")),
                    reason="needs aarch64-linux-gnu-g++ and qemu-aarch64 (Debian: g++-aarch64-linux-gnu qemu-user)")
def test_arm64_switch_under_qemu(tmp_path):
    build_and_run(tmp_path, "aarch64-linux-gnu-g++", ["-static"], ["qemu-aarch64"])
