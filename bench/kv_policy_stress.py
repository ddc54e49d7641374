"""Flat memory under an eviction policy (issue 15; docs/KV_POLICIES.md): one
cache generates N tokens without stopping, and every `--every` tokens the run
samples the KV bytes its blocks hold, the engine's pool, the process's RSS,
the tokens/s of the last stretch and whether the logits are finite. Memory
should stay flat once the budget is reached; without a policy the same cache
would stop at its context (context_full).

    python bench/kv_policy_stress.py --tokens 20000 --policy streaming h2o snapkv keynorm pyramidkv
    python bench/kv_policy_stress.py --quick                  # CI: 600 tokens, default model
    python bench/kv_policy_stress.py --device cuda --random    # a random-weight Llama built with transformers

Prints one table per policy and a summary; --json writes every sample.
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np


def rss_bytes() -> int:
    """Resident set size now (Linux /proc; else the peak from getrusage)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def random_model(a) -> str:
    """A random-weight Llama saved as safetensors (bench/gpu/engine.py's builder)."""
    sys.path.insert(0, str(Path(__file__).parent / "gpu"))
    import engine as gpu_engine  # bench/gpu/engine.py

    shape = argparse.Namespace(layers=a.layers, hidden=a.hidden, heads=a.heads, kv_heads=a.kv_heads, ffn=a.ffn,
                               vocab=a.vocab, tied=False, init_std=0.02, seed=0)
    path = Path(f"/tmp/metalkv-stress-l{a.layers}_h{a.hidden}")
    path.mkdir(exist_ok=True)
    model = gpu_engine.build_model(shape, "cpu")
    gpu_engine.save_model(model, path, gpu_engine.weight_fingerprint(model))
    return str(path)


def run(a, model: str | None, policy: str | None) -> dict:
    import metalkv

    eng = metalkv.Engine.load(model, device=a.device, context=a.context, prefill_chunk=a.prefill_chunk,
                              progress=False, kv_policy=policy, kv_budget=a.budget if policy else None, kv_memory=a.kv_memory)
    cache = eng.new_cache()
    rng = np.random.default_rng(0)
    ids = rng.integers(0, min(eng.config.vocab, 32000), a.prompt).tolist()
    samples, done, last = [], 0, None
    t_all = time.perf_counter()
    while done < a.tokens:
        n = min(a.every, a.tokens - done)
        t0 = time.perf_counter()
        out = eng.generate_ids(ids, max_tokens=n, cache=cache, temperature=a.temperature, seed=done, stop_ids=())
        dt = time.perf_counter() - t0
        reason = eng.last_stats.get("finish_reason")
        done += len(out)
        finite = None
        if reason == "length":  # (a full cache without a policy has no room for it)
            logits = eng.logits(out[-1:], cache=cache)  # feeds the last id too: the next call continues after it
            ids = [int(np.argmax(logits[-1]))]
            finite = bool(np.isfinite(logits).all())
        pool = eng.kv_pool
        samples.append(dict(tokens=done, length=cache.length(0), count=cache.count(0), held_bytes=cache.held_nbytes,
                            pool_bytes=pool["nbytes"] if pool else cache.nbytes, rss=rss_bytes(),
                            tok_s=len(out) / dt, finite=finite, reason=reason))
        last = samples[-1]
        if a.verbose:
            print(f"  {policy or 'none'}: {done} tokens, count {last['count']}, held {last['held_bytes']/1e6:.2f} MB, "
                  f"RSS {last['rss']/1e6:.0f} MB, {last['tok_s']:.1f} tok/s", flush=True)
        if reason != "length":
            break
    wall = time.perf_counter() - t_all
    # steady: from the second sample past the budget's first eviction on; its second half must
    # hold no more KV bytes than its first (an eviction step lets the held blocks swing by
    # budget / 16), and RSS grow by less than 32 MB over it
    steady = [s for s in samples if s["count"] < s["length"]][1:] or samples[-1:]
    half = steady[len(steady) // 2:]
    return dict(policy=policy or "none", budget=eng.kv_options.resolve(eng.config.n_layers, eng.config.head_dim, eng.context)["kv_budget"] if policy else None,
                context=eng.context, tokens=done, seconds=wall, samples=samples,
                stopped=last["reason"] if last else None, all_finite=all(s["finite"] is not False for s in samples),
                held_max=max(s["held_bytes"] for s in samples),
                held_range=[min(s["held_bytes"] for s in steady), max(s["held_bytes"] for s in steady)],
                held_flat=max(s["held_bytes"] for s in half) <= max(s["held_bytes"] for s in steady),
                rss_growth=half[-1]["rss"] - half[0]["rss"],
                tok_s_first=samples[0]["tok_s"], tok_s_steady=float(np.median([s["tok_s"] for s in steady])))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="model (default: the default SmolLM2-135M-Instruct)")
    ap.add_argument("--random", action="store_true", help="a random-weight Llama of --layers/--hidden/... instead")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--policy", nargs="+", default=["streaming", "keynorm", "h2o", "snapkv", "pyramidkv"])
    ap.add_argument("--tokens", type=int, default=20000, help="tokens generated per policy (default 20000)")
    ap.add_argument("--context", type=int, default=2048, help="context the budget is a share of (default 2048)")
    ap.add_argument("--budget", type=float, default=0.5, help="kv_budget: tokens, or a fraction of --context")
    ap.add_argument("--every", type=int, default=500, help="tokens between samples (default 500)")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--prefill-chunk", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--kv-memory", default=None, help="the engine's shared pool (default: each cache its own)")
    ap.add_argument("--quick", action="store_true", help="CI form: 600 tokens, context 256, samples every 100")
    ap.add_argument("--json", help="write every sample here")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args(argv)
    if a.quick:
        a.tokens, a.context, a.every = 600, 256, 100
    if a.budget >= 1:
        a.budget = int(a.budget)
    model = random_model(a) if a.random else a.model
    import metalkv

    print(f"# bench/kv_policy_stress.py on {metalkv.device(a.device).name}, {a.tokens} tokens per policy, "
          f"context {a.context}, budget {a.budget}, {time.strftime('%Y-%m-%d')}", flush=True)
    results, ok = [], True
    for policy in a.policy:
        r = run(a, model, None if policy == "none" else policy)
        results.append(r)
        flat = r["held_flat"] and r["rss_growth"] < 32e6
        good = r["tokens"] == a.tokens and r["all_finite"] and flat and r["stopped"] == "length"
        ok = ok and (good or policy == "none")  # none: the baseline that stops at its context
        lo, hi = (h / 1e6 for h in r["held_range"])
        print(f"{r['policy']:<10} {r['tokens']:>6} tokens in {r['seconds']:.0f} s, stopped: {r['stopped']}; "
              f"KV held {r['held_max'] / 1e6:.2f} MB max, {lo:.2f}-{hi:.2f} MB once evicting; RSS "
              f"{r['rss_growth'] / 1e6:+.1f} MB over the last half; {r['tok_s_first']:.1f} tok/s before, "
              f"{r['tok_s_steady']:.1f} evicting (median); finite: {r['all_finite']}  "
              f"{'ok' if good else 'baseline' if policy == 'none' else 'NOT FLAT/COMPLETE'}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
