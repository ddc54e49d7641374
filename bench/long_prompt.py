"""A long prompt on the host executor (issue 31): prefill of --long tokens, and decode
right after it against decode after --short tokens, in one process, the two cases
alternating each round so that the load of a shared machine falls on both alike.

    python bench/long_prompt.py [--long 1500] [--short 100] [--decode 16] [--rounds 2] [--kv f16,q8,q4] [--json PATH]

The prompt is bench/compare.py's passage; the engine's own prefill chunking (what
`metalkv generate` does); no shared KV pool, so no prefix cache serves a later round.
Prints per case the median prefill and decode tok/s and the decode ratio long / short; with
--kv, for each KV cache format in turn (K and V both; q4 and q2 with their default residual
window), an engine of its own.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
os.environ.setdefault("METALKV_NO_PROGRESS", "1")

import metalkv  # noqa: E402
from compare import prompt_ids  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--long", type=int, default=1500, help="prompt tokens of the long case")
    ap.add_argument("--short", type=int, default=100, help="prompt tokens of the short case")
    ap.add_argument("--decode", type=int, default=16, help="tokens decoded after each prompt")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of (short, long); medians reported")
    ap.add_argument("--kv", default="f16", help="KV cache formats, comma-separated (f16, q8, q4, q2)")
    ap.add_argument("--json", metavar="PATH", help="also write every run as JSON")
    args = ap.parse_args()

    results = {}
    for fmt in args.kv.split(","):
        kv = {} if fmt == "f16" else {"kv_k": fmt, "kv_v": fmt}
        eng = metalkv.Engine.load(device="host", context=args.long + args.decode + 8, kv_memory=0, **kv)
        results[fmt] = run_format(eng, fmt, args)
        device = str(eng.device)
        del eng
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"device": device, "kv": results}, indent=2) + "\n")
    return 0


def run_format(eng, fmt: str, args) -> dict:
    ids = prompt_ids(eng.tokenizer, args.long)
    runs = []
    for r in range(args.rounds):
        for n in (args.short, args.long):
            eng.generate_ids(ids[:n], max_tokens=args.decode, temperature=0.0, stop_ids=())
            st = eng.last_stats
            runs.append({"round": r, "prompt": n, "prefill_tok_s": st["prefill_tok_s"],
                         "decode_tok_s": st["decode_tok_s"], "loadavg": os.getloadavg()[0]})
            print(f"{fmt} round {r} prompt {n:5d}: prefill {st['prefill_tok_s']:7.1f} tok/s, "
                  f"decode {st['decode_tok_s']:5.1f} tok/s, load {os.getloadavg()[0]:.2f}", flush=True)
    med = {n: {k: statistics.median(x[k] for x in runs if x["prompt"] == n) for k in ("prefill_tok_s", "decode_tok_s")}
           for n in (args.short, args.long)}
    for n, m in med.items():
        print(f"{fmt} median, prompt {n:5d}: prefill {m['prefill_tok_s']:7.1f} tok/s, "
              f"decode {m['decode_tok_s']:5.1f} tok/s")
    ratio = med[args.long]["decode_tok_s"] / med[args.short]["decode_tok_s"]
    print(f"{fmt} decode at {args.long} tokens / at {args.short}: {ratio:.2f}")
    return {"runs": runs, "median": med, "decode_ratio": ratio}


if __name__ == "__main__":
    sys.exit(main())
