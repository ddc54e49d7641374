"""metalkv-bench's command line: --list, clear errors for a filter that matches
nothing and a bad --repeat, --json - with JSON alone on stdout. Runs the
installed binary ($METALKV_BENCH overrides where it is)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

BENCH = os.environ.get("METALKV_BENCH") or shutil.which("metalkv-bench")
pytestmark = pytest.mark.skipif(BENCH is None, reason="metalkv-bench is not installed (pip install .)")
GROUPS = ("attention", "fiber", "gpu_kernels_decode", "gpu_kernels_prefill", "gpu_kernels_linear", "kv_quant",
          "kv_store", "linear")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([BENCH, *args], capture_output=True, text=True, timeout=300)


def test_list_has_a_line_per_benchmark():
    r = run("--list")
    assert r.returncode == 0
    lines = r.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines] == list(GROUPS)
    assert all(len(line.split(None, 1)[1]) > 20 for line in lines)  # each with a description


def test_filter_that_matches_nothing():
    r = run("--filter", "no-such-bench")
    assert r.returncode == 2 and r.stdout == ""
    assert "--filter 'no-such-bench' matches no benchmark" in r.stderr and "kv_store" in r.stderr


@pytest.mark.parametrize("bad", ["0", "-2", "3x", "", "lots"])
def test_bad_repeat(bad):
    r = run("--repeat", bad, "--filter", "fiber")
    assert r.returncode == 2 and f"--repeat '{bad}': expected a whole number of runs" in r.stderr


def test_json_to_stdout_is_json_only():
    r = run("--filter", "fiber", "--repeat", "1", "--json", "-")
    assert r.returncode == 0
    results = json.loads(r.stdout)  # nothing but the JSON
    assert [x["name"] for x in results] == ["fiber_switch"] and results[0]["ns_per_switch"] > 0
    assert "fiber_switch" in r.stderr  # the table went to stderr


def test_unknown_argument():
    r = run("--fitler", "x")
    assert r.returncode == 2 and "unknown argument '--fitler'" in r.stderr and "usage:" in r.stderr


def test_gpu_kernel_groups_run_on_the_host_quick():
    """The GPU kernel bench's code paths (timing by difference, input rotation,
    every op it times) on the host, at its quick host sizes."""
    r = run("--filter", "gpu_kernels", "--quick", "--repeat", "1", "--json", "-")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    timed = [x for x in rows if "us" in x]
    assert {x["op"] for x in timed} >= {"attn_decode", "attn_prefill", "gemv", "gemm"}, rows
    assert all(x["us"] is not None and x["us"] > 0 for x in timed)
    assert not [x for x in rows if "failed" in x.get("note", "")]
