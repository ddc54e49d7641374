#!/usr/bin/env python3
"""metalkv and llama.cpp on a quantized GGUF, each against the exact function of
the file's weights: a float64 numpy forward of gguf-py's dequantization
(tests/engine/reference.py; Llama-family models).

    # 1. metalkv's greedy continuation and the float64 reference (python with metalkv)
    python tools/compare_quantized.py run --model M.gguf --prompt "Why is the sky blue?" --out /tmp/q.npz
    # 2. llama.cpp's logits on the same tokens (a python with llama-cpp-python)
    python tools/compare_quantized.py llamacpp --model M.gguf --out /tmp/q.npz
    # 3. the table
    python tools/compare_quantized.py report --out /tmp/q.npz

All three score the same ids (the chat-rendered prompt and metalkv's greedy
tokens), teacher-forced, so a difference at one step does not change the next.
Not run in CI (it needs llama-cpp-python and a model file).
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run(a) -> None:
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    import metalkv
    from metalkv.models import load_model
    from tests.engine.reference import llama_logits

    m = load_model(a.model, progress=False)
    eng = metalkv.Engine.load(a.model, device=a.device, progress=False)
    prompt = m.tokenizer.encode(m.chat_template.render([{"role": "user", "content": a.prompt}],
                                                       add_generation_prompt=True))
    gen = eng.generate_ids(prompt, max_tokens=a.tokens, stop_ids=())
    ids = prompt + gen
    scored = slice(len(prompt) - 1, len(ids) - 1)  # the positions that predict gen
    np.savez(a.out, ids=np.array(ids), n_prompt=len(prompt), metalkv=eng.logits(ids)[scored],
             reference=llama_logits(m, ids)[scored])
    print(f"{a.out}: {len(prompt)} prompt tokens, {len(gen)} generated; now run the llamacpp step")


def llamacpp(a) -> None:
    import llama_cpp

    d = dict(np.load(a.out))
    ids, n_prompt = [int(i) for i in d["ids"]], int(d["n_prompt"])
    llm = llama_cpp.Llama(a.model, n_ctx=len(ids) + 8, logits_all=True, verbose=False)
    llm.eval(ids[:-1])
    d["llamacpp"] = np.array(llm.scores[n_prompt - 1:len(ids) - 1], dtype=np.float32)
    d["llamacpp_version"] = np.array(llama_cpp.__version__)
    np.savez(a.out, **d)
    print(f"{a.out}: llama.cpp {llama_cpp.__version__} logits added")


def report(a) -> None:
    d = np.load(a.out)
    ref = d["reference"]
    top2 = np.sort(ref, axis=1)[:, ::-1]
    print(f"{len(ref)} generated positions; float64 reference top-1/top-2 margin: min {np.min(top2[:, 0] - top2[:, 1]):.4f}")
    print("| logits | max abs vs float64 | rms | argmax = reference's |")
    print("| --- | --- | --- | --- |")
    for name in ("metalkv", "llamacpp"):
        if name not in d:
            continue
        z = d[name]
        same = int(np.sum(z.argmax(1) == ref.argmax(1)))
        label = f"llama.cpp {d['llamacpp_version']}" if name == "llamacpp" else name
        print(f"| {label} | {np.abs(z - ref).max():.4f} | {np.sqrt(np.mean((z - ref) ** 2)):.4f} | {same}/{len(ref)} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("step", choices=["run", "llamacpp", "report"])
    ap.add_argument("--model")
    ap.add_argument("--prompt", default="Why is the sky blue?")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--device", default="host")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    {"run": run, "llamacpp": llamacpp, "report": report}[a.step](a)


if __name__ == "__main__":
    main()
