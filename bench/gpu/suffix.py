#!/usr/bin/env python3
"""A short prompt over a long cached prefix (a chat's next turn): the time to first token
of n new tokens after --cached tokens the prefix cache holds, beside transformers' forward
of the same n tokens over a DynamicCache of the same prefix (same weights, same card, same
run), and where the GPU time of one such call goes, kernel by kernel.

    python bench/gpu/suffix.py --random-llama 8b --device cuda [--cached 4096] [--suffixes 1,4,16,64,256]

- metalkv: Engine.generate_ids(prefix + suffix, max_tokens=1) once the prefix's blocks
  are in the prefix cache (a call of the prefix alone put them there). Each repeat takes
  new random suffix ids, so a suffix never finds its own blocks cached; the prefix hit is
  checked in last_stats["prompt_tokens_cached"]. Wall time of the call: queue, prefill,
  the first token. Median of --repeat.
- transformers (f16, SDPA): one forward of the prefix fills a DynamicCache; each timed
  forward takes the suffix over it (logits of the last position, argmax, synchronized),
  then crops the suffix off the cache again.
- kernels: torch.profiler (CUPTI, which sees every kernel of the process, metalkv's too)
  over one metalkv call of --profile-suffix new tokens, summed by kernel name.
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
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("METALKV_NO_PROGRESS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402

import metalkv  # noqa: E402
from batching import model_arguments, model_path  # noqa: E402  (bench/batching.py)
from common import table  # noqa: E402  (bench/gpu/common.py)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    model_arguments(ap)
    ap.add_argument("--cached", type=int, default=4096, help="prefix tokens in the prefix cache (a multiple of 32)")
    ap.add_argument("--suffixes", default="1,4,16,64,256", help="new tokens after the prefix, comma-separated")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--profile-suffix", type=int, default=16, help="the suffix whose kernels are listed (0: none)")
    ap.add_argument("--no-peer", action="store_true", help="metalkv alone")
    ap.add_argument("--json")
    return ap.parse_args(argv)


def kernel_table(fn) -> list[dict]:
    """fn's GPU kernels through torch.profiler, summed by name, largest first."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    total, calls = defaultdict(float), defaultdict(int)
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        total[e.name] += e.device_time_total  # (a kernel's event: its own duration, us)
        calls[e.name] += 1
    whole = sum(total.values()) or 1.0
    return [{"kernel": k, "calls": calls[k], "us": total[k], "share": total[k] / whole}
            for k in sorted(total, key=total.get, reverse=True)]


def bench_metalkv(path, a, suffixes: list[int], vocab_rng) -> tuple[list[dict], list[dict]]:
    top = max(suffixes)
    eng = metalkv.Engine.load(path, device=a.device, context=a.cached + top + 64, progress=False)
    vocab = eng.config.vocab
    prefix = vocab_rng.integers(3, vocab - 1, a.cached).tolist()

    def call(ids):
        t0 = time.perf_counter()
        eng.generate_ids(ids, max_tokens=1, stop_ids=())
        return time.perf_counter() - t0

    call(vocab_rng.integers(3, vocab - 1, 64).tolist())  # warm-up: kernels, graphs
    whole = [call(prefix + vocab_rng.integers(3, vocab - 1, 16).tolist())]  # also caches the prefix's blocks
    rows = []
    for n in suffixes:
        times, cached = [], []
        for _ in range(a.repeat + 1):  # the first of each length warms its shapes
            times.append(call(prefix + vocab_rng.integers(3, vocab - 1, n).tolist()))
            cached.append(int(eng.last_stats["prompt_tokens_cached"]))
        rows.append({"suffix": n, "metalkv_s": statistics.median(times[1:]), "cached": min(cached[1:])})
    whole.append(call(vocab_rng.integers(3, vocab - 1, a.cached + 16).tolist()))  # nothing cached
    rows.append({"suffix": "whole", "metalkv_s": whole[-1], "cached": int(eng.last_stats["prompt_tokens_cached"])})
    kernels = []
    if a.profile_suffix and a.device == "cuda":
        ids = prefix + vocab_rng.integers(3, vocab - 1, a.profile_suffix).tolist()
        kernels = kernel_table(lambda: eng.generate_ids(ids, max_tokens=1, stop_ids=()))
    return rows, kernels


def bench_transformers(path, a, suffixes: list[int], rows: list[dict], vocab_rng) -> None:
    import torch
    from transformers import DynamicCache, LlamaForCausalLM

    tdev = "cuda" if a.device == "cuda" else "cpu"
    model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float16, attn_implementation="sdpa").to(tdev).eval()
    vocab = model.config.vocab_size
    prefix = torch.tensor([vocab_rng.integers(3, vocab - 1, a.cached).tolist()], device=tdev)
    with torch.inference_mode():
        cache = DynamicCache()
        model(prefix, past_key_values=cache, use_cache=True, logits_to_keep=1)

        def call(n):
            ids = torch.tensor([vocab_rng.integers(3, vocab - 1, n).tolist()], device=tdev)
            if tdev == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
            out.logits[0, -1].argmax().item()
            dt = time.perf_counter() - t0
            cache.crop(-n)  # (transformers 5: a negative count removes that many positions)
            return dt

        for row in rows:
            if row["suffix"] == "whole":
                continue
            times = [call(row["suffix"]) for _ in range(a.repeat + 1)]
            row["transformers_s"] = statistics.median(times[1:])
            row["speed_vs_transformers"] = row["transformers_s"] / row["metalkv_s"]
    del model, cache
    if tdev == "cuda":
        torch.cuda.empty_cache()


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.cached % 32:
        raise SystemExit("--cached must be a multiple of 32 (whole blocks are what the prefix cache keeps)")
    suffixes = [int(s) for s in a.suffixes.split(",")]
    path = model_path(a)
    rows, kernels = bench_metalkv(path, a, suffixes, np.random.default_rng(0))
    if not a.no_peer:
        bench_transformers(path, a, suffixes, rows, np.random.default_rng(1))
    dev = metalkv.device(a.device).name
    print(f"{dev}; {path}; {a.cached} cached tokens; median of {a.repeat}; {datetime.date.today()}")
    print(table(["new tokens", "prefix cached", "metalkv s", "ms a new token", "transformers s", "speed"],
                [[r["suffix"], r["cached"], r["metalkv_s"],
                  r["metalkv_s"] * 1e3 / (r["suffix"] if r["suffix"] != "whole" else a.cached + 16),
                  r.get("transformers_s", ""), r.get("speed_vs_transformers", "")] for r in rows]))
    if kernels:
        whole = sum(k["us"] for k in kernels)
        print(f"\nkernels of one call of {a.profile_suffix} new tokens: {whole / 1e3:.2f} ms of GPU time")
        print(table(["kernel", "calls", "us", "share"], [[k["kernel"][:70], k["calls"], k["us"], k["share"]]
                                                         for k in kernels[:25]]))
    res = {"date": datetime.date.today().isoformat(), "machine": platform.node(), "device": dev,
           "model": str(path), "args": vars(a), "rows": rows, "kernels": kernels}
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
