#!/usr/bin/env python3
"""Where a decode step's GPU time goes: every kernel of one metalkv decode step, timed by ncu.

    python bench/gpu/engine_kernels.py --dir /tmp/metalkv-llama3-random-... [--quantize q4_0] [--json FILE]

Runs itself under `ncu --metrics gpu__time_duration.sum` (one replay pass a kernel,
--clock-control none) with --drive: Engine.load(--dir) on the cuda device, then
generate_ids of an 8-token prompt and 3 tokens (the prefill step and two decode steps).
The last decode step's launches (Engine.last_stats' dispatches per token) are summed by
kernel name: calls, total us, share of the step. ncu serializes the launches, so the sum
is the step's kernel time without launch gaps or host work; beside the engine's measured
ms/token it tells the two apart. The model dir is bench/gpu/engine.py's saved one.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ncu import parse_csv  # noqa: E402


def drive(a) -> None:
    import metalkv

    eng = metalkv.Engine.load(a.dir, device="cuda", context=1024, progress=False, quantize=a.quantize)
    eng.generate_ids(list(range(1, 9)), max_tokens=3, stop_ids=())
    print(json.dumps({"dispatches_per_token": eng.last_stats["dispatches_per_token"]}), file=sys.stderr)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--quantize", default=None)
    ap.add_argument("--json")
    ap.add_argument("--drive", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.drive:
        drive(a)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "ncu.csv"
        cmd = ["ncu", "--clock-control", "none", "--metrics", "gpu__time_duration.sum", "--csv", "--page", "raw",
               "--print-units", "base", "--log-file", str(log), sys.executable, __file__, "--drive", "--dir", a.dir]
        if a.quantize:
            cmd += ["--quantize", a.quantize]
        p = subprocess.run(cmd, capture_output=True, text=True)
        per_token = next((json.loads(l)["dispatches_per_token"] for l in p.stderr.splitlines()
                          if l.startswith('{"dispatches_per_token"')), None)
        if p.returncode or not log.exists() or per_token is None:
            print(f"engine_kernels: ncu failed (rc={p.returncode}): {(p.stderr or p.stdout)[-800:]}")
            return 0
        text = log.read_text()
        if a.json:
            Path(a.json).with_suffix(".csv").write_text(text)
    print(summary(parse_csv(text), int(per_token), a.json))
    return 0


def summary(rows: list[dict], per_token: int, json_path: str | None = None) -> str:
    """The table of the last decode step's launches (the last per_token rows that have a time)."""
    step = [r for r in rows if "gpu__time_duration.sum" in r["metrics"]][-per_token:]
    by = defaultdict(lambda: [0, 0.0])
    for r in step:
        by[r["kernel"]][0] += 1
        by[r["kernel"]][1] += r["metrics"]["gpu__time_duration.sum"] / 1e3  # ns -> us
    total = sum(v[1] for v in by.values())
    lines = [f"one decode step: {len(step)} kernels, {total / 1e3:.3f} ms of kernel time (ncu, serialized)\n",
             "| kernel | calls | us | % of the step |", "| --- | --- | --- | --- |"]
    for k, (n, us) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"| {k} | {n} | {us:.1f} | {100 * us / total:.1f} |")
    if json_path:
        Path(json_path).write_text(json.dumps({"kernels": len(step), "total_us": total,
                                               "by_kernel": {k: {"calls": n, "us": us} for k, (n, us) in by.items()}},
                                              indent=1))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
