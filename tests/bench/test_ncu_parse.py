"""bench/gpu/ncu.py without a GPU: parsing a saved `ncu --csv --page raw` output
(tests/data/ncu_sample.csv, values written by hand), the per-kernel medians, the
table, and the error JSON when ncu is not there."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import load_script  # tests/ is on sys.path

ROOT = Path(__file__).resolve().parents[2]


def bench_gpu_module(name: str):
    return load_script(ROOT / "bench" / "gpu" / f"{name}.py")[0]


ncu = bench_gpu_module("ncu")

SAMPLE = ROOT / "tests" / "data" / "ncu_sample.csv"
# The sample's launch order: 3 calls of split-K attention (2 kernels each), then 3 of a gemv.
TARGETS = (("attn", "attn", {}), ("gemv", "matmul", {}))


def test_parse_rows():
    rows = ncu.parse_csv(SAMPLE.read_text())
    assert len(rows) == 9  # ==PROF== lines and the units row skipped
    r = rows[0]
    assert (r["kernel"], r["grid"], r["block"]) == ("attn_decode_split_f16_d128", "(8, 32, 1)", "(128, 1, 1)")
    assert r["metrics"]["gpu__time_duration.sum"] == 12000  # "12,000"
    assert r["metrics"]["dram__bytes_read.sum"] == 4194304
    assert r["metrics"]["dram__bytes_write.sum"] == 100e3  # Kbyte -> bytes
    assert "smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio" not in r["metrics"]  # n/a


def test_medians_per_target_and_kernel():
    k = ncu.aggregate(ncu.parse_csv(SAMPLE.read_text()), calls=3, targets=TARGETS)
    assert [(x["target"], x["kernel"], x["launches"]) for x in k] == [
        ("attn", "attn_decode_split_f16_d128", 3), ("attn", "attn_decode_reduce_d128", 3), ("gemv", "gemv_f16_r1", 3)]
    split, reduce, gemv = k
    # split: medians of (12000, 11000, 13000) ns, (4194304, 4200000, 4190000) + (100, 120, 110) KB
    assert split["us"] == 12.0
    assert split["dram_MB"] == pytest.approx((4194304 + 110e3) / 1e6)
    assert split["dram_GB_per_s"] == pytest.approx((4194304 + 110e3) / 12000)
    assert split["dram_pct_peak"] == 31
    assert (split["occupancy_achieved_pct"], split["occupancy_theoretical_pct"]) == (18.0, 18.75)
    assert (split["occupancy_limiter"], split["blocks_per_sm_limit"], split["registers"]) == ("registers", 3, 168)
    assert (split["warps_eligible_per_scheduler"], split["warps_issued_per_scheduler"]) == (0.31, 0.25)
    assert (split["issue_slot_pct"], split["l2_hit_pct"]) == (25, 11)
    # stalls: barrier 0.5, long_scoreboard 7, selected 1, wait 1.5 (not_selected n/a): 10 cycles per issue
    assert split["stall_cycles_per_issue"] == pytest.approx(10.0)
    assert [n for n, _ in split["top_stalls"]] == ["long_scoreboard", "wait", "barrier"]
    assert [p for _, p in split["top_stalls"]] == pytest.approx([70, 15, 5])
    # reduce: no L2 or stall values; shared memory is the limit (4 blocks)
    assert (reduce["us"], reduce["l2_hit_pct"], reduce["top_stalls"]) == (3.0, None, [])
    assert (reduce["occupancy_limiter"], reduce["blocks_per_sm_limit"]) == ("shared_mem", 4)
    assert reduce["dram_MB"] == pytest.approx(0.516)
    # gemv: long_scoreboard 4, wait 3, not_selected 1 of 9.1
    assert gemv["us"] == 14.0 and gemv["dram_pct_peak"] == 55 and gemv["occupancy_achieved_pct"] == 80
    assert [n for n, _ in gemv["top_stalls"]] == ["long_scoreboard", "wait", "not_selected"]
    assert [p for _, p in gemv["top_stalls"]] == pytest.approx([400 / 9.1, 300 / 9.1, 100 / 9.1])
    table = ncu.table(k)
    assert "| attn | attn_decode_split_f16_d128 | 12.00 | 4.3 | 359 | 31.0 | 18.0 (18.8, registers 3 blocks) | 168 |" in table
    assert "long_scoreboard 70 %, wait 15 %, barrier 5 %" in table
    reduce_cells = [c.strip() for c in table.splitlines()[3].split("|")[1:-1]]
    assert reduce_cells[8:] == ["- / -", "-", "-", "-"]  # warps per scheduler, issue %, L2 hit, stalls: n/a


def test_launch_count_mismatch_labels_by_kernel():
    k = ncu.aggregate(ncu.parse_csv(SAMPLE.read_text()), calls=2, targets=TARGETS)
    assert [x["target"] for x in k] == ["attn_decode_split_f16_d128", "attn_decode_reduce_d128", "gemv_f16_r1"]


def test_cli_from_csv_and_without_ncu(tmp_path):
    out = tmp_path / "ncu.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench/gpu/ncu.py"), "--from-csv", str(SAMPLE), "--json", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "| gemv_f16_r1 | gemv_f16_r1 | 14.00 |" in r.stdout
    assert len(json.loads(out.read_text())["kernels"]) == 3
    r = subprocess.run([sys.executable, str(ROOT / "bench/gpu/ncu.py"), "--json", str(out)],
                       capture_output=True, text=True, timeout=60, env={"PATH": str(tmp_path)})
    assert r.returncode == 0 and "ncu is not on PATH" in r.stdout
    assert json.loads(out.read_text())["error"] == "ncu is not on PATH"


def test_engine_step_table_reproduces_the_recorded_run():
    """bench/gpu/engine_kernels.py on the CSV ncu wrote on the H200 gives the table that run
    printed (recorded by the script's earlier, separate CSV reader)."""
    summary = bench_gpu_module("engine_kernels").summary

    run = ROOT / "bench" / "results" / "h200-2026-12-01-issue12b" / "final2"
    rows = ncu.parse_csv((run / "engine_kernels.csv").read_text())
    assert summary(rows, 292) + "\n" == (run / "engine_kernels.txt").read_text()
