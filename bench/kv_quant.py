"""Quality and memory of the quantized KV cache (issue 14; docs/KV_QUANT.md).

  python bench/kv_quant.py [--tokens 1024] [--chunk 16] [--out DIR] [--plot PNG] [--no-llamacpp]
  python bench/kv_quant.py --residual-only --out DIR [--plot PNG]  # add the residual-window rows to DIR's
  python bench/kv_quant.py --memory [--prefill 4096]     # peak memory of a long prefill per format

Quality: decode-time perplexity (python/metalkv/ppl.py: the ids fed `chunk` at
a time, every chunk's logits from attention over the cache as stored) of the
default model (SmolLM2-135M-Instruct Q4_1) on the first tokens of
../shared/data/pride_and_prejudice.txt, per K/V format with the Hadamard
rotation off and on, and with a residual window of 128 tokens (q4, q2, q8 K +
q2 V; --residual-only computes just these and merges them into --out's
kv_quant.json), each beside the f16 cache: PPL, its change, mean
KL(f16 || format), top-1 agreement, KV bytes per token. Beside them llama.cpp
(llama-cpp-python, CPU, flash attention) on the same GGUF and the same ids,
fed in the same chunks, with its own f16, q8_0, q4_0 and q8_0-K/q4_0-V caches,
each against llama.cpp's f16 cache. The plot draws PPL change against KV
bytes per token.

Memory (--memory): one subprocess per format prefills `--prefill` tokens into
a fresh cache and reports how far the process's resident set peaked above
where it stood before the cache was made (the load's own peak reset through
/proc/self/clear_refs), and the cache's bytes (the host executor's device
memory is process memory).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
TEXT = ROOT.parent / "shared" / "data" / "pride_and_prejudice.txt"
FORMATS = [("q8", "q8"), ("q8", "q4"), ("q4", "q8"), ("q4", "q4")]
RESIDUAL = 128
RESIDUAL_FORMATS = [("q4", "q4"), ("q8", "q2"), ("q2", "q2")]
# llama.cpp's ggml types (ggml.h): f16 1, q4_0 2, q8_0 8; bytes per 32 elements 64, 18, 34
LLAMA_TYPES = {"f16": (1, 64), "q4_0": (2, 18), "q8_0": (8, 34)}
LLAMA_PAIRS = [("f16", "f16"), ("q8_0", "q8_0"), ("q8_0", "q4_0"), ("q4_0", "q4_0")]


def metalkv_rows(engine, ids, chunk: int, residual_only: bool = False) -> list[dict]:
    from metalkv.ppl import format_table, score

    cands = {}
    for k, v in [] if residual_only else FORMATS:
        for rot in (False, True):
            cands[f"{k}/{v}{' rot' if rot else ''}"] = dict(kv_k=k, kv_v=v, kv_rotate=rot, kv_residual=0)
    for k, v in RESIDUAL_FORMATS:
        for rot in (False, True):
            cands[f"{k}/{v}{' rot' if rot else ''} r{RESIDUAL}"] = dict(kv_k=k, kv_v=v, kv_rotate=rot,
                                                                        kv_residual=RESIDUAL)
    results = score(engine, ids, cands, chunk=chunk)
    print(format_table(results), flush=True)
    return [dict(r.row(), engine="metalkv") for r in results]


def llamacpp_rows(model_path: str, ids, chunk: int, cfg) -> list[dict]:
    import importlib.metadata as md

    import llama_cpp
    from metalkv.ppl import log_softmax

    per_token_elems = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim  # K and V, every layer
    rows, ref = [], None
    for tk, tv in LLAMA_PAIRS:
        t0 = time.perf_counter()
        llm = llama_cpp.Llama(model_path=model_path, n_ctx=len(ids) + 16, n_batch=chunk, n_ubatch=chunk,
                              n_threads=os.cpu_count(), n_gpu_layers=0, logits_all=True, verbose=False,
                              type_k=LLAMA_TYPES[tk][0], type_v=LLAMA_TYPES[tv][0], flash_attn=True)
        llm.eval(list(map(int, ids[:-1])))  # n_batch = chunk: each chunk attends to the cache as stored
        lp = log_softmax(np.asarray(llm.scores[:len(ids) - 1], np.float32))
        seconds = time.perf_counter() - t0
        del llm
        targets = ids[1:]
        nll = -lp[np.arange(len(targets)), targets].mean()
        row = {"engine": "llama.cpp", "label": f"llama.cpp {tk}/{tv}", "tokens": len(targets),
               "ppl": float(np.exp(nll)), "seconds": seconds,
               "bytes_per_token": per_token_elems // 2 * (LLAMA_TYPES[tk][1] + LLAMA_TYPES[tv][1]) // 32,
               "version": md.version("llama-cpp-python")}
        if ref is None:
            ref, ref_row = lp, row
            row.update(ppl_change=None, kl=None, top1=None)
        else:
            p = np.exp(ref)
            row.update(ppl_change=row["ppl"] / ref_row["ppl"] - 1, kl=float((p * (ref - lp)).sum(-1).mean()),
                       top1=float((ref.argmax(-1) == lp.argmax(-1)).mean()))
        row["bytes_vs_f16"] = ref_row["bytes_per_token"] / row["bytes_per_token"]
        rows.append(row)
        change = "" if row["ppl_change"] is None else f"{100 * row['ppl_change']:+.2f}%"
        kl = "" if row["kl"] is None else f"{row['kl']:.4f}"
        print(f"{row['label']:<24} {row['ppl']:9.3f} {change:>8} {kl:>8} {row['bytes_per_token']:>8}", flush=True)
    return rows


def merge(old: list[dict], new: list[dict]) -> list[dict]:
    """old's rows with new's in place of those of the same label, and new's others after old's metalkv rows."""
    fresh = {(r["engine"], r["label"]): r for r in new}
    out = [fresh.pop((r["engine"], r["label"]), r) for r in old]
    last = max((i for i, r in enumerate(out) if r["engine"] == "metalkv"), default=len(out) - 1)
    return out[:last + 1] + list(fresh.values()) + out[last + 1:]


def table(rows: list[dict]) -> str:
    out = ["| cache | PPL | vs its f16 | KL vs f16 | top-1 vs f16 | KV bytes/token | smaller |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        change = "" if r["ppl_change"] is None else f"{100 * r['ppl_change']:+.2f} %"
        kl = "" if r["kl"] is None else f"{r['kl']:.4f}"
        top1 = "" if r["top1"] is None else f"{100 * r['top1']:.1f} %"
        label = r["label"] if r["engine"] == "llama.cpp" else f"metalkv {r['label']}"
        out.append(f"| {label} | {r['ppl']:.3f} | {change} | {kl} | {top1} | {r['bytes_per_token']} | "
                   f"{r['bytes_vs_f16']:.2f}x |")
    return "\n".join(out)


def plot(rows: list[dict], path: pathlib.Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for engine, marker in (("metalkv", "o"), ("llama.cpp", "s")):
        pts = [r for r in rows if r["engine"] == engine]
        ax.scatter([r["bytes_per_token"] for r in pts], [100 * (r["ppl_change"] or 0) for r in pts], marker=marker,
                   label=engine)
        for r in pts:
            ax.annotate(r["label"].replace("llama.cpp ", ""), (r["bytes_per_token"], 100 * (r["ppl_change"] or 0)),
                        fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("KV bytes per token (all layers, K + V)")
    ax.set_ylabel("perplexity change vs the engine's f16 cache (%)")
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    print(f"plot: {path}")


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def memory_child(fmt: str, n: int) -> None:
    """Prefill n tokens into a fresh cache of the format; print the peak RSS of
    the prefill (the load's peak reset first: /proc/self/clear_refs) and the
    cache's bytes."""
    import metalkv
    from metalkv.ppl import text_ids

    k, v = fmt.split("/")
    eng = metalkv.Engine.load(None, kv_memory=None, context=n + 1, prefill_chunk=512)
    ids = text_ids(eng, str(TEXT), n)[:n]
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak resident set starts again from the current one
    before = _status_mb("VmRSS")
    cache = eng.new_cache(kv_k=k, kv_v=v)
    t0 = time.perf_counter()
    eng.generate_ids(list(map(int, ids)), cache=cache, max_tokens=1, stop_ids=())  # no (n, vocab) logits held
    print(json.dumps({"format": fmt, "tokens": n, "seconds": time.perf_counter() - t0,
                      "cache_nbytes": cache.nbytes, "rss_before_MB": before,
                      "peak_rss_during_prefill_MB": _status_mb("VmHWM"),
                      "peak_growth_MB": _status_mb("VmHWM") - before}))


def memory(n: int) -> list[dict]:
    rows = []
    for fmt in ("f16/f16", "q8/q8", "q4/q4"):
        r = subprocess.run([sys.executable, __file__, "--memory-child", fmt, "--prefill", str(n)], capture_output=True,
                           text=True, check=True, env=dict(os.environ, METALKV_NO_PROGRESS="1"))
        rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--chunk", type=int, default=16)
    p.add_argument("--text", default=str(TEXT))
    p.add_argument("--out", default=None, help="directory for kv_quant.json and kv_quant.md")
    p.add_argument("--plot", default=None, help="PNG of PPL change against KV bytes per token")
    p.add_argument("--no-llamacpp", action="store_true")
    p.add_argument("--memory", action="store_true")
    p.add_argument("--prefill", type=int, default=4096)
    p.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--residual-only", action="store_true", help="only the residual-window rows, merged into --out's")
    a = p.parse_args()
    if a.memory_child:
        memory_child(a.memory_child, a.prefill)
        return 0
    out = pathlib.Path(a.out) if a.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    if a.memory:
        rows = memory(a.prefill)
        if out:
            (out / "kv_quant_memory.json").write_text(json.dumps(rows, indent=1))
        return 0

    import metalkv
    from metalkv.models import default_model_path
    from metalkv.ppl import text_ids

    eng = metalkv.Engine.load(None, kv_memory=None, context=a.tokens + 1)
    ids = text_ids(eng, a.text, a.tokens)
    rows = metalkv_rows(eng, ids, a.chunk, a.residual_only)
    if a.residual_only:  # keep --out's other rows (same tokens and chunk), replace the f16 and residual ones
        old = json.loads((out / "kv_quant.json").read_text()) if out and (out / "kv_quant.json").exists() else None
        if old and (old["tokens"], old["chunk"]) == (a.tokens, a.chunk):
            rows = merge(old["rows"], rows)
    elif not a.no_llamacpp:
        try:
            rows += llamacpp_rows(str(default_model_path()), ids, a.chunk, eng.config)
        except ImportError as e:
            print(f"llama.cpp: not installed ({e}); pip install -r bench/requirements-compare.txt")
    md = table(rows)
    print(md)
    if out:
        (out / "kv_quant.json").write_text(json.dumps({"tokens": a.tokens, "chunk": a.chunk, "text": a.text,
                                                       "rows": rows}, indent=1))
        (out / "kv_quant.md").write_text(md + "\n")
    if a.plot:
        plot(rows, pathlib.Path(a.plot), f"SmolLM2-135M Q4_1, {a.tokens} tokens of {pathlib.Path(a.text).name}, "
                                         f"chunks of {a.chunk}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
