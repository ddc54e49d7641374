#!/usr/bin/env python3
"""Many sequences at once: aggregate decode throughput, weight bytes read per
generated token, and time to first token with a cached system prompt.

    python bench/batching.py                                  # default model, host executor
    python bench/batching.py --batches 1,4,16,64 --new-tokens 16 --json out.json
    python bench/batching.py --model DIR --device cuda        # any model directory or GGUF on a GPU
    python bench/batching.py --random-llama 8b --device cuda  # a random Llama-3-8B shape (needs torch)
    python bench/batching.py --modes invariant,gemm           # batch-invariant steps beside decode rows in the gemm

1. Throughput: for each N in --batches, N different prompts of --prompt random ids go
   in as one generate_ids list (greedy, 1 token each: the prefill), each into a cache of
   its own; then one list continues every cache with its id for --new-tokens more, so all
   N decode in every step from the first: aggregate decode tok/s = N * new tokens / that
   call's wall time (after a warm-up of the same N). End-to-end tok/s: one list call of
   prompts and --new-tokens from scratch, generated tokens / its wall time (prefill and
   decode interleaved as a server would run them). Speedup: decode vs N = 1.
2. Weight bytes loaded per generated token, from the kernels' access pattern: a decode
   step of N sequences runs each projection as a gemv that loads its matrix once per
   gemv_tokens(N) sequences (ops.gemv_tokens: 1 for one, 8 on the host executor, 4 on
   GPUs), the embedding one row per sequence: (matrix bytes * ceil(N / T) + N rows) / N.
   Loads, not DRAM reads: on a GPU the threadgroups of one row block run close together
   and some of their loads hit L2. Mode 'gemm' (Engine.load(batch_invariant=False)): from
   the device's gemm_decode_rows sequences on, the projections run as a gemm that loads a
   matrix once per 32 sequences (its tile). --modes runs each mode with its own engine, one
   after the other, in the same process.
3. Time to first token of a request whose --system-tokens system prompt is in the
   prefix cache vs not: the same request (system prompt + its own 24 ids) after one
   other request with that system prompt, with prefix_cache on and off (median of
   --repeat, each in a fresh cache).
Prints a table; --json writes every number with the machine, the device and the date.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("METALKV_NO_PROGRESS", "1")
import metalkv  # noqa: E402
from metalkv._core import ops  # noqa: E402


def model_arguments(ap: argparse.ArgumentParser) -> None:
    """--model, --random-llama and --device, as every engine bench takes them (model_path reads them)."""
    ap.add_argument("--model", default=None, help="GGUF file or HF directory (default: the default model)")
    ap.add_argument("--random-llama", choices=("8b", "1b"), default=None,
                    help="build a random-weight Llama shape with transformers (bench/gpu/engine.py) and use it")
    ap.add_argument("--device", default="host")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    model_arguments(ap)
    ap.add_argument("--batches", default="1,4,16,64")
    ap.add_argument("--modes", default="invariant",
                    help="comma-separated: 'invariant' (the default engine), 'gemm' (batch_invariant=False)")
    ap.add_argument("--prompt", type=int, default=32, help="prompt ids per sequence")
    ap.add_argument("--new-tokens", type=int, default=16, help="greedy tokens per sequence")
    ap.add_argument("--system-tokens", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--json", help="write the results here")
    return ap.parse_args(argv)


def random_llama(shape: str, device: str, vocab: int | None = None) -> Path:
    """A random-weight Llama of `shape` ('8b' or '1b'), built with transformers and saved
    once under /tmp (vocab: bench/gpu/engine.py's default, Llama 3's, unless given)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
    import engine as gpu_engine  # bench/gpu/engine.py

    args = ["--layers", "32"] if shape == "8b" else ["--layers", "16", "--hidden", "2048", "--heads", "32",
                                                     "--kv-heads", "8", "--ffn", "8192"]
    args += ["--vocab", str(vocab)] if vocab else []
    a = gpu_engine.parse_args(args + ["--device", device])
    tdev = "cuda" if device == "cuda" else "cpu"
    path = Path(a.dir or f"/tmp/metalkv-batching-llama-{shape}" + (f"-v{vocab}" if vocab else ""))
    if not (path / "config.json").exists():
        model = gpu_engine.build_model(a, tdev)
        gpu_engine.save_model(model, path, gpu_engine.weight_fingerprint(model))
        del model
    return path


def model_path(a) -> str | None:
    """The model a bench's --model and --random-llama name (None: the default model)."""
    return str(random_llama(a.random_llama, a.device)) if a.random_llama else a.model


def matrix_bytes(eng) -> tuple[int, int]:
    """(bytes of every matrix a decode step reads whole, bytes of one embedding row)."""
    tensors = eng.weight_tensors
    embd = tensors["token_embd.weight"]
    tied = "output.weight" not in tensors
    whole = sum(t.nbytes for name, t in tensors.items()
                if len(t.shape) == 2 and (name != "token_embd.weight" or tied))
    return whole, embd.nbytes // embd.shape[0]


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab - 1, length).tolist() for _ in range(n)]


def throughput(eng, n: int, a) -> dict:
    vocab = eng.config.vocab
    kw = dict(stop_ids=())

    def decode(seed: int) -> float:
        caches = [eng.new_cache() for _ in range(n)]
        first = eng.generate_ids(prompts(n, a.prompt, vocab, seed), max_tokens=1, cache=caches, **kw)
        t0 = time.perf_counter()
        eng.generate_ids([[ids[0]] for ids in first], max_tokens=a.new_tokens, cache=caches, **kw)
        return time.perf_counter() - t0

    decode(100 + n)  # warm-up
    decode_wall = decode(n)
    st = eng.last_stats
    t0 = time.perf_counter()
    eng.generate_ids(prompts(n, a.prompt, vocab, 200 + n), max_tokens=a.new_tokens, **kw)
    wall = time.perf_counter() - t0
    whole, row = matrix_bytes(eng)
    gemm_rows = eng.device.properties["gemm_decode_rows"]
    per_pass = 32 if not eng.batch_invariant and gemm_rows and n >= gemm_rows else ops.gemv_tokens(eng.device, n)
    return {"sequences": n, "batch_invariant": eng.batch_invariant, "decode_wall_s": decode_wall, "decode_tok_s": n * a.new_tokens / decode_wall,
            "decode_max_batch": st["max_batch"], "end_to_end_wall_s": wall,
            "end_to_end_tok_s": eng.last_stats["generated_tokens"] / wall, "gemv_tokens": per_pass,
            "weight_bytes_per_token": (whole * math.ceil(n / per_pass) + n * row) / n}


def ttft(eng, a) -> dict:
    vocab = eng.config.vocab
    rng = np.random.default_rng(7)
    system = rng.integers(3, vocab - 1, a.system_tokens).tolist()
    out = {}
    for cached in (True, False):
        times = []
        for i in range(a.repeat):
            warm = system + rng.integers(3, vocab - 1, 24).tolist()
            ask = system + rng.integers(3, vocab - 1, 24).tolist()
            for ids, prefix in ((warm, True), (ask, cached)):
                r = eng._core.submit(eng.new_cache(), np.asarray(ids, np.int64), max_tokens=1, stop_ids=[],
                                     prefix_cache=prefix, ephemeral=True)
                r.result()
            st = r.stats
            times.append(st["prefill_seconds"])
            out["cached_tokens" if cached else "uncached_tokens"] = int(st["prompt_tokens_cached"])
        out["ttft_cached_s" if cached else "ttft_uncached_s"] = statistics.median(times)
    return out


def main(argv=None) -> int:
    a = parse_args(argv)
    model = model_path(a)
    batches = [int(x) for x in a.batches.split(",")]
    modes = a.modes.split(",")
    if any(m not in ("invariant", "gemm") for m in modes):
        raise SystemExit(f"--modes {a.modes}: expected 'invariant' and/or 'gemm'")
    rows, cache = [], {}
    for mode in modes:
        t0 = time.perf_counter()
        eng = metalkv.Engine.load(model, device=a.device, context=max(a.context, a.system_tokens + 64),
                                  max_seqs=max(batches), batch_invariant=mode == "invariant")
        load_s = time.perf_counter() - t0
        rows += [throughput(eng, n, a) for n in batches]
        if not cache and a.system_tokens:
            cache = ttft(eng, a)
        device = eng.device
        del eng
    base = {r["batch_invariant"]: r["decode_tok_s"] for r in rows[::-1]}  # each mode's first row
    print(f"{device.name} (gemm_decode_rows {device.properties['gemm_decode_rows']}); {model or 'default model'}; "
          f"prompt {a.prompt}, {a.new_tokens} new tokens each; load {load_s:.1f} s")
    print(f"{'mode':>10}{'sequences':>10}{'decode tok/s':>14}{'speedup':>9}{'end-to-end tok/s':>18}"
          f"{'weight MB/token':>17}")
    for r in rows:
        print(f"{'invariant' if r['batch_invariant'] else 'gemm':>10}{r['sequences']:>10}{r['decode_tok_s']:>14.2f}"
              f"{r['decode_tok_s'] / base[r['batch_invariant']]:>9.2f}"
              f"{r['end_to_end_tok_s']:>18.2f}{r['weight_bytes_per_token'] / 1e6:>17.2f}")
    if cache:
        print(f"time to first token, {a.system_tokens}-token system prompt + 24: "
              f"cached {cache['ttft_cached_s'] * 1e3:.1f} ms ({cache['cached_tokens']} tokens from the cache), "
              f"not cached {cache['ttft_uncached_s'] * 1e3:.1f} ms")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "date": datetime.date.today().isoformat(), "machine": platform.node(), "device": device.name,
            "model": model or "default", "args": vars(a), "load_s": load_s, "rows": rows, "ttft": cache}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
