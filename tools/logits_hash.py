"""The default model's greedy logits over a fixed prompt, as one SHA-256: a refactor that
must not change behaviour records it before and after (issue 30's "bit-identical").

    python tools/logits_hash.py [--model PATH] [--tokens 32] [--kv-k q4 --kv-rotate ...]

Prints the hash of the prompt's logits rows (one prefill, chunked by the engine) followed by
each greedy decode step's logits row, and the generated ids. Host device, f32 bytes as computed.
"""
from __future__ import annotations

import argparse
import hashlib

import numpy as np

import metalkv

PROMPT = "Why is the sky blue? Answer in two sentences, then name three colours of a sunset."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=32, help="greedy decode steps after the prompt")
    ap.add_argument("--kv-k", default="f16")
    ap.add_argument("--kv-v", default="f16")
    ap.add_argument("--kv-rotate", action=argparse.BooleanOptionalAction, default=None)
    ap.add_argument("--kv-residual", type=int, default=None)
    ap.add_argument("--kv-policy", default=None)
    args = ap.parse_args()
    eng = metalkv.Engine.load(args.model, device="host", kv_k=args.kv_k, kv_v=args.kv_v,
                              kv_rotate=args.kv_rotate, kv_residual=args.kv_residual, kv_policy=args.kv_policy,
                              kv_budget=64 if args.kv_policy else None)
    ids = eng.chat_ids([{"role": "user", "content": PROMPT}])
    cache = eng.new_cache()
    h = hashlib.sha256()
    rows = eng.logits(ids, cache=cache)
    h.update(np.ascontiguousarray(rows, dtype=np.float32).tobytes())
    out = []
    for _ in range(args.tokens):
        nxt = int(np.argmax(rows[-1]))
        out.append(nxt)
        rows = eng.logits([nxt], cache=cache)
        h.update(np.ascontiguousarray(rows, dtype=np.float32).tobytes())
    print(f"prompt {len(ids)} tokens, {args.tokens} greedy steps; ids {out}")
    print(f"logits sha256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
