#!/usr/bin/env python3
"""Constrained decoding's cost on a GPU at the Llama-3-8B shape with a 128k vocabulary
(issue 35's target: at most 5 % of decode tokens/s with a JSON schema): builds a random
model of that shape and a synthetic byte-level BPE tokenizer of Llama 3's size
(byte_bpe.py: the GPU machine has no network, so no real one), then runs
bench/constrained.py on it (plain against JSON-schema decode, same engine and prompt, and
the mask's host time).

    python bench/gpu/constrained.py --json out.json               # 8B shape, cuda
    python bench/gpu/constrained.py --device host --layers 2 --hidden 256 --heads 4 \\
        --kv-heads 2 --ffn 512 --new-tokens 16 --repeat 1         # smoke test on the CPU

Random weights: the reply is no sensible text, but a grammar's mask costs what it costs
for any reply (the schema is an array of strings that cannot complete, so both calls run
to --new-tokens).
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from byte_bpe import write_byte_bpe  # noqa: E402
from common import LLAMA3_8B, add_shape_args, log  # noqa: E402
from engine import build_model, save_model, weight_fingerprint  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    add_shape_args(ap, LLAMA3_8B)
    ap.add_argument("--vocab", type=int, default=128256, help="ids (the last 256 are special tokens)")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    tdev = "cuda" if a.device != "host" else "cpu"
    shape = SimpleNamespace(layers=a.layers, hidden=a.hidden, heads=a.heads, kv_heads=a.kv_heads, ffn=a.ffn,
                            vocab=a.vocab, tied=False, init_std=0.02, seed=0)
    path = Path(f"/tmp/metalkv-constrained-l{a.layers}_h{a.hidden}_v{a.vocab}")
    t0 = time.perf_counter()
    model = build_model(shape, tdev)
    save_model(model, path, weight_fingerprint(model))
    del model
    write_byte_bpe(path, regular=a.vocab - 256, special=256)
    log(f"model and tokenizer in {path} ({time.perf_counter() - t0:.1f} s)")
    spec = importlib.util.spec_from_file_location("bench_constrained", Path(__file__).resolve().parents[1] /
                                                  "constrained.py")
    constrained = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(constrained)

    args = ["--model", str(path), "--device", a.device, "--context", str(a.context),
            "--new-tokens", str(a.new_tokens), "--repeat", str(a.repeat)]
    return constrained.main(args + (["--json", a.json] if a.json else []))


if __name__ == "__main__":
    sys.exit(main())
