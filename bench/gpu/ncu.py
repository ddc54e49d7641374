#!/usr/bin/env python3
"""Hardware counters of metalkv's bandwidth-bound kernels (and, with --targets compute, of
the matrix-unit prefill attention and gemm), from Nsight Compute (ncu).

    python bench/gpu/ncu.py [--json FILE] [--calls 3] [--timeout 120] [--targets bandwidth|compute|all]
    python bench/gpu/ncu.py --from-csv FILE [--json FILE]   # parse a saved `ncu --csv --page raw`

1. Runs ncu once over this script's own driver (`--drive`), which launches each target
   below --calls times on the cuda device after one warm-up round (skipped by ncu's
   --launch-skip): decode attention D=128, 32/8 heads, split-K at 4k and 32k context (the
   first pass and the reduce), gemv f16 4096x4096 and 14336x4096, gemv q4_0 and q8_0
   14336x4096 (the op's default width each), the gemm (the device's shape) f16 and q4_k
   14336x4096 with 512 tokens (--targets compute: COMPUTE_TARGETS below). Buffers are
   zero-filled (metalkv's buffers are); no bench rotation is needed, ncu flushes the caches
   before each replay pass (--cache-control all). metalkv-bench is not the program profiled:
   its chunk sweep launches the split-K kernel with the same grid at 4k and at 32k, so its
   launches cannot be told apart by ncu's filters.
2. Collects the sections SpeedOfLight, Occupancy, LaunchStats, WarpStateStats,
   SchedulerStats and MemoryWorkloadAnalysis plus a few explicit metrics (DRAM bytes, L2 hit
   rate, the warp stall ratios ncu lists for gh100), with --clock-control none (required on
   the Firecracker runtime), --csv --page raw --print-units base.
3. Median per (target, kernel) over the launches; prints one markdown table: duration,
   DRAM bytes and % of peak, achieved / theoretical occupancy and its limiter, registers,
   eligible / issued warps per scheduler, issue-slot use, L2 hit rate, the top 3 stall
   reasons (share of the cycles between two issued instructions). --json FILE holds all
   medians; the raw CSV is kept next to it (FILE with .csv).

If ncu is missing or fails (gVisor: "Failed to initialize the profiler: LibraryNotLoaded"),
the reason is printed and written as {"error": ...}; the exit status is 0 either way.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "SchedulerStats",
            "MemoryWorkloadAnalysis")
METRICS = (  # long-standing names; the sections above carry most of them too
    "gpu__time_duration.sum",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "lts__t_sector_hit_rate.pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm__maximum_warps_per_active_cycle_pct",
    "launch__registers_per_thread",
    "launch__occupancy_limit_registers",
    "launch__occupancy_limit_shared_mem",
    "launch__occupancy_limit_warps",
    "launch__occupancy_limit_blocks",
    "smsp__warps_active.avg.per_cycle_active",
    "smsp__warps_eligible.avg.per_cycle_active",
    "smsp__issue_active.avg.per_cycle_active",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
)
STALLS = ("barrier", "branch_resolving", "dispatch_stall", "drain", "imc_miss", "lg_throttle",
          "long_scoreboard", "math_pipe_throttle", "membar", "mio_throttle", "misc", "no_instruction",
          "not_selected", "selected", "short_scoreboard", "sleeping", "tex_throttle", "wait")
# Stall metrics in the order tried: the WarpStateStats family, then the newer latency family.
STALL_PATTERNS = (re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$"),
                  re.compile(r"^smsp__average_warp_latency_issue_stalled_(\w+?)\.ratio$"))

# (label, op, arguments); attention runs split-K always (two kernels a call).
TARGETS = (
    ("attn_decode d128 32/8 ctx4096 split", "attn", {"n_tokens": 4096}),
    ("attn_decode d128 32/8 ctx32768 split", "attn", {"n_tokens": 32768}),
    ("gemv f16 4096x4096", "matmul", {"wtype": "f16", "n_out": 4096, "n_in": 4096, "n_tokens": 1}),
    ("gemv f16 14336x4096", "matmul", {"wtype": "f16", "n_out": 14336, "n_in": 4096, "n_tokens": 1}),
    ("gemv q4_0 14336x4096", "matmul", {"wtype": "q4_0", "n_out": 14336, "n_in": 4096, "n_tokens": 1}),
    ("gemv q8_0 14336x4096", "matmul", {"wtype": "q8_0", "n_out": 14336, "n_in": 4096, "n_tokens": 1}),
    ("gemm f16 14336x4096 t512", "matmul", {"wtype": "f16", "n_out": 14336, "n_in": 4096, "n_tokens": 512}),
    ("gemm q4_k 14336x4096 t512", "matmul", {"wtype": "q4_k", "n_out": 14336, "n_in": 4096, "n_tokens": 512}),
)
# --targets compute: the matrix-unit paths at the shapes that bound prefill and the vision
# towers: prefill attention at SigLIP-so400m's shape (4,096 patches, 16 heads, d 80, one
# bidirectional block) and at Llama-3-8B's (d 128, 32/8 heads, 512 queries after 3,584 cached
# positions), the gemm at SigLIP's MLP shape (4304 x 1152, 4,096 tokens).
COMPUTE_TARGETS = (
    ("attn_prefill d80 16/16 n4096 bidirectional", "prefill",
     {"n_q_heads": 16, "n_kv_heads": 16, "head_dim": 80, "n_tokens": 4096, "n_queries": 4096, "bidirectional": True}),
    ("attn_prefill d128 32/8 ctx4096 q512", "prefill",
     {"n_q_heads": 32, "n_kv_heads": 8, "head_dim": 128, "n_tokens": 4096, "n_queries": 512}),
    ("gemm f16 4304x1152 t4096", "matmul", {"wtype": "f16", "n_out": 4304, "n_in": 1152, "n_tokens": 4096}),
    # The towers' 16-bit operands (SiglipSpec::operands_16bit) at the same shapes.
    ("attn_prefill d80 16/16 n4096 bidirectional half", "prefill",
     {"n_q_heads": 16, "n_kv_heads": 16, "head_dim": 80, "n_tokens": 4096, "n_queries": 4096, "bidirectional": True,
      "half_operands": True}),
    ("gemm f16 4304x1152 t4096 x16", "matmul",
     {"wtype": "f16", "n_out": 4304, "n_in": 1152, "n_tokens": 4096, "activations_16bit": True}),
)
TARGET_SETS = {"bandwidth": TARGETS, "compute": COMPUTE_TARGETS, "all": TARGETS + COMPUTE_TARGETS}
KERNEL_REGEX = (r"regex:^(attn_decode_split_f16_d128|attn_decode_reduce_d128|gemv_(f16|q4_0|q8_0)_r[124]"
                r"|gemm(_mma)?_(f16|q4_k)(_x16)?(_e[0-9]+)?|attn_prefill(_mma)?_f16_d(80|128)(_half)?(_e[0-9]+)?)$")
BLOCK_BYTES = {"f16": (1, 2), "q4_0": (32, 18), "q8_0": (32, 34), "q4_k": (256, 144)}  # (weights, bytes) per block


def log(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


def kernels_per_call(op: str) -> int:
    return 2 if op == "attn" else 1


# ---- the driver: runs under ncu ---------------------------------------------------------
def drive(calls: int, targets=TARGETS) -> None:
    """One warm-up call of every target, then `calls` calls of each, in the targets' order."""
    import numpy as np

    import metalkv
    from metalkv._core import ops

    dev = metalkv.device("cuda")
    runs = []
    for label, op, a in targets:
        if op == "prefill":
            n, nq, d = a["n_tokens"], a["n_queries"], a["head_dim"]
            shape = dict(n_q_heads=a["n_q_heads"], n_kv_heads=a["n_kv_heads"], head_dim=d, n_queries=nq,
                         q_pos0=n - nq, slots=n, scale=d ** -0.5)
            if a.get("bidirectional"):
                shape["blocks"] = [(0, n)]
            if a.get("half_operands"):
                shape["half_operands"] = True
            q, out = dev.buffer(nq * a["n_q_heads"] * d * 4), dev.buffer(nq * a["n_q_heads"] * d * 4)
            kv = dev.buffer(2 * n * a["n_kv_heads"] * d * 2)
            table = dev.buffer_from(np.arange(n // 32, dtype=np.uint32))
            runs.append(lambda q=q, kv=kv, t=table, out=out, shape=shape: ops.attention_prefill(
                dev, q, kv, t, out, **shape))
        elif op == "attn":
            n = a["n_tokens"]
            shape = dict(n_q_heads=32, n_kv_heads=8, head_dim=128, n_tokens=n, slots=n)
            plan = ops.attention_decode_plan(**shape, split="always", device=dev)
            q, out, kv = dev.buffer(32 * 128 * 4), dev.buffer(32 * 128 * 4), dev.buffer(2 * n * 8 * 128 * 2)
            scratch = dev.buffer(max(plan["scratch_bytes"], 16))
            table = dev.buffer_from(np.arange(n // 32, dtype=np.uint32))  # a contiguous cache
            log(f"[drive] {label}: {plan['kernel']}, {plan['n_chunks']} chunks")
            runs.append(lambda q=q, kv=kv, t=table, out=out, s=scratch, shape=shape: ops.attention_decode(
                dev, q, kv, t, out, **shape, split="always", scratch=s))
        else:
            per, nbytes = BLOCK_BYTES[a["wtype"]]
            w = dev.buffer(a["n_out"] * a["n_in"] // per * nbytes)
            x, y = dev.buffer(a["n_tokens"] * a["n_in"] * 4), dev.buffer(a["n_tokens"] * a["n_out"] * 4)
            runs.append(lambda w=w, x=x, y=y, a=a: ops.matmul(dev, x, w, y, **a))
    for r in runs:
        r()
    for (label, _, _), r in zip(targets, runs):
        for _ in range(calls):
            r()
        log(f"[drive] {label}: {calls} calls")


# ---- running ncu ------------------------------------------------------------------------
def stall_metrics_listed(ncu: str) -> list[str]:
    """The stall ratio metrics whose base names `ncu --query-metrics --chip gh100` lists
    (none if the query fails: then only the sections' own stall metrics are read)."""
    try:
        r = subprocess.run([ncu, "--query-metrics", "--chip", "gh100"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    bases = {line.split()[0] for line in r.stdout.splitlines() if re.match(r"^[a-z0-9]+__\w", line)}
    names = []
    for reason in STALLS:
        for fmt in ("smsp__average_warps_issue_stalled_{}_per_issue_active", "smsp__average_warp_latency_issue_stalled_{}"):
            if fmt.format(reason) in bases:
                names.append(fmt.format(reason) + ".ratio")
    return names


def ncu_command(ncu: str, out_csv: str, calls: int, metrics: list[str], target_set: str = "bandwidth") -> list[str]:
    targets = TARGET_SETS[target_set]
    cmd = [ncu, "--clock-control", "none", "--cache-control", "all", "--replay-mode", "kernel",
           "--kernel-name", KERNEL_REGEX, "--launch-skip", str(sum(kernels_per_call(op) for _, op, _ in targets)),
           "--launch-count", str(expected_launches(calls, targets)), "--csv", "--page", "raw", "--print-units", "base",
           "--log-file", out_csv]
    for s in SECTIONS:
        cmd += ["--section", s]
    if metrics:
        cmd += ["--metrics", ",".join(metrics)]
    return cmd + [sys.executable, str(Path(__file__).resolve()), "--drive", "--calls", str(calls),
                  "--targets", target_set]


def expected_launches(calls: int, targets=TARGETS) -> int:
    return calls * sum(kernels_per_call(op) for _, op, _ in targets)


def run_group(cmd: list[str], timeout: float) -> tuple[int | str, str]:
    """Run cmd in its own process group; on timeout end that group (ncu and the driver)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
        return p.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        out, _ = p.communicate()
        return f"timeout after {timeout:.0f} s", out or ""


def run_ncu(calls: int, timeout: float, keep_csv: str | None, target_set: str = "bandwidth") -> dict:
    """Profile the driver; {'csv': text, 'commands': [...]} or {'error': ..., 'commands': [...]}."""
    ncu = shutil.which("ncu")
    if not ncu:
        return {"error": "ncu is not on PATH", "commands": []}
    deadline = time.monotonic() + timeout
    version = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    stalls = stall_metrics_listed(ncu)
    log(f"ncu: {version.splitlines()[-1] if version else '?'}; {len(stalls)} stall metrics listed for gh100")
    attempts = [list(METRICS) + stalls, []]  # the second: sections only, should a metric name be refused
    commands, errors = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for metrics in attempts:
            out_csv = os.path.join(tmp, "ncu.csv")
            cmd = ncu_command(ncu, out_csv, calls, metrics, target_set)
            commands.append(cmd)
            log("$ " + " ".join(cmd))
            left = deadline - time.monotonic()
            if left < 10:
                errors.append("no time left for a retry")
                break
            rc, output = run_group(cmd, left)
            text = Path(out_csv).read_text(errors="replace") if os.path.exists(out_csv) else ""
            if keep_csv and text:
                Path(keep_csv).write_text(text)
            prof_errors = [l for l in (text + "\n" + output).splitlines() if "==ERROR==" in l]
            if parse_csv(text):  # counters, even if the driver failed later (said in the warnings)
                warnings = [l for l in text.splitlines() if "==WARNING==" in l][:20]
                if rc != 0:
                    warnings.append(f"ncu rc={rc}: " + " | ".join(prof_errors or output.strip().splitlines()[-4:]))
                return {"csv": text, "commands": commands, "ncu_version": version, "warnings": warnings}
            tail = prof_errors or output.strip().splitlines()[-8:]
            errors.append(f"rc={rc}: " + " | ".join(tail)[-1500:])
            if not any("metric" in l.lower() for l in tail):
                break  # not a refused metric name: a retry without them would fail the same way
    return {"error": "; ".join(errors), "commands": commands, "ncu_version": version}


# ---- parsing ------------------------------------------------------------------------------
UNIT_SCALE = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12,
              "nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9}


def number(text: str, unit: str = "") -> float | None:
    """A CSV value as a float in base units (bytes, ns); None for n/a or text."""
    t = text.strip().replace(",", "") if re.fullmatch(r"-?[\d,]*\.?\d+(e[-+]?\d+)?", text.strip(), re.I) else text.strip()
    try:
        v = float(t)
    except ValueError:
        return None
    return v * UNIT_SCALE.get(unit.strip().lower(), 1)


def parse_csv(text: str) -> list[dict]:
    """Rows of `ncu --csv --page raw` (header, units row, one row per launch) as dicts:
    'id', 'kernel', 'grid', 'block' and 'metrics' {name: float}. Lines before the header
    (the program's and ncu's own messages) and after the rows are skipped."""
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID",')), None)
    if start is None:
        return []
    body = [l for l in lines[start:] if l.startswith('"')]
    table = list(csv.reader(io.StringIO("\n".join(body))))
    header = table[0]
    has_units = len(table) > 1 and not (table[1] and table[1][0].strip().isdigit())
    units = table[1] if has_units else [""] * len(header)
    rows = []
    for values in table[2 if has_units else 1:]:
        if len(values) != len(header):
            continue
        cell = dict(zip(header, values))
        metrics = {}
        for name, unit, value in zip(header, units, values):
            if "__" in name:
                v = number(value, unit)
                if v is not None:
                    metrics[name] = v
        rows.append({"id": cell.get("ID", ""), "kernel": cell.get("Kernel Name", "?"),
                     "grid": cell.get("Grid Size", ""), "block": cell.get("Block Size", ""), "metrics": metrics})
    return rows


def label_rows(rows: list[dict], calls: int, targets=TARGETS) -> list[str]:
    """Each launch's target, by launch order (the driver runs `calls` calls of each target
    in turn); plain kernel names when the count does not match."""
    labels = [label for label, op, _ in targets for _ in range(calls * kernels_per_call(op))]
    if len(labels) != len(rows):
        return [r["kernel"] for r in rows]
    return labels


def stalls(m: dict) -> dict[str, float]:
    """Warp cycles per issued instruction in each stall state (one metric family)."""
    for pattern in STALL_PATTERNS:
        found = {mt.group(1): v for k, v in m.items() if (mt := pattern.match(k))}
        if found:
            return found
    return {}


def first(m: dict, *names: str) -> float | None:
    return next((m[n] for n in names if n in m), None)


def summarize(label: str, kernel: str, launches: list[dict]) -> dict:
    """Medians over the launches of one (target, kernel) and what the table shows."""
    names = sorted({k for r in launches for k in r["metrics"]})
    m = {k: statistics.median([r["metrics"][k] for r in launches if k in r["metrics"]]) for k in names}
    s = stalls(m)
    total = sum(s.values())
    top = sorted(((v, k) for k, v in s.items() if k != "selected"), reverse=True)[:3]
    limits = {k: m[f"launch__occupancy_limit_{k}"] for k in ("registers", "shared_mem", "warps", "blocks")
              if f"launch__occupancy_limit_{k}" in m}
    limiter = min(limits, key=limits.get) if limits else None
    rd, wr, ns = m.get("dram__bytes_read.sum"), m.get("dram__bytes_write.sum"), m.get("gpu__time_duration.sum")
    dram = rd + wr if rd is not None and wr is not None else None
    return {
        "target": label, "kernel": kernel, "launches": len(launches),
        "grid": launches[0]["grid"], "block": launches[0]["block"],
        "us": ns / 1e3 if ns is not None else None,
        "dram_MB": dram / 1e6 if dram is not None else None,
        "dram_GB_per_s": dram / ns if dram is not None and ns else None,
        "dram_pct_peak": first(m, "dram__throughput.avg.pct_of_peak_sustained_elapsed",
                               "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"),
        "occupancy_achieved_pct": m.get("sm__warps_active.avg.pct_of_peak_sustained_active"),
        "occupancy_theoretical_pct": m.get("sm__maximum_warps_per_active_cycle_pct"),
        "occupancy_limiter": limiter, "blocks_per_sm_limit": limits.get(limiter) if limiter else None,
        "registers": m.get("launch__registers_per_thread"),
        "warps_active_per_scheduler": m.get("smsp__warps_active.avg.per_cycle_active"),
        "warps_eligible_per_scheduler": m.get("smsp__warps_eligible.avg.per_cycle_active"),
        "warps_issued_per_scheduler": m.get("smsp__issue_active.avg.per_cycle_active"),
        "issue_slot_pct": m.get("smsp__issue_active.avg.pct_of_peak_sustained_active"),
        "l2_hit_pct": m.get("lts__t_sector_hit_rate.pct"),
        "stall_cycles_per_issue": total or None,
        "top_stalls": [[k, 100 * v / total] for v, k in top] if total else [],
        "metrics": m,
    }


def aggregate(rows: list[dict], calls: int, targets=TARGETS) -> list[dict]:
    groups: dict[tuple[str, str], list[dict]] = {}
    for label, r in zip(label_rows(rows, calls, targets), rows):
        groups.setdefault((label, r["kernel"]), []).append(r)
    return [summarize(label, kernel, launches) for (label, kernel), launches in groups.items()]


def fmt(v, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def table(kernels: list[dict]) -> str:
    head = ("target", "kernel", "us", "DRAM MB", "DRAM GB/s", "DRAM % peak", "occupancy % (theor., limiter)",
            "regs", "warps elig./issued per sched.", "issue %", "L2 hit %", "top stalls (% of cycles per issue)")
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for k in kernels:
        occ = f"{fmt(k['occupancy_achieved_pct'])} ({fmt(k['occupancy_theoretical_pct'])}"
        occ += f", {k['occupancy_limiter']} {fmt(k['blocks_per_sm_limit'], '.0f')} blocks)" if k["occupancy_limiter"] else ")"
        st = ", ".join(f"{name} {pct:.0f} %" for name, pct in k["top_stalls"]) or "-"
        cells = (k["target"], k["kernel"], fmt(k["us"], ".2f"), fmt(k["dram_MB"]), fmt(k["dram_GB_per_s"], ".0f"),
                 fmt(k["dram_pct_peak"]), occ, fmt(k["registers"], ".0f"),
                 f"{fmt(k['warps_eligible_per_scheduler'], '.2f')} / {fmt(k['warps_issued_per_scheduler'], '.2f')}",
                 fmt(k["issue_slot_pct"]), fmt(k["l2_hit_pct"]), st)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write everything here (the raw CSV next to it, .csv)")
    ap.add_argument("--calls", type=int, default=3, help="profiled calls per target (default 3)")
    ap.add_argument("--timeout", type=float, default=120, help="seconds for ncu in all (default 120)")
    ap.add_argument("--from-csv", help="parse this saved `ncu --csv --page raw` output instead of running ncu")
    ap.add_argument("--targets", choices=sorted(TARGET_SETS), default="bandwidth",
                    help="bandwidth (default: decode attention, gemv, the 512-token gemm), compute (prefill "
                         "attention and the gemm at the vision tower's shapes) or all")
    ap.add_argument("--drive", action="store_true", help=argparse.SUPPRESS)  # the program ncu profiles
    args = ap.parse_args()
    targets = TARGET_SETS[args.targets]
    if args.drive:
        drive(args.calls, targets)
        return 0

    keep_csv = str(Path(args.json).with_suffix(".csv")) if args.json and not args.from_csv else None
    if args.from_csv:
        run = {"csv": Path(args.from_csv).read_text(errors="replace"), "commands": [], "source": args.from_csv}
    else:
        try:
            run = run_ncu(args.calls, args.timeout, keep_csv, args.targets)
        except Exception as e:  # never fail the stage: say why
            run = {"error": f"{type(e).__name__}: {e}", "commands": []}
    result = {k: v for k, v in run.items() if k != "csv"}
    result["commands"] = [" ".join(c) for c in run.get("commands", [])]
    if "csv" in run:
        rows = parse_csv(run["csv"])
        result["kernels"] = aggregate(rows, args.calls, targets)
        if not rows:
            result["error"] = "no profiled launches in the CSV"
    for c in result["commands"]:
        print(f"command: {c}")
    if result.get("error"):
        print(f"ncu: no counters: {result['error']}")
    if result.get("kernels"):
        print(f"ncu: {len(result['kernels'])} (target, kernel) rows")
        print(table(result["kernels"]))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
