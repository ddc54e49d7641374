#!/usr/bin/env python3
"""What constrained decoding costs (docs/CONSTRAINED.md): decode tokens/s with a JSON
schema against the same call without one, same engine, same prompt, same number of
tokens; and the host time of each mask (llguidance's compute, through the engine's
Constraint), which the scheduler computes while the step's forward pass runs.

    python bench/constrained.py                      # default model, host executor
    python bench/constrained.py --repeat 5 --json out.json

The constrained call's schema is a JSON array of at least 100,000 strings, so it runs to
--new-tokens as the plain call does (a JSON that completes would end the call
early); --schemas also decodes the 30 schemas of tests/engine/json_schemas.py once,
batched, and reports their mask times. Medians of --repeat, alternating.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("METALKV_NO_PROGRESS", "1")
import metalkv  # noqa: E402
from metalkv import constrain  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ARRAY = {"type": "array", "items": {"type": "string"}, "minItems": 100000}  # never complete: runs to --new-tokens


class Timed(constrain.Matcher):
    """The engine's matcher, with the seconds of each mask kept."""

    def __init__(self, matcher, times: list):
        super().__init__(matcher)
        self.times = times

    def fill_mask(self, address, n_words):
        t0 = time.perf_counter()
        super().fill_mask(address, n_words)
        self.times.append(time.perf_counter() - t0)


def timed_matcher(engine, grammar, times):
    import llguidance
    return Timed(llguidance.LLMatcher(engine._llg_tokenizer(), grammar.compiled, log_level=0), times)


def one(engine, ids, n, grammar=None, times=None):
    cache = engine.new_cache()
    kw = {}
    if grammar is not None:
        kw["constraint"] = timed_matcher(engine, grammar, times)
    r = engine._core.submit(cache, ids, max_tokens=n, stop_ids=[], **kw)
    out = r.result()
    st = dict(r.stats)
    decoded = len(out) - 1
    return {"tokens": len(out), "decode_tok_s": decoded / st["decode_seconds"] if st["decode_seconds"] else 0.0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--device", default="host")
    ap.add_argument("--context", type=int, default=None, help="tokens a cache holds (default: the engine's)")
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--schemas", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    import numpy as np

    engine = metalkv.Engine.load(a.model, device=a.device, context=a.context, progress=False)
    t0 = time.perf_counter()
    engine._llg_tokenizer()
    tok_s = time.perf_counter() - t0
    grammar = metalkv.Grammar.json_schema(ARRAY)
    ids = np.asarray(engine.chat_ids([{"role": "user", "content": "List as many English words as you can, "
                                                                  "as a JSON array of strings."}]), np.int64)
    one(engine, ids, 8)  # warm-up
    plain, constrained, times = [], [], []
    for _ in range(a.repeat):
        plain.append(one(engine, ids, a.new_tokens))
        constrained.append(one(engine, ids, a.new_tokens, grammar, times))
    p = statistics.median(r["decode_tok_s"] for r in plain)
    c = statistics.median(r["decode_tok_s"] for r in constrained)
    res = {"date": datetime.date.today().isoformat(), "machine": platform.node(), "device": engine.device.name,
           "model": a.model or "default", "vocab": engine.config.vocab, "new_tokens": a.new_tokens,
           "llg_tokenizer_s": tok_s, "plain_decode_tok_s": p, "constrained_decode_tok_s": c,
           "overhead": 1 - c / p, "mask_ms_median": 1e3 * statistics.median(times),
           "mask_ms_p99": 1e3 * float(np.percentile(times, 99)), "masks": len(times),
           "runs": {"plain": plain, "constrained": constrained}}
    print(f"{engine.device.name}; {a.model or 'default model'} (vocab {engine.config.vocab}); {a.new_tokens} ids, "
          f"greedy, median of {a.repeat}")
    print(f"llguidance tokenizer built in {tok_s:.2f} s")
    print(f"plain decode        {p:8.1f} tok/s")
    print(f"JSON schema decode  {c:8.1f} tok/s   ({100 * res['overhead']:+.1f} % slower)")
    print(f"mask                {res['mask_ms_median']:8.3f} ms median, {res['mask_ms_p99']:.3f} ms p99 "
          f"({len(times)} masks)")
    if a.schemas:
        spec = importlib.util.spec_from_file_location("json_schemas", ROOT / "tests" / "engine" / "json_schemas.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        from metalkv import _core
        from metalkv._calls import drive

        stimes: list = []
        channel = _core.Channel()
        calls = []
        for q, schema in mod.SCHEMAS:
            g = metalkv.Grammar.json_schema(schema)
            ids_q = np.asarray(engine.chat_ids([{"role": "user", "content": q + " Reply in JSON."}]), np.int64)
            calls.append(engine._core.submit(engine.new_cache(), ids_q, max_tokens=160, stop_ids=list(
                engine.config.eos_ids), channel=channel, constraint=timed_matcher(engine, g, stimes)))
        t0 = time.perf_counter()
        n = sum(len(r.result()) for r in calls)
        wall = time.perf_counter() - t0
        res["schemas"] = {"calls": len(calls), "tokens": n, "wall_s": wall,
                          "mask_ms_median": 1e3 * statistics.median(stimes),
                          "mask_ms_p99": 1e3 * float(np.percentile(stimes, 99)), "masks": len(stimes)}
        print(f"30 schemas batched: {n} tokens in {wall:.1f} s; mask {res['schemas']['mask_ms_median']:.3f} ms "
              f"median, {res['schemas']['mask_ms_p99']:.3f} ms p99")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
