#!/usr/bin/env python3
"""Many clients without max_tokens on the default KV pool (issue 36): optimistic
admission with preemption beside every call reserving its whole max_tokens, same engine
shape, same calls, in one run.

    python bench/preemption.py --context 1024                # default model, host, 64 chat clients
    python bench/preemption.py --random-llama 8b --device cuda --context 4096
    python bench/preemption.py --clients 16 --json out.json

Each client is one call with no max_tokens, so it may run to the end of the context (as a
server request without max_tokens does), submitted all at once. On the default model they
are chat questions, whose replies end where the model ends its turn; a random-weight
model never does, so there each call samples (temperature 1, its own seed) and stops at
any of --stop-ids random ids, which gives replies of geometric lengths (about
vocab / stop_ids tokens on average). For each mode (preempt=True, the default; False,
before issue 36): the wall time until every call has ended, the generated tokens per
second over it, time to first token (queue + prompt) median, p95 and max, the most calls
that ran at once, preemptions and tokens fed again. Every reply must be the same in both
modes, and the same as the call alone for --alone of them (batch invariance makes each
call's reply its own, whatever else runs): checked and printed.
"""
from __future__ import annotations

import argparse
import datetime
import gc
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
from metalkv import _core  # noqa: E402

# questions the default model answers and ends (a story or a description may run to the context's end)
QUESTIONS = ["What is the capital of {}?", "Name three foods people eat in {}.", "What language is spoken in {}?",
             "Write a haiku about {}."]
PLACES = ["France", "Japan", "Peru", "Kenya", "Norway", "Canada", "India", "Italy", "Chile", "Egypt", "Spain",
          "Vietnam", "Brazil", "Ghana", "Poland", "Nepal"]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    model_arguments(ap)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--context", type=int, default=None, help="tokens a cache holds (default: the engine's)")
    ap.add_argument("--kv-memory", default="auto", help="the shared pool (default: the engine's default)")
    ap.add_argument("--prompt", type=int, default=128, help="random model: prompt ids per call")
    ap.add_argument("--stop-ids", type=int, default=640, help="random model: ids that end a reply")
    ap.add_argument("--alone", type=int, default=4, help="replies also checked against the call alone")
    ap.add_argument("--json", help="write the results here")
    return ap.parse_args(argv)


def calls_of(eng, a, random_model: bool) -> list[dict]:
    """Engine.start's arguments for each client."""
    if not random_model:  # 64 different questions, then the same again, numbered
        asks = [q.format(p) for p in PLACES for q in QUESTIONS]
        asks = [asks[i % len(asks)] + (f" ({i})" if i >= len(asks) else "") for i in range(a.clients)]
        return [dict(prompt=eng.chat_ids([{"role": "user", "content": q}]), temperature=0.0) for q in asks]
    rng = np.random.default_rng(0)
    vocab = eng.config.vocab
    stops = rng.choice(vocab, a.stop_ids, replace=False).tolist()
    return [dict(prompt=rng.integers(3, vocab - 1, a.prompt).tolist(), temperature=1.0, seed=i, stop_ids=stops)
            for i in range(a.clients)]


def run(eng, specs: list[dict]) -> dict:
    channel = _core.Channel()
    t0 = time.perf_counter()
    calls = []
    for s in specs:
        kw = dict(s)
        prompt = kw.pop("prompt")
        kw["max_tokens"] = eng.context - len(prompt)
        stop_ids = kw.pop("stop_ids", None)
        calls.append(eng._core.submit(eng.new_cache(), np.asarray(prompt, np.int64), channel=channel, ephemeral=True,
                                      stop_ids=list(eng.config.eos_ids) if stop_ids is None else stop_ids,
                                      **{k: v for k, v in kw.items()}))
    ids = [list(c.result()) for c in calls]
    wall = time.perf_counter() - t0
    st = [dict(c.stats) for c in calls]
    ttft = sorted(s["queue_seconds"] + s["prefill_seconds"] for s in st)
    generated = sum(len(i) for i in ids)
    return {"ids": ids, "wall_s": wall, "generated": generated, "tok_s": generated / wall,
            "ttft_median_s": statistics.median(ttft), "ttft_p95_s": ttft[int(0.95 * (len(ttft) - 1))],
            "ttft_max_s": ttft[-1], "max_batch": max(int(s["max_batch"]) for s in st),
            "preemptions": int(sum(s["preemptions"] for s in st)),
            "recomputed_tokens": int(sum(s["recomputed_tokens"] for s in st)),
            "finish": sorted({c.finish_reason for c in calls}), "reply_tokens_max": max(len(i) for i in ids)}


def main(argv=None) -> int:
    a = parse_args(argv)
    model = model_path(a)
    res = {"date": datetime.date.today().isoformat(), "machine": platform.node(), "args": vars(a), "modes": {}}
    replies = {}
    for preempt in (True, False):
        eng = metalkv.Engine.load(model, device=a.device, context=a.context, kv_memory=a.kv_memory, preempt=preempt,
                                  progress=False)
        specs = calls_of(eng, a, a.random_llama is not None)
        run(eng, specs[:2])  # warm-up
        r = run(eng, specs)
        replies[preempt] = r.pop("ids")
        res["modes"]["preempt" if preempt else "reserve"] = r
        pool = eng.kv_pool
        res["device"], res["model"] = eng.device.name, str(eng.model_path)
        res["pool"] = {"nbytes": pool["nbytes"], "blocks": [g["blocks"] for g in pool["groups"]],
                       "context": eng.context, "full_context_calls": min(g["blocks"] * 32 // eng.context
                                                                         for g in pool["groups"] if g["window"] == 0)}
        if preempt:  # a few replies against the call alone
            alone = []
            for s in specs[:a.alone]:
                kw = dict(s)
                prompt = kw.pop("prompt")
                alone.append(list(eng.generate_ids(prompt, max_tokens=eng.context - len(prompt),
                                                   **{k: v for k, v in kw.items()})))
            res["alone_checked"] = a.alone
            res["alone_equal"] = alone == replies[True][:a.alone]
        del eng
        gc.collect()
    res["modes_equal"] = replies[True] == replies[False]
    print(f"{res['device']}; {res['model']}; {a.clients} clients without max_tokens; pool {res['pool']['blocks']} "
          f"blocks of 32 tokens ({res['pool']['full_context_calls']} calls of the whole context {res['pool']['context']})")
    print(f"{'mode':<10}{'wall s':>9}{'tok/s':>9}{'TTFT med':>10}{'p95':>8}{'max':>8}{'at once':>9}{'preempt':>9}"
          f"{'refed':>8}")
    for m, r in res["modes"].items():
        print(f"{m:<10}{r['wall_s']:>9.1f}{r['tok_s']:>9.1f}{r['ttft_median_s']:>10.2f}{r['ttft_p95_s']:>8.2f}"
              f"{r['ttft_max_s']:>8.2f}{r['max_batch']:>9}{r['preemptions']:>9}{r['recomputed_tokens']:>8}")
    print(f"replies the same in both modes: {res['modes_equal']}; the first {a.alone} the same as alone: "
          f"{res['alone_equal']}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0 if res["modes_equal"] and res["alone_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
