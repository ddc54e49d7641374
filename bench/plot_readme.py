"""The README's two pictures, each drawn from JSON committed beside it (issue 31).

  python bench/plot_readme.py ppl [--tokens 1024] [--chunk 16] [--groups formats policies] [--out DIR]
  python bench/plot_readme.py gpu [--out bench/results/readme]
  python bench/plot_readme.py plot [--ppl DIR/ppl.json] [--gpu bench/results/readme/gpu_decode.json]

ppl (measures; the host executor, minutes): decode-time perplexity (python/metalkv/ppl.py:
the ids fed `chunk` at a time, every chunk's logits from attention over the cache as stored)
of the default model on the first `tokens` tokens of ../shared/data/pride_and_prejudice.txt,
for each KV format (f16, q8, q4, q2; rotation and the 128-token residual window on and off)
and each eviction policy at a quarter of the tokens, every one beside the f16 cache. Every
Engine KV keyword is written out, so the rows do not move when the defaults do. Each group
of --groups is one lockstep run with its own f16 reference; the rows merge into
DIR/ppl.json by label. llama.cpp's rows are copied from --llamacpp (its f16, q8_0, q4_0
caches, measured on the same ids in the same chunks) when that file's text, token count and
chunk are these.

gpu (gathers, no GPU): decode tokens/s against context from the committed H200 results
(bench/results/h200-*): the engine at 32k cached positions per KV format, and one attention
layer's decode per format and context beside torch's scaled_dot_product_attention, into
gpu_decode.json with each number's source file.

plot: the two PNGs beside their JSON (matplotlib: a bench-only dependency).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import re
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
TEXT = ROOT.parent / "shared" / "data" / "pride_and_prejudice.txt"
PPL_DIR = ROOT / "bench" / "results" / "host-2026-12-05-issue31-ppl"
GPU_DIR = ROOT / "bench" / "results" / "readme"
LLAMACPP = ROOT / "bench" / "results" / "host-2026-12-02-issue14" / "kv_quant.json"
RESIDUAL = 128
SHARE = 0.25
# (label, K, V, rotate, residual window)
FORMATS = [("q8/q8", "q8", "q8", False, 0), ("q8/q8 rot", "q8", "q8", True, 0),
           ("q8/q4 rot", "q8", "q4", True, 0),
           ("q4/q4", "q4", "q4", False, 0), ("q4/q4 rot", "q4", "q4", True, 0),
           ("q4/q4 r128", "q4", "q4", False, RESIDUAL), ("q4/q4 rot r128", "q4", "q4", True, RESIDUAL),
           ("q8/q2 rot r128", "q8", "q2", True, RESIDUAL),
           ("q2/q2 r128", "q2", "q2", False, RESIDUAL), ("q2/q2 rot r128", "q2", "q2", True, RESIDUAL)]
POLICIES = ["streaming", "keynorm", "h2o", "snapkv", "pyramidkv"]


def candidates(group: str, n: int) -> dict[str, dict]:
    """{label: Engine.new_cache keywords}, every KV keyword explicit."""
    plain = dict(kv_k="f16", kv_v="f16", kv_rotate=False, kv_residual=0, kv_f16_layers=(), kv_policy="none")
    if group == "formats":
        return {label: dict(plain, kv_k=k, kv_v=v, kv_rotate=rot, kv_residual=res)
                for label, k, v, rot, res in FORMATS}
    if group == "policies":
        budget = int(SHARE * n)
        return {f"{p} {int(100 * SHARE)}%": dict(plain, kv_policy=p, kv_budget=budget, kv_prompt="stream")
                for p in POLICIES}
    raise ValueError(f"--groups: {group!r} is not a group; choose formats or policies")


def measure_ppl(a) -> int:
    import metalkv
    from metalkv.ppl import format_table, score, text_ids

    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "ppl.json"
    result = json.loads(path.read_text()) if path.exists() else {}
    engine = metalkv.Engine.load(device="auto", context=a.tokens + 16, kv_memory=None, progress=False)
    ids = text_ids(engine, str(TEXT), a.tokens)
    digest = hashlib.sha256(ids.tobytes()).hexdigest()
    if result and (result.get("ids_sha256"), result.get("chunk")) != (digest, a.chunk):
        raise SystemExit(f"{path} holds rows of other ids or chunks; choose another --out")
    rows = {r["label"]: r for r in result.get("rows", [])}
    for group in a.groups:
        cands = candidates(group, len(ids) - 1)
        t0 = time.perf_counter()
        results = score(engine, ids, cands, chunk=a.chunk)
        print(f"[{group}: {time.perf_counter() - t0:.0f} s]\n{format_table(results)}", flush=True)
        for r in results:
            kw = cands.get(r.label, {})
            row = dict(r.row(), engine="metalkv", group=group,
                       kv={k: (list(v) if isinstance(v, tuple) else v) for k, v in kw.items()})
            if r.label == "f16":
                row["label"] = f"f16 ({group} run)"
            rows[row["label"]] = row
    result.update(machine=f"{metalkv.device('auto').name}, 2-core x86-64 dev machine", date=time.strftime("%Y-%m-%d"),
                  command=" ".join(["python"] + sys.argv), text="../shared/data/pride_and_prejudice.txt",
                  tokens=a.tokens, chunk=a.chunk, ids_sha256=digest, rows=list(rows.values()))
    peer = json.loads(pathlib.Path(a.llamacpp).read_text()) if a.llamacpp else None
    if peer and (peer["tokens"], peer["chunk"], pathlib.Path(peer["text"]).name) == (a.tokens, a.chunk, TEXT.name):
        result["llamacpp"] = dict(source=str(pathlib.Path(a.llamacpp).resolve().relative_to(ROOT)),
                                  rows=[r for r in peer["rows"] if r["engine"] == "llama.cpp"],
                                  metalkv_f16_then=next(r["ppl"] for r in peer["rows"] if r["label"] == "f16"))
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")
    return 0

# ---- picture 2: the committed H200 numbers ----------------------------------------------
H200 = ROOT / "bench" / "results"
KV_RUN = "h200-2026-12-02-issue14"            # run k: the quantized kernels as on main
TORCH_RUN = "h200-2026-12-01-issue13"          # run b: torch's sdpa beside metalkv's f16 kernel
ENGINE_FORMATS = [("f16", "f16"), ("q8", "q8"), ("q4", "q4"), ("q4rot", "q4 rot"), ("q4rotr128", "q4 rot r128"),
                  ("q2r128", "q2 rot r128")]


def _rel(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT))


def _engine_name(label: str) -> str:
    """engine.py's "metalkv (cuda, f16)" -> "metalkv" (the format is the row's kv), and
    "transformers (dynamic cache, f16)" -> "transformers (dynamic cache)"."""
    return "metalkv" if label.startswith("metalkv") else re.sub(r", f16\)$", ")", label)


def gather_gpu(a) -> int:
    """gpu_decode.json from the committed H200 results; every number names its file."""
    layer, engine = [], []
    f = H200 / KV_RUN / "k_bench_kv_quant_residual.json"
    for r in json.loads(f.read_text()):
        if r["shape"] == "llama8b_d128":
            ctx = int(r["name"].rsplit("_", 1)[1])
            layer.append(dict(engine="metalkv", kv=r["format"], context=ctx, us=r["us"], source=_rel(f)))
    f = H200 / TORCH_RUN / "b_bench_kernels.json"
    d = json.loads(f.read_text())
    for p in d["torch_peers"]:
        if p["key"][0] != "attn" or len(p["key"]) != 6:
            continue
        _, dim, heads, kv_heads, ctx, queries = p["key"]
        if (dim, heads, kv_heads, queries) == (128, 32, 8, 1):
            for x in p["results"]:
                if x["peer"] in ("torch.sdpa[cudnn]", "torch.sdpa[flash]"):
                    layer.append(dict(engine=x["peer"], kv="f16", context=ctx, us=x["us"], source=_rel(f),
                                      torch=d["torch"]))
    for r in d["merged"]:  # metalkv's f16 kernel in the same run as torch: the runs' agreement
        m = re.fullmatch(r"attn_decode_d128_h32_kv8_ctx(\d+)_auto_paged", r["name"])
        if m:
            layer.append(dict(engine="metalkv (torch's run)", kv="f16", context=int(m[1]), us=r["us"], source=_rel(f)))
    for name, label in ENGINE_FORMATS:
        f = H200 / KV_RUN / f"k_bench_context_kv_{name}.json"
        d = json.loads(f.read_text())
        e = d["engines"][0]
        engine.append(dict(engine="metalkv", kv=label, context=d["context"], decode_tok_s=e["decode_tok_s"],
                           source=_rel(f)))
    for run in ("h200-2026-12-01-issue12c/c_bench_context_f16.json", "h200-2026-12-01-issue13/a_bench_context_f16.json"):
        f = H200 / run
        d = json.loads(f.read_text())
        for e in d["engines"]:
            engine.append(dict(engine=_engine_name(e["engine"]),
                               kv="f16", context=d["context"], decode_tok_s=e["decode_tok_s"], source=_rel(f),
                               torch=d.get("torch")))
    for pattern in getattr(a, "engine_json", None) or []:  # more runs of engine.py: <anything>_<kv>.json
        for f in sorted(ROOT.glob(pattern)):
            d = json.loads(f.read_text())
            for e in d["engines"]:
                engine.append(dict(engine=_engine_name(e["engine"]), kv=f.stem.rsplit("_", 1)[1], context=d["context"],
                                   decode_tok_s=e["decode_tok_s"], source=_rel(f.resolve()), torch=d.get("torch")))
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    shape = "Llama-3-8B shape (D 128, 32 query / 8 KV heads, 32 layers), random f16 weights"
    result = dict(device="NVIDIA H200 (141 GB), CUDA device of metalkv", model=shape,
                  command=" ".join(["python"] + sys.argv), gathered=time.strftime("%Y-%m-%d"),
                  layer_note="one attention layer's decode call (1 query token), microseconds; "
                             "metalkv-bench --filter kv_quant --device cuda and bench/gpu/kernels.py",
                  engine_note="bench/gpu/engine.py --context C --prompt 64 --new-tokens 64: C positions of random "
                              "K/V cached, then decode", layer=layer, engine=engine)
    (out / "gpu_decode.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {out / 'gpu_decode.json'} ({len(layer)} layer rows, {len(engine)} engine rows)")
    return 0


# ---- the pictures ----------------------------------------------------------------------
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_ppl(path: pathlib.Path) -> pathlib.Path:
    plt = _pyplot()
    d = json.loads(path.read_text())
    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=100)
    fmt = [r for r in d["rows"] if r.get("group") == "formats" and not r["label"].startswith("f16")]
    pol = [r for r in d["rows"] if r.get("group") == "policies" and not r["label"].startswith("f16")]
    f16 = next(r for r in d["rows"] if r["label"].startswith("f16"))
    ax.scatter([f16["bytes_per_token"]], [0], marker="o", color="k", label="metalkv f16")
    for rows, rotated, color, marker, label in ((fmt, False, "C0", "o", "metalkv KV formats"),
                                                (fmt, True, "C2", "o", "metalkv KV formats, Hadamard-rotated")):
        pts = [r for r in rows if r["kv"]["kv_rotate"] == rotated]
        ax.scatter([r["bytes_per_token"] for r in pts], [100 * r["ppl_change"] for r in pts], marker=marker,
                   color=color, label=label)
        for r in pts:  # the leftmost labels go left, clear of the policies' labels
            left = r["bytes_per_token"] < 5000
            ax.annotate(r["label"].replace(" rot", ""), (r["bytes_per_token"], 100 * r["ppl_change"]), fontsize=7,
                        xytext=(-4 if left else 4, 2), textcoords="offset points", ha="right" if left else "left")
    n = d["tokens"]
    ax.scatter([r["held_bytes"] / n for r in pol], [100 * r["ppl_change"] for r in pol], marker="^", color="C3",
               label=f"metalkv eviction policies, f16, budget {int(SHARE * n)} of {n} tokens (x: bytes held / {n})")
    nudge = {"streaming": -4, "snapkv": -6}  # points whose labels would touch a neighbour's
    for r in pol:
        name = r["label"].split()[0]
        ax.annotate(name, (r["held_bytes"] / n, 100 * r["ppl_change"]), fontsize=7, color="C3",
                    xytext=(-5, nudge.get(name, 0)), textcoords="offset points", ha="right")
    peer = d.get("llamacpp", {}).get("rows", [])
    if peer:
        pts = [r for r in peer if r["ppl_change"] is not None]
        ax.scatter([r["bytes_per_token"] for r in pts], [100 * r["ppl_change"] for r in pts], marker="s",
                   facecolors="none", edgecolors="C1", label="llama.cpp cache types (vs its f16; K rotated)")
        for r in pts:
            ax.annotate(r["label"].replace("llama.cpp ", ""), (r["bytes_per_token"], 100 * r["ppl_change"]),
                        fontsize=7, color="C1", xytext=(4, -9), textcoords="offset points")
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_yscale("symlog", linthresh=1)  # linear within +-1 %, logarithmic above: the close rows stay apart
    ax.set_yticks([0, 0.5, 1, 2, 5, 10, 20], ["0", "0.5", "1", "2", "5", "10", "20"])
    ax.set_ylim(-0.3, 25)
    ax.set_xlim(1000, 24500)
    ax.set_xlabel("KV bytes per token (all layers, K + V)")
    ax.set_ylabel("perplexity change vs the f16 cache (%, log above 1)")
    ax.set_title(f"Decode-time perplexity, SmolLM2-135M-Instruct Q4_1, {n} tokens of Pride and Prejudice, "
                 f"chunks of {d['chunk']}\n(metalkv {d['date']}; llama.cpp {peer[0]['version'] if peer else '-'} "
                 f"from {d['llamacpp']['source'] if peer else 'none'}, same ids and chunks)", fontsize=8)
    ax.legend(fontsize=7, loc="upper right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    png = path.with_suffix(".png")
    fig.savefig(png)
    return png


def plot_gpu(path: pathlib.Path) -> pathlib.Path:
    plt = _pyplot()
    d = json.loads(path.read_text())
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4.4), dpi=100, gridspec_kw=dict(width_ratios=[3, 2]))
    styles = {("metalkv", "f16"): ("C0", "o", "-"), ("metalkv", "q8"): ("C2", "o", "-"),
              ("metalkv", "q4"): ("C4", "o", "-"), ("metalkv", "q4_r128"): ("C4", "o", ":"),
              ("metalkv", "q2_r128"): ("C5", "o", ":"), ("metalkv (torch's run)", "f16"): ("k", "x", "none"),
              ("torch.sdpa[cudnn]", "f16"): ("C3", "s", "--"), ("torch.sdpa[flash]", "f16"): ("C1", "s", "--")}
    layers = 32
    for (engine, kv), (color, marker, ls) in styles.items():
        pts = sorted((r["context"], r["us"]) for r in d["layer"] if (r["engine"], r["kv"]) == (engine, kv))
        if pts:
            ax.plot([c for c, _ in pts], [1e6 / (layers * us) for _, us in pts], color=color, marker=marker,
                    linestyle=ls, label=f"{engine} {kv}" if engine.startswith("metalkv") else engine)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ctxs = sorted({r["context"] for r in d["layer"]})
    ax.set_xticks(ctxs, [f"{c // 1024}k" for c in ctxs])
    ax.set_xlabel("context (cached tokens)")
    ax.set_ylabel(f"tokens/s if decode were attention alone\n(1 / ({layers} x one layer's decode call))")
    ax.set_title("Attention decode, one Llama-3-8B layer x 32 (kernel timings)", fontsize=8)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    rows = d["engine"]
    if len({r["context"] for r in rows}) > 1:  # runs at several contexts: a line per engine and format
        for key in dict.fromkeys((r["engine"], r["kv"]) for r in rows):
            pts = sorted((r["context"], r["decode_tok_s"]) for r in rows if (r["engine"], r["kv"]) == key)
            bx.plot([c for c, _ in pts], [t for _, t in pts], marker="o", label=" ".join(key))
        bx.set_xscale("log", base=2)
        bx.set_xlabel("context (cached tokens)")
        bx.set_ylabel("decode tokens/s (whole model)")
        bx.set_title("Whole engine", fontsize=8)
        bx.legend(fontsize=6)
        bx.grid(alpha=0.3)
        fig.suptitle(f"{d['device']}, {d['model']}\ncommitted runs, each number's file in gpu_decode.json", fontsize=8)
        fig.tight_layout()
        png = path.with_suffix(".png")
        fig.savefig(png)
        return png
    labels = [f"{r['engine']} {r['kv']}".replace(" (", "\n(") for r in rows]
    colors = ["C3" if r["engine"].startswith("transformers") else "C0" for r in rows]
    bx.barh(range(len(rows)), [r["decode_tok_s"] for r in rows], color=colors)
    bx.set_yticks(range(len(rows)), [f"{l}\n({r['source'].split('/')[-2][5:]})" for l, r in zip(labels, rows)],
                  fontsize=6)
    bx.invert_yaxis()
    bx.set_xlabel("decode tokens/s (whole model)")
    bx.set_title(f"Whole engine at {rows[0]['context']:,} cached tokens", fontsize=8)
    fig.suptitle(f"{d['device']}, {d['model']}\ncommitted runs, each number's file in gpu_decode.json", fontsize=8)
    fig.tight_layout()
    png = path.with_suffix(".png")
    fig.savefig(png)
    return png


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("ppl", help="measure the perplexity rows (host executor)")
    m.add_argument("--tokens", type=int, default=1024)
    m.add_argument("--chunk", type=int, default=16)
    m.add_argument("--groups", nargs="+", default=["formats", "policies"], choices=["formats", "policies"])
    m.add_argument("--out", default=str(PPL_DIR))
    m.add_argument("--llamacpp", default=str(LLAMACPP), help="kv_quant.json with llama.cpp's rows ('' for none)")
    g = sub.add_parser("gpu", help="gather the committed H200 numbers into gpu_decode.json")
    g.add_argument("--out", default=str(GPU_DIR))
    g.add_argument("--engine-json", nargs="*", default=[], metavar="GLOB",
                   help="more bench/gpu/engine.py JSON files (globs from the repository root), named <any>_<kv>.json")
    d = sub.add_parser("plot", help="draw the PNGs beside their JSON")
    d.add_argument("--ppl", default=str(PPL_DIR / "ppl.json"))
    d.add_argument("--gpu", default=str(GPU_DIR / "gpu_decode.json"))
    a = p.parse_args()
    if a.cmd == "ppl":
        return measure_ppl(a)
    if a.cmd == "gpu":
        return gather_gpu(a)
    for path, draw in ((a.ppl, plot_ppl), (a.gpu, plot_gpu)):
        if path and pathlib.Path(path).exists():
            print(f"plot: {draw(pathlib.Path(path))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
