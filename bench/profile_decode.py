"""Where a decode step (and a prefill chunk) of the default model spends its time
on the host executor, kernel by kernel.

    METALKV_HOST_THREADS=2 python bench/profile_decode.py [--tokens 32] [--prefill 128]

Sets METALKV_PROFILE=1 (per-dispatch timing, two clock reads per dispatch) before
the device is created, decodes --tokens tokens greedily through one cache, and
prints per kernel: calls and milliseconds per token, and the share of the
executor's time. Then the same for one prefill chunk of --prefill tokens.
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("METALKV_PROFILE", "1")

import metalkv  # noqa: E402  (after the environment variable)


def table(times: dict, per: int, what: str) -> None:
    total = sum(s for _, s in times.values())
    print(f"{'kernel':<28}{'calls/' + what:>12}{'ms/' + what:>12}{'share':>8}")
    for name, (calls, secs) in sorted(times.items(), key=lambda kv: -kv[1][1]):
        print(f"{name:<28}{calls / per:>12.1f}{1e3 * secs / per:>12.2f}{100 * secs / total:>7.1f}%")
    print(f"{'executor total':<28}{'':>12}{1e3 * total / per:>12.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=32, help="tokens to decode")
    ap.add_argument("--prefill", type=int, default=128, help="prompt tokens of the prefill run (0: skip)")
    args = ap.parse_args()

    eng = metalkv.Engine.load(device="host")
    dev = eng.device
    print(dev.name)
    prompt = eng.tokenizer.encode("The capital of France is")

    # Decode: fill the cache with the prompt, then time only one-token steps.
    cache = eng.new_cache()
    first = eng.generate_ids(prompt, max_tokens=1, stop_ids=(), cache=cache)
    dev.reset_counters()
    t0 = time.perf_counter()
    out = eng.generate_ids(first, max_tokens=args.tokens, stop_ids=(), cache=cache)
    wall = time.perf_counter() - t0
    steps = len(out)  # the fed token's step, then one per further token
    st = eng.last_stats
    print(f"\ndecode: {steps} one-token steps, {wall:.2f} s wall, {steps / wall:.2f} tok/s "
          f"(engine decode_tok_s {st['decode_tok_s']:.2f}), "
          f"{st['dispatches_per_token']:.0f} dispatches/token")
    table(dev.kernel_times(), steps, "tok")

    if args.prefill:
        ids = [(7 * i + 100) % eng.config.vocab for i in range(args.prefill)]
        dev.reset_counters()
        eng.generate_ids(ids, max_tokens=1, stop_ids=())
        st = eng.last_stats
        print(f"\nprefill: {args.prefill} tokens in {st['prefill_seconds']:.2f} s, "
              f"{st['prefill_tok_s']:.1f} tok/s (one chunk of {args.prefill})")
        table(dev.kernel_times(), 1, "run")


if __name__ == "__main__":
    main()
