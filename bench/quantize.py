#!/usr/bin/env python3
"""Throughput of the load-time quantizer (metalkv._core.ops.quantize), in MB/s of input.

    python bench/quantize.py [--rows 4096] [--cols 4096] [--repeat 5]

Prints one row per (source type, target type): the best of --repeat runs over a random
(rows, cols) matrix. The quantizer uses every core (std::thread::hardware_concurrency);
an 8B model is ~16 GB of f16 weights, so at X MB/s it quantizes in 16e3 / X seconds.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from metalkv._core import ops


def sources(x: np.ndarray) -> dict[str, np.ndarray]:
    return {"f32": x, "f16": x.astype(np.float16), "bf16": (x.view(np.uint32) >> 16).astype(np.uint16)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    x = np.random.default_rng(0).standard_normal((a.rows, a.cols)).astype(np.float32)
    print(f"({a.rows}, {a.cols}) on {os.cpu_count()} CPUs")
    print("| source | target | MB/s of input | ms | s for 16 GB (8B in f16) |")
    print("|---|---|---|---|---|")
    for src, data in sources(x).items():
        for dst in ("q8_0", "q4_0"):
            best = float("inf")
            for _ in range(a.repeat):
                t0 = time.perf_counter()
                ops.quantize(data, dst)
                best = min(best, time.perf_counter() - t0)
            mbs = data.nbytes / best / 1e6
            print(f"| {src} | {dst} | {mbs:.0f} | {best * 1e3:.1f} | {16e3 / mbs:.0f} |")


if __name__ == "__main__":
    main()
