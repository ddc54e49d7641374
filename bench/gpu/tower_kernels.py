#!/usr/bin/env python3
"""Where a tower's encode goes, kernel by kernel: from `ncu --csv --page raw --metrics
gpu__time_duration.sum` over bench/gpu/vision.py --encode-only (a warm-up encode, then
one more), the second encode's kernels summed by name, largest first, with their share.

    python bench/gpu/tower_kernels.py NCU_CSV [--json FILE]   # tools/cuda_run.sh tower-kernels

ncu serializes the kernels and replays each, so the sum is the kernels' own time, not the
encode's wall time (no launch gaps); bench/gpu/vision.py times the whole encode.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table  # noqa: E402
from ncu import parse_csv  # noqa: E402


def summarize(rows: list[dict]) -> list[dict]:
    """The second half of the launches (the second encode), summed per kernel name."""
    second = rows[len(rows) // 2:]
    time, count = collections.Counter(), collections.Counter()
    for r in second:
        time[r["kernel"]] += r["metrics"].get("gpu__time_duration.sum", 0.0)
        count[r["kernel"]] += 1
    total = sum(time.values()) or 1.0
    return [{"kernel": k, "launches": count[k], "ms": t / 1e6, "share": t / total} for k, t in time.most_common()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", type=Path)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    rows = parse_csv(a.csv.read_text())
    if len(rows) < 2 or len(rows) % 2:
        print(f"tower_kernels: expected two encodes' launches, got {len(rows)} rows", file=sys.stderr)
        return 1
    kernels = summarize(rows)
    total = sum(k["ms"] for k in kernels)
    print(table(["kernel", "launches", "ms", "share"],
                [[k["kernel"], k["launches"], f"{k['ms']:.3f}", f"{100 * k['share']:.1f} %"] for k in kernels]
                + [["all", sum(k["launches"] for k in kernels), f"{total:.3f}", "100 %"]]))
    if a.json:
        a.json.write_text(json.dumps({"kernels": kernels, "total_ms": total}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
