#!/usr/bin/env python3
"""Time to first token of a long system prompt found in the prefix store's disk tier
after a restart, beside computing it (issue 36's target: at least 5x faster), in one run.

    python bench/prefix_store.py                                        # default model, host
    python bench/prefix_store.py --random-llama 8b --device cuda --kv-memory 4GB

1. compute: a fresh engine (nothing cached) answers the system prompt (--system-tokens
   of text, or random ids for a random model) plus a question: the wall time of a call of
   one token (queue, prefill, the first token);
2. save: that engine's store writes the prompt's blocks (PrefixStore.save, timed);
3. restart: the engine is dropped, a new one loads the same model, its store opens the
   same directory (its host tier empty), then the same call: the wall time of warm()
   (reading the files, writing their rows into the pool) plus the call.
Each --repeat times on fresh engines; medians. The files are read through the OS page
cache, warm from step 2: on a machine whose disk must be read, add its read time of the
bytes reported. The two replies (--new-tokens greedy ids) must be equal.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("METALKV_NO_PROGRESS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import metalkv  # noqa: E402
from batching import model_arguments, model_path  # noqa: E402  (bench/batching.py)
from metalkv.prefix_store import PrefixStore  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    model_arguments(ap)
    ap.add_argument("--system-tokens", type=int, default=4096)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--kv-memory", default="auto")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--dir", default=None, help="the store's directory (default: a temporary one)")
    ap.add_argument("--redis", default=None, metavar="URL",
                    help="the Redis tier alone (no directory): a second server sharing the first one's Redis")
    ap.add_argument("--json")
    return ap.parse_args(argv)


def the_prompt(eng, a, random_model: bool) -> list[int]:
    if random_model:
        import numpy as np

        return np.random.default_rng(0).integers(3, eng.config.vocab - 1, a.system_tokens + 16).tolist()
    text = (ROOT.parent / "shared" / "data" / "pride_and_prejudice.txt")
    text = text.read_text() if text.exists() else (ROOT / "README.md").read_text() * 20
    ids = eng.tokenizer.encode(text, add_special=False)[:a.system_tokens]
    system = eng.tokenizer.decode(ids)
    return eng.chat_ids([{"role": "system", "content": system}, {"role": "user", "content": "Who is speaking?"}])


def load(model, a):
    context = a.system_tokens + 64 + a.new_tokens
    return metalkv.Engine.load(model, device=a.device, context=context, kv_memory=a.kv_memory, progress=False)


def timed(eng, prompt, n) -> tuple[float, list[int]]:
    t0 = time.perf_counter()
    out = eng.generate_ids(prompt, max_tokens=n, stop_ids=())
    return time.perf_counter() - t0, list(out)


def main(argv=None) -> int:
    a = parse_args(argv)
    model = model_path(a)
    runs = []
    for r in range(a.repeat):
        directory = Path(a.dir or tempfile.mkdtemp(prefix="metalkv-store-"))
        eng = load(model, a)
        prompt = the_prompt(eng, a, a.random_llama is not None)
        timed(eng, prompt[:64], 1)  # warm-up (kernels, graphs)
        compute_s, _ = timed(eng, prompt, 1)
        _, want = timed(eng, prompt, a.new_tokens)  # (the reply, from the device cache now)
        tier = (dict(redis=a.redis) if a.redis else dict(directory=directory))
        store = PrefixStore(eng, **tier)
        if a.redis:
            store.redis._client.flushdb()  # (nothing left from an earlier run)
        t0 = time.perf_counter()
        blocks = store.save(prompt)
        save_s = time.perf_counter() - t0
        if a.redis:
            disk = {"bytes": sum(len(store.redis.get(h) or b"") for h in
                                 metalkv._core.prefix_hashes(prompt[:blocks * 32]))}
        else:
            disk = store.tiers()["disk"]
        del store, eng
        gc.collect()
        eng = load(model, a)  # the restart
        timed(eng, prompt[-64:], 1)  # warm-up, with none of the prompt's blocks
        store = PrefixStore(eng, **tier)
        t0 = time.perf_counter()
        warmed = store.warm(prompt)
        warm_s = time.perf_counter() - t0
        first_s, _ = timed(eng, prompt, 1)
        first_stats = {k: v for k, v in eng.last_stats.items() if k.endswith("_seconds")}
        cached = int(eng.last_stats["prompt_tokens_cached"])
        _, got = timed(eng, prompt, a.new_tokens)
        runs.append({"compute_s": compute_s, "save_s": save_s, "warm_s": warm_s,
                     "warm_import_s": store.stats["import_seconds"], "call_after_warm_s": first_s,
                     "call_after_warm_stats": first_stats,
                     "disk_ttft_s": warm_s + first_s, "speedup": compute_s / (warm_s + first_s),
                     "prompt_tokens": len(prompt), "blocks": blocks, "disk_bytes": disk["bytes"], "warmed": warmed,
                     "cached": cached, "same_reply": got == want})
        del store, eng
        gc.collect()
        if a.dir is None:
            shutil.rmtree(directory, ignore_errors=True)
        print(f"run {r}: compute {compute_s:.2f} s, {'Redis' if a.redis else 'disk'} tier {warm_s:.2f} (import "
              f"{runs[-1]['warm_import_s']:.2f}) + {first_s:.2f} s "
              f"({runs[-1]['speedup']:.1f}x), save {save_s:.2f} s", file=sys.stderr)
    med = {k: statistics.median(x[k] for x in runs) for k in ("compute_s", "save_s", "warm_s", "call_after_warm_s",
                                                             "disk_ttft_s", "speedup")}
    dev = metalkv.device(a.device if a.device != "auto" else "host").name
    where = "Redis" if a.redis else "disk"
    res = {"date": datetime.date.today().isoformat(), "machine": platform.node(), "device": dev, "tier": where,
           "model": str(model or "default"), "args": vars(a), "median": med, "runs": runs}
    r0 = runs[0]
    print(f"{dev}; {res['model']}; a prompt of {r0['prompt_tokens']} tokens, {r0['blocks']} blocks "
          f"({r0['disk_bytes'] / 1e6:.0f} MB in the {where} tier); median of {a.repeat}")
    print(f"time to first token, computing the prompt   {med['compute_s']:8.2f} s")
    print(f"after a restart, from the {where:<5} tier         {med['disk_ttft_s']:8.2f} s  (warm {med['warm_s']:.2f} + "
          f"call {med['call_after_warm_s']:.2f}; {med['speedup']:.1f}x faster)")
    print(f"saving the blocks (off the request path)     {med['save_s']:8.2f} s")
    print(f"prompt tokens from the cache after warm: {r0['cached']} of {r0['prompt_tokens']}; "
          f"replies the same: {all(x['same_reply'] for x in runs)}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0 if all(x["same_reply"] for x in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
