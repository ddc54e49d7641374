#!/usr/bin/env python3
"""What a preempted sequence costs to bring back, two ways, in one run (issue 36:
"recompute later, or move its blocks to host memory: measure both").

    python bench/swap_recompute.py                                   # default model, host
    python bench/swap_recompute.py --random-llama 8b --device cuda --kv-memory 8GB

For each length N (random ids, so nothing is cached unless said):
- recompute, nothing cached: a call on the N tokens, one token out (its time to first
  token): what the engine pays for a preempted sequence whose blocks were evicted;
- recompute, prefix cached: the same call again, the prompt's whole blocks now in the
  prefix cache: what it pays when they were not (the common case: a preempted call's
  published blocks stay cached, evictable, until the pool needs them);
- swap out / swap in: the N tokens' blocks copied to host memory (the engine's
  export_prefix: every layer's K and V rows of each block, as the pool holds them) and
  back into fresh blocks of the pool (import_prefix, under other ids so that every block
  is written): the copies a swap to host memory makes, the same bytes each way.
Medians of --repeat.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("METALKV_NO_PROGRESS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import metalkv  # noqa: E402
from batching import model_arguments, model_path  # noqa: E402  (bench/batching.py)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    model_arguments(ap)
    ap.add_argument("--tokens", default="512,2048", help="prompt lengths, comma-separated")
    ap.add_argument("--kv-memory", default="auto")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json")
    return ap.parse_args(argv)


def seconds(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main(argv=None) -> int:
    a = parse_args(argv)
    lengths = [int(x) for x in a.tokens.split(",")]
    eng = metalkv.Engine.load(model_path(a), device=a.device, context=max(lengths) + 64, kv_memory=a.kv_memory,
                              progress=False)
    rng = np.random.default_rng(0)
    vocab = eng.config.vocab

    def ids(n):
        return rng.integers(3, vocab - 1, n).tolist()

    eng.generate_ids(ids(64), max_tokens=1, stop_ids=())  # warm-up
    rows = []
    for n in lengths:
        runs = []
        for _ in range(a.repeat):
            prompt = ids(n)
            fresh, _ = seconds(lambda: eng.generate_ids(prompt, max_tokens=1, stop_ids=()))
            cached, _ = seconds(lambda: eng.generate_ids(prompt, max_tokens=1, stop_ids=()))
            hit = int(eng.last_stats["prompt_tokens_cached"])
            out_s, records = seconds(lambda: eng._core.export_prefix(prompt))
            arrays = [np.frombuffer(r, np.uint8) for r in records]
            other = ids(len(records) * 32)
            in_s, got = seconds(lambda: eng._core.import_prefix(other, arrays))
            assert got == len(records) * 32, "the pool had no room for every block"
            runs.append({"recompute_s": fresh, "recompute_cached_s": cached, "cached_tokens": hit,
                         "swap_out_s": out_s, "swap_in_s": in_s, "blocks": len(records),
                         "bytes": sum(len(r) for r in records)})
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        rows.append({"tokens": n, "median": med, "runs": runs})
    dev = eng.device.name
    print(f"{dev}; {model_path(a) or 'default model'}; medians of {a.repeat}")
    print(f"{'tokens':>7} {'KV bytes':>10} {'recompute':>10} {'w/ prefix':>10} {'swap out':>9} {'swap in':>8} "
          f"{'swap/recompute':>15}")
    for r in rows:
        m = r["median"]
        swap = m["swap_out_s"] + m["swap_in_s"]
        print(f"{r['tokens']:>7} {m['bytes'] / 1e6:>8.1f}MB {m['recompute_s']:>9.3f}s {m['recompute_cached_s']:>9.3f}s "
              f"{m['swap_out_s']:>8.3f}s {m['swap_in_s']:>7.3f}s {swap / m['recompute_s']:>14.2f}x")
    if a.json:
        Path(a.json).write_text(json.dumps({"date": datetime.date.today().isoformat(), "machine": platform.node(),
                                            "device": dev, "args": vars(a), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
