"""OpenAI-compatible servers under concurrent clients: throughput and latency percentiles.

    python bench/server.py [--servers metalkv,llama-cpp-python] [--concurrency 1 8 32]
                           [--requests 2] [--max-tokens 32] [--model GGUF] [--device host]
                           [--threads 2] [--json out.json]

Each server is started as its users start it (`metalkv serve`, `python -m
llama_cpp.server`) on the same model file, warmed up with one request, then driven
by N concurrent clients for each N of --concurrency, each client making --requests
streamed /v1/completions requests one after another (greedy, max_tokens tokens,
a distinct prompt per request: a stretch of bench/compare.py's passage, so no
reply is a cached copy of another). Measured at the client, from the server-sent events:
  TTFT   request sent -> first piece of text;
  ITL    gaps between later pieces (a piece is a token, or a few when a server holds
         back text that may start a stop string or an incomplete character);
  tok/s  every reply's completion tokens (the usage the server reports, else its
         pieces) over the wall time of the whole level;
  done   replies that ended by their length or the model's stop, of those requested.
Both servers run in one invocation on one machine, one at a time. Installed packages
only; a server that is not installed is reported as such.

On a GPU machine without the default model (our H200: no network), --random-llama 8b
serves a random-weight Llama-3-8B shape built there with transformers, its vocabulary
the default model's tokenizer (--tokenizer, a tokenizer.json: `python bench/server.py
--export-tokenizer tok.json` writes it here), so replies are text:

    python bench/server.py --servers metalkv --device cuda --random-llama 8b --tokenizer tok.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time

import httpx

SERVERS = ("metalkv", "llama-cpp-python")
PASSAGE = ("The old lighthouse stood at the end of the rocky point, where the river met the sea. For more than a "
           "century its keepers had climbed the spiral stairs each evening to light the lamp, polish the great lens "
           "and write the weather in a leather-bound log. The last keeper, a quiet woman named Ada, had kept the "
           "light for thirty years. She knew every ship that passed by the sound of its engine, and every storm by "
           "the colour of the sky an hour before it arrived.").split()


def prompt(i: int, words: int = 40) -> str:
    """Request i's prompt: `words` words of the passage from a point of its own."""
    start = (i * 7) % len(PASSAGE)
    return " ".join((PASSAGE * 3)[start:start + words])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(server: str, args, port: int) -> list[str] | None:
    if server == "metalkv":
        return [sys.executable, "-m", "metalkv.cli", "serve", "--model", args.model, "--device", args.device,
                "--port", str(port), "--context", str(args.context), "--model-name", "bench", "--max-seqs",
                str(max(args.concurrency))]
    try:
        import llama_cpp.server  # noqa: F401
    except ImportError:
        return None
    return [sys.executable, "-m", "llama_cpp.server", "--model", args.model, "--port", str(port), "--n_ctx",
            str(args.context), "--n_threads", str(args.threads), "--n_threads_batch", str(args.threads),
            "--model_alias", "bench",
            "--interrupt_requests", "False"]  # its default cuts a running reply short when another request comes


class Started:
    def __init__(self, cmd: list[str]):
        self.port = int(cmd[cmd.index("--port") + 1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(os.devnull, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, METALKV_NO_PROGRESS="1"))
        deadline = time.monotonic() + 600
        while True:
            try:
                if httpx.get(f"{self.url}/v1/models", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{cmd[2]} did not start (exit {self.proc.poll()})")
            time.sleep(0.5)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


async def one_request(client: httpx.AsyncClient, url: str, i: int, max_tokens: int) -> dict:
    body = {"model": "bench", "prompt": prompt(i), "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    arrivals, tokens, finish = [], None, None
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                arrivals.append(time.perf_counter())
            if chunk.get("choices") and chunk["choices"][0].get("finish_reason"):
                finish = chunk["choices"][0]["finish_reason"]
    if not arrivals:
        raise RuntimeError(f"request {i}: no text came back")
    return {"ttft": arrivals[0] - t0, "gaps": [b - a for a, b in zip(arrivals, arrivals[1:])],
            "tokens": tokens if tokens is not None else len(arrivals), "finish": finish}


async def level(url: str, clients: int, requests: int, max_tokens: int, first: int) -> dict:
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(900), limits=limits) as client:
        async def one_client(c: int) -> list[dict]:
            return [await one_request(client, url, first + c * requests + k, max_tokens) for k in range(requests)]

        t0 = time.perf_counter()
        done = await asyncio.gather(*(one_client(c) for c in range(clients)))
        wall = time.perf_counter() - t0
    replies = [r for per in done for r in per]
    ttft = sorted(r["ttft"] for r in replies)
    gaps = sorted(g for r in replies for g in r["gaps"])
    tokens = sum(r["tokens"] for r in replies)

    def pct(xs: list[float], p: float) -> float:
        return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")

    # complete: ended by its length or the model's own stop (a reply cut short by the server is not)
    complete = sum(r["finish"] in ("length", "stop") for r in replies)
    return {"clients": clients, "requests": len(replies), "complete": complete, "tokens": tokens, "wall_s": wall,
            "tok_s": tokens / wall, "req_s": len(replies) / wall,
            "ttft_p50": pct(ttft, 50), "ttft_p90": pct(ttft, 90), "ttft_p99": pct(ttft, 99),
            "itl_p50": pct(gaps, 50), "itl_p90": pct(gaps, 90), "itl_p99": pct(gaps, 99),
            "itl_mean": statistics.fmean(gaps) if gaps else float("nan")}


def table(rows: list[dict]) -> str:
    head = (f"{'server':<18} {'clients':>7} {'done':>7} {'tok/s':>8} {'TTFT p50':>9} {'p90':>7} {'p99':>7} "
            f"{'ITL p50':>8} {'p90':>7} {'p99':>7}  (seconds)")
    lines = [head, "-" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['server']:<18} {r.get('clients', ''):>7} {r['error']}")
            continue
        done = f"{r['complete']}/{r['requests']}"
        lines.append(f"{r['server']:<18} {r['clients']:>7} {done:>7} {r['tok_s']:>8.1f} "
                     f"{r['ttft_p50']:>9.3f} {r['ttft_p90']:>7.3f} {r['ttft_p99']:>7.3f} "
                     f"{r['itl_p50']:>8.3f} {r['itl_p90']:>7.3f} {r['itl_p99']:>7.3f}")
    return "\n".join(lines)


def random_model(shape: str, tokenizer_json: str, device: str) -> str:
    """bench/batching.py's random Llama with the tokenizer's vocabulary, tokenizer.json beside it."""
    import shutil

    import tokenizers

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from batching import random_llama  # bench/batching.py

    vocab = tokenizers.Tokenizer.from_file(tokenizer_json).get_vocab_size()
    path = random_llama(shape, device, vocab=vocab)
    shutil.copy(tokenizer_json, path / "tokenizer.json")
    return str(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", default=",".join(SERVERS), help="comma-separated, of " + ", ".join(SERVERS))
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--requests", type=int, default=2, help="requests per client, one after another")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--model", default=None, help="a GGUF (default: the default model's file)")
    ap.add_argument("--device", default="auto", help="metalkv's device (auto, host, cuda, metal)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="llama-cpp-python's threads")
    ap.add_argument("--json", default=None, help="write the rows here")
    ap.add_argument("--random-llama", choices=("8b", "1b"), default=None,
                    help="serve a random-weight Llama of this shape (built with transformers) instead of --model")
    ap.add_argument("--tokenizer", default=None, help="tokenizer.json for --random-llama")
    ap.add_argument("--export-tokenizer", default=None, metavar="JSON",
                    help="write the default model's tokenizer.json here and exit")
    args = ap.parse_args()
    if args.export_tokenizer:
        import metalkv

        metalkv.Engine.load(device="host", context=64, progress=False).tokenizer._tok.save(args.export_tokenizer)
        return 0
    if args.random_llama:
        if not args.tokenizer:
            ap.error("--random-llama needs --tokenizer")
        args.model = random_model(args.random_llama, args.tokenizer, args.device)
    if args.model is None:
        from metalkv.models import default_model_path

        args.model = str(default_model_path())
    print(f"# {' '.join(sys.argv)}\n# {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
          f"{time.strftime('%Y-%m-%d')}; model {os.path.basename(args.model)}; {args.max_tokens} tokens per reply, "
          f"{args.requests} requests per client", flush=True)
    rows = []
    for server in args.servers.split(","):
        cmd = command(server, args, free_port())
        if cmd is None:
            rows.append({"server": server, "error": "not installed"})
            continue
        started = Started(cmd)
        try:
            asyncio.run(level(started.url, 1, 1, 4, first=10_000))  # warm-up
            first = 0
            for clients in args.concurrency:
                row = asyncio.run(level(started.url, clients, args.requests, args.max_tokens, first))
                first += clients * args.requests
                rows.append(dict(row, server=server))
                print(table([rows[-1]]).splitlines()[-1], flush=True)
        except Exception as e:  # noqa: BLE001 - a server that fails is reported, the others still run
            rows.append({"server": server, "error": f"failed: {e!r}"})
        finally:
            started.stop()
    print()
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"argv": sys.argv, "date": time.strftime("%Y-%m-%d"), "machine": platform.node(),
                       "cores": os.cpu_count(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
