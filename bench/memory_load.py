#!/usr/bin/env python3
"""Memory under load (issue 36: "device memory and process RSS never exceed kv_memory plus
the fixed overhead stated in docs"): many clients at once on an engine with a kv_memory,
the device's live buffer bytes (Device.memory_use), kv_memory's own count
(Engine.memory()["kv"]) and the process's RSS sampled throughout.

    python bench/memory_load.py                                            # default model, host
    python bench/memory_load.py --random-llama 8b --device cuda --kv-memory 4GB --clients 64

The engine's bytes on the device are its weights, kv_memory (the pool and every running
sequence's own buffers: rings, table mirrors), and a fixed workspace: the activations of
one step (step_tokens rows), its logits (step_tokens x vocab floats), the attention's
split-K scratch, RoPE tables, and each running call's sampling buffers. The workspace is
read after one warm-up call (live bytes less the weights and the pool); under load the
peak must stay within weights + kv_memory + that workspace (and sampling buffers: the
ids of each running call's prompt and reply when penalties are on, none here).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import threading
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
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--kv-memory", default="64MB")
    ap.add_argument("--kv-k", default="q4")
    ap.add_argument("--kv-v", default="q4")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--calls", type=int, default=3, help="calls per client")
    ap.add_argument("--prompt", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json")
    return ap.parse_args(argv)


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def main(argv=None) -> int:
    a = parse_args(argv)
    eng = metalkv.Engine.load(model_path(a), device=a.device, context=a.context, kv_memory=a.kv_memory,
                              kv_k=a.kv_k, kv_v=a.kv_v, progress=False)
    vocab, dev = eng.config.vocab, eng.device
    rng = np.random.default_rng(0)
    eng.generate_ids([rng.integers(3, vocab - 1, a.prompt).tolist()] * min(a.clients, 8), max_tokens=4, stop_ids=())
    m = eng.memory()
    workspace = m["device"]["live"] - m["weights"] - m["kv"]["pool"]["bytes"]
    dev.reset_memory_peak()
    samples = {"rss": [], "kv_used": [], "device_live": []}
    done = threading.Event()

    def sample():
        while not done.is_set():
            mm = eng.memory()
            samples["rss"].append(rss_bytes())
            samples["kv_used"].append(mm["kv"]["used"])
            samples["device_live"].append(mm["device"]["live"])
            time.sleep(0.02)

    def client(seed: int):
        r = np.random.default_rng(seed)
        for _ in range(a.calls):
            eng.generate_ids(r.integers(3, vocab - 1, a.prompt).tolist(), max_tokens=a.max_tokens, stop_ids=())

    t0 = time.perf_counter()
    sampler = threading.Thread(target=sample)
    sampler.start()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    sampler.join()
    wall = time.perf_counter() - t0
    m = eng.memory()
    kv = m["kv"]
    bound = m["weights"] + kv["kv_memory"] + workspace
    res = {"date": datetime.date.today().isoformat(), "machine": platform.node(), "device": dev.name,
           "args": vars(a), "wall_s": wall, "weights": m["weights"], "kv_memory": kv["kv_memory"],
           "pool_bytes": kv["pool"]["bytes"], "workspace": workspace, "kv_peak": kv["peak"],
           "device_peak": m["device"]["peak"], "bound": bound, "rss_peak": max(samples["rss"]),
           "rss_start": samples["rss"][0], "kv_used_max_sampled": max(samples["kv_used"]),
           "within": kv["peak"] <= kv["kv_memory"] and m["device"]["peak"] <= bound}
    mb = 1e6
    print(f"{dev.name}; {model_path(a) or 'default model'}; {a.clients} clients x {a.calls} calls "
          f"({a.prompt} + {a.max_tokens} tokens), {wall:.1f} s")
    print(f"weights {m['weights'] / mb:.1f} MB, kv_memory {kv['kv_memory'] / mb:.1f} MB (pool "
          f"{kv['pool']['bytes'] / mb:.1f} MB), workspace after warm-up {workspace / mb:.1f} MB")
    print(f"kv_memory's peak {kv['peak'] / mb:.1f} MB of {kv['kv_memory'] / mb:.1f} MB")
    print(f"device peak {m['device']['peak'] / mb:.1f} MB; weights + kv_memory + workspace {bound / mb:.1f} MB: "
          f"{'within' if res['within'] else 'OVER'}")
    print(f"process RSS {res['rss_start'] / mb:.0f} MB at the start, {res['rss_peak'] / mb:.0f} MB at most")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0 if res["within"] else 1


if __name__ == "__main__":
    sys.exit(main())
