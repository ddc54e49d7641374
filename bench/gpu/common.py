"""Shared by bench/gpu/kernels.py and engine.py: timing torch work on a GPU (or the
CPU, for local runs), the copy ceiling, rotation of input sets, and tables.

GPU times: a CUDA graph of n calls (rotating over the input sets) replayed a few
times, CUDA events around each replay, the median per call; if the work cannot be
captured, events around n back-to-back calls instead. CPU: wall time.
"""
from __future__ import annotations

import math
import statistics
import sys
import time
from pathlib import Path

ROTATE_BYTES = 256 << 20  # input sets span this: 4x a 60 MB L2 (H200), as metalkv-bench does
MAX_ROTATE_TOTAL = 8 << 30


def log(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


def rotation_sets(set_bytes: int, max_total: int = MAX_ROTATE_TOTAL) -> int:
    """Input sets to rotate over: enough to span ROTATE_BYTES, 2 to 16 (bench/device_timing.h)."""
    want = max(2, min(16, math.ceil(ROTATE_BYTES / max(set_bytes, 1))))
    return max(1, min(want, max_total // max(set_bytes, 1)))


def _median(xs):
    return statistics.median(xs) if xs else float("nan")


def time_calls(calls, device: str, *, target_s: float = 0.08, max_per_graph: int = 64) -> dict:
    """calls: zero-argument callables, one per input set, run in rotation on `device`
    ('cuda' or 'cpu'). Returns {'us': median per call, 'min_us', 'n' calls per replay,
    'reps', 'how'}."""
    import torch

    calls[0]()  # warm-up: kernel selection, cuDNN plans, workspace allocation
    if device != "cuda":
        return _time_cpu(calls, target_s)
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for c in calls:
        c()
    b.record()
    b.synchronize()
    est = max(a.elapsed_time(b) / 1e3 / len(calls), 2e-6)
    n = int(min(max_per_graph, max(len(calls), 0.01 / est)))
    n = max(len(calls), n // len(calls) * len(calls))
    reps = int(min(30, max(3, target_s / (est * n))))
    try:
        return _time_graph(calls, n, reps)
    except Exception as e:  # not capturable (a backend that syncs, or allocates outside the pool)
        torch.cuda.synchronize()
        r = _time_events(calls, n, reps)
        r["how"] = f"events ({type(e).__name__}: graph capture failed)"
        return r


def _time_graph(calls, n, reps) -> dict:
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up on a side stream, as torch's docs ask before capture
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(n):
            calls[i % len(calls)]()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) / 1e3 / n)
    del g
    return {"us": _median(ts) * 1e6, "min_us": min(ts) * 1e6, "n": n, "reps": reps, "how": "cuda graph"}


def _time_events(calls, n, reps) -> dict:
    import torch

    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for i in range(n):
            calls[i % len(calls)]()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) / 1e3 / n)
    return {"us": _median(ts) * 1e6, "min_us": min(ts) * 1e6, "n": n, "reps": reps, "how": "events"}


def _time_cpu(calls, target_s) -> dict:
    ts = []
    t_end = time.perf_counter() + target_s
    i = 0
    while len(ts) < 3 or (time.perf_counter() < t_end and len(ts) < 50):
        t0 = time.perf_counter()
        calls[i % len(calls)]()
        ts.append(time.perf_counter() - t0)
        i += 1
    return {"us": _median(ts) * 1e6, "min_us": min(ts) * 1e6, "n": 1, "reps": len(ts), "how": "cpu wall"}


def copy_ceiling(device: str) -> dict:
    """The bandwidth a device-to-device copy reaches, bytes read + written: the
    larger of a torch copy_ of ~2 GiB on the stream and in a CUDA graph (CPU: 256 MB).
    Also a read-only torch.sum over the same bytes, for reference."""
    import torch

    nbytes = (2 << 30) if device == "cuda" else (256 << 20)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    src.random_()
    dst = torch.empty_like(src)
    ways = {}
    r = time_calls([lambda: dst.copy_(src)], device, target_s=0.3, max_per_graph=4)
    ways["copy_" + r["how"].split(" (")[0].replace(" ", "_")] = 2 * nbytes / (r["us"] * 1e-6) / 1e9
    if device == "cuda":
        for _ in range(2):
            dst.copy_(src)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(8):
            dst.copy_(src)
        b.record()
        b.synchronize()
        ways["copy_stream"] = 2 * nbytes / (a.elapsed_time(b) / 1e3 / 8) / 1e9
    del dst
    half = src.view(torch.float16)
    half.normal_()
    r = time_calls([lambda: torch.sum(half, dtype=torch.float32)], device, target_s=0.3, max_per_graph=4)
    read_gbps = nbytes / (r["us"] * 1e-6) / 1e9
    del src, half
    if device == "cuda":
        torch.cuda.empty_cache()
    best = max(ways.values())
    log(f"copy ceiling: {best:.0f} GB/s (read + write; {', '.join(f'{k} {v:.0f}' for k, v in ways.items())}), "
        f"read-only sum {read_gbps:.0f} GB/s, {nbytes / 2**30:.2f} GiB")
    return {"GBps": best, "ways_GBps": ways, "read_sum_GBps": read_gbps, "bytes": nbytes}


def device_name(device: str) -> str:
    import platform

    import torch

    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        return f"{p.name}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.0f} GiB"
    return f"CPU ({platform.processor() or platform.machine()})"


def table(headers: list[str], rows: list[list]) -> str:
    """A Markdown table, columns padded."""
    cells = [[_cell(v) for v in r] for r in rows]
    w = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = lambda r: "| " + " | ".join(c.rjust(w[i]) if i else c.ljust(w[i]) for i, c in enumerate(r)) + " |"
    out = [line(headers), "|" + "|".join("-" * (x + 2) for x in w) + "|"]
    out += [line(r) for r in cells]
    return "\n".join(out)


def _cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


# Llama-3.1-8B's shape and Llama-3.2-1B's (their config.json), the benches' models.
LLAMA3_8B = dict(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336)
LLAMA3_1B = dict(layers=16, hidden=2048, heads=32, kv_heads=8, ffn=8192)


def add_shape_args(ap, shape: dict, prefix: str = "") -> None:
    """--{prefix}layers, --{prefix}hidden, --{prefix}heads, --{prefix}kv-heads and
    --{prefix}ffn, defaulting to `shape` (read back as args.{prefix_}layers ...)."""
    for name, default in shape.items():
        ap.add_argument(f"--{prefix}{name.replace('_', '-')}", type=int, default=default)


def median_seconds(fn, repeat: int, sync) -> float:
    """Median wall time of fn() over `repeat` calls after one warm-up, sync() (the device's
    synchronize) closing each: a whole-call time beside a peer's in the same run."""
    fn()
    sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def report(result: dict, path) -> None:
    """Prints a bench's result as JSON and writes it to `path` (its --json), if given."""
    import json
    text = json.dumps(result, indent=1)
    print(text)
    if path:
        path.write_text(text)


def tower_args(description: str, shapes, argv=None):
    """The tower benches' flags (audio.py, vision3n.py): --shape (one of `shapes`; the
    released size first), --device, --repeat, --no-check, --json."""
    import argparse
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--shape", choices=sorted(shapes), default=next(iter(shapes)))
    ap.add_argument("--device", default="cuda", help="metalkv device: cuda (default) or host")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-check", action="store_true", help="skip the float32 comparison")
    ap.add_argument("--json", type=Path)
    return ap.parse_args(argv)
