"""Quality and memory of the eviction policies (issue 15; docs/KV_POLICIES.md).

  python bench/kv_policies.py --ppl [--tokens 4096] [--chunk 32] [--out DIR] [--plot PNG]
  python bench/kv_policies.py --retrieval [--placements 50] [--length 512] [--out DIR]

Perplexity (--ppl): decode-time perplexity (python/metalkv/ppl.py: the ids fed
`chunk` at a time into each cache, every chunk's logits from attention over
what the cache holds, evicted tokens gone) of the default model on the first
`tokens` tokens of ../shared/data/pride_and_prejudice.txt, per policy and
budget (a share of `tokens`: 25 % and 50 %) and a few KV formats, each beside
the f16 cache that keeps everything: PPL, its change, KL(f16 || policy),
top-1 agreement, and the most KV bytes the cache held; beside them llama.cpp's
(llama-cpp-python, CPU) f16 cache on the same ids in the same chunks.

Retrieval (--retrieval): a five-digit pass key sentence placed at a random
depth in the first half of a `length`-token stretch of the novel, and the
question at the end; greedy decoding must say the key. Accuracy (and the
share of the key's digits said right, place by place) over
`placements` placements per cache: the full cache and each policy of
--retrieval-policies at 25 % (or --shares), each with its prompt held whole (compressed once
read, the question included) and streamed (evicted as it is stored), or the
--prompt-modes given.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
TEXT = ROOT.parent / "shared" / "data" / "pride_and_prejudice.txt"
POLICIES = ["streaming", "keynorm", "h2o", "snapkv", "pyramidkv"]
SHARES = [0.25, 0.5]
FORMATS = [("q8", "q8", False), ("q4", "q4", True)]  # (K, V, rotated) beside f16, with h2o and snapkv at 25 %


def ppl_rows(engine, ids, chunk: int, full_grid: bool, policies: list[str], formats: bool) -> list[dict]:
    from metalkv.ppl import format_table, score

    n = len(ids) - 1
    cands = {}
    for share in SHARES:
        for policy in policies:
            # (prompts streamed: each chunk is a call, and the text is read as decoding reads it)
            cands[f"{policy} {int(100 * share)}%"] = dict(kv_policy=policy, kv_budget=int(share * n), kv_prompt="stream")
    for k, v, rot in FORMATS if formats else []:
        for policy in policies if full_grid else [p for p in policies if p in ("h2o", "snapkv")]:
            for share in SHARES if full_grid else [0.25]:
                cands[f"{policy} {int(100 * share)}% {k}/{v}{' rot' if rot else ''}"] = dict(
                    kv_policy=policy, kv_budget=int(share * n), kv_prompt="stream", kv_k=k, kv_v=v, kv_rotate=rot)
    results = score(engine, ids, cands, chunk=chunk)
    print(format_table(results), flush=True)
    return [dict(r.row(), engine="metalkv") for r in results]


def llamacpp_f16(ids, chunk: int, cfg) -> dict | None:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import kv_quant
        import metalkv.models

        path = metalkv.models.default_model_path()
        kv_quant.LLAMA_PAIRS[:] = [("f16", "f16")]
        return kv_quant.llamacpp_rows(str(path), ids, chunk, cfg)[0]
    except Exception as e:  # no llama-cpp-python here: the table says so
        print(f"llama.cpp: skipped ({type(e).__name__}: {e})", flush=True)
        return None


def passkey_prompt(engine, words: list[str], length: int, depth: float, key: int) -> list[int]:
    tok = engine.tokenizer
    needle = f" The pass key is {key}. Remember it: the pass key is {key}. "
    question = " What is the pass key? The pass key is"
    filler = tok.encode(" ".join(words), add_special=False)
    room = length - len(tok.encode(needle + question, add_special=False)) - 1
    at = int(depth * room)
    text = tok.decode(filler[:at]) + needle + tok.decode(filler[at:room]) + question
    return tok.encode(text, add_special=True)


def key_digits(out: str, key: int) -> int:
    """How many of the key's five digits the answer's first number has right, place by place."""
    said = "".join(ch for ch in out.strip().split(" ")[0] if ch.isdigit())[:5] if out.strip() else ""
    return sum(a == b for a, b in zip(said, str(key)))


def retrieval(engine, placements: int, length: int, policies: list[str], prompt_modes: list[str],
              shares: list[float], seed: int = 0) -> list[dict]:
    words = TEXT.read_text(encoding="utf-8").split()
    rng = np.random.default_rng(seed)
    cases = []
    for _ in range(placements):
        start = int(rng.integers(0, len(words) - 4 * length))
        cases.append((words[start:start + 2 * length], float(rng.uniform(0.05, 0.5)), int(rng.integers(10000, 99999))))
    configs = [("full", {})] if "full" in policies else []
    configs += [(f"{p} {int(100 * share)}% ({mode})", dict(kv_policy=p, kv_budget=int(share * length), kv_prompt=mode))
                for share in shares for p in policies if p != "full" for mode in prompt_modes]
    rows = []
    for label, kw in configs:
        hits, digits, t0 = 0, 0, time.perf_counter()
        for words_i, depth, key in cases:
            ids = passkey_prompt(engine, words_i, length, depth, key)
            cache = engine.new_cache(capacity=len(ids) + 16, **kw)
            out = engine.generate(ids, cache=cache, max_tokens=6, temperature=0.0, chat=False)
            hits += str(key) in out
            digits += key_digits(out, key)
        rows.append(dict(label=label, placements=placements, length=length, hits=hits, accuracy=hits / placements,
                         digits=digits / (5 * placements), seconds=time.perf_counter() - t0))
        print(f"{label:<22} {hits}/{placements} = {100 * hits / placements:.0f} %, digits right "
              f"{100 * rows[-1]['digits']:.0f} %  ({rows[-1]['seconds']:.0f} s)", flush=True)
    return rows


def plot(rows: list[dict], path: pathlib.Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for r in rows:
        if r["engine"] != "metalkv":
            continue
        x, y = r["held_bytes"] / 1e6, 100 * (r["ppl_change"] or 0)
        ax.scatter([x], [y], marker="o" if "/" not in r["label"] else "s", color="C0" if "/" not in r["label"] else "C1")
        ax.annotate(r["label"], (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("KV memory held (MB, peak over the text)")
    ax.set_ylabel("perplexity change vs the f16 cache that keeps all (%)")
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    print(f"plot: {path}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ppl", action="store_true")
    p.add_argument("--retrieval", action="store_true")
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--chunk", type=int, default=32)
    p.add_argument("--full-grid", action="store_true", help="every policy and share for each quantized format")
    p.add_argument("--ppl-policies", nargs="+", default=POLICIES, choices=POLICIES,
                   help="the policies the PPL table runs (default: all)")
    p.add_argument("--no-formats", action="store_true", help="no quantized-format rows in the PPL table")
    p.add_argument("--placements", type=int, default=50)
    p.add_argument("--length", type=int, default=512)
    p.add_argument("--retrieval-policies", nargs="+", default=["full", "streaming", "h2o", "snapkv"],
                   choices=["full"] + POLICIES,
                   help="caches the retrieval test runs, the policies at 25 %% (default: all but keynorm, to keep "
                        "the host run near an hour)")
    p.add_argument("--shares", nargs="+", type=float, default=[0.25],
                   help="the retrieval test's budgets, as shares of --length (default: 0.25)")
    p.add_argument("--prompt-modes", nargs="+", default=["whole", "stream"], choices=["whole", "stream"],
                   help="the retrieval test's policies hold the prompt whole, stream it, or both (the default)")
    p.add_argument("--out", default=None, help="directory for kv_policies.json")
    p.add_argument("--plot", default=None, help="PNG of PPL change against KV memory held")
    p.add_argument("--plot-rows", nargs="+", default=None, metavar="JSON",
                   help="plot --plot from the PPL rows of these kv_policies.json files (no model run; a label "
                        "in several files: the last file's row)")
    a = p.parse_args()
    if a.plot_rows:
        rows = {}
        for f in a.plot_rows:
            for r in json.loads(pathlib.Path(f).read_text())["ppl"]["rows"]:
                rows[r["label"]] = r
        plot(list(rows.values()), pathlib.Path(a.plot), "metalkv eviction policies, 4,096 tokens of Pride and "
                                                          "Prejudice, SmolLM2-135M-Instruct (chunks of 32)")
        return 0
    import metalkv
    from metalkv.ppl import text_ids

    out = pathlib.Path(a.out) if a.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    result = json.loads((out / "kv_policies.json").read_text()) if out and (out / "kv_policies.json").exists() else {}
    result["machine"] = metalkv.device("auto").name
    result["date"] = time.strftime("%Y-%m-%d")
    if a.ppl:
        engine = metalkv.Engine.load(device="auto", context=a.tokens + 16, kv_memory=None, progress=False)
        ids = text_ids(engine, str(TEXT), a.tokens)
        rows = ppl_rows(engine, ids, a.chunk, a.full_grid, a.ppl_policies, not a.no_formats)
        ref = llamacpp_f16(ids, a.chunk, engine.config)
        result["ppl"] = dict(command=" ".join(sys.argv), tokens=a.tokens, chunk=a.chunk, rows=rows, llamacpp_f16=ref)
        if a.plot:
            plot(rows, pathlib.Path(a.plot), f"metalkv eviction policies, {a.tokens} tokens of Pride and Prejudice, "
                                             f"SmolLM2-135M-Instruct (chunks of {a.chunk})")
    if a.retrieval:
        engine = metalkv.Engine.load(device="auto", context=a.length + 64, kv_memory=None, progress=False)
        rows = retrieval(engine, a.placements, a.length, a.retrieval_policies, a.prompt_modes, a.shares)
        old = {r["label"]: r for r in result.get("retrieval", {}).get("rows", [])}  # earlier runs' other caches stay
        for r in rows:
            r["command"] = " ".join(sys.argv)
        old.update({r["label"]: r for r in rows})
        result["retrieval"] = dict(rows=list(old.values()))
    if out:
        (out / "kv_policies.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
