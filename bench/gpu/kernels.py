#!/usr/bin/env python3
"""metalkv's kernels on a GPU against torch on the same shapes, and a copy ceiling.

    python bench/gpu/kernels.py [--bench PATH] [--quick] [--json FILE]
    python bench/gpu/kernels.py --device host          # local smoke test: host executor, torch on the CPU

1. Runs `metalkv-bench --device cuda --filter gpu_kernels_<group> --json ...` for the
   decode, prefill and linear groups (one process each, each with its own timeout).
2. Measures the copy ceiling: a device-to-device torch copy_ of 2 GiB (bytes read +
   written), the best of a CUDA graph and plain stream launches.
3. Times torch on the shapes the bench reported: scaled_dot_product_attention (f16,
   enable_gqa=True) on each backend torch has here (cuDNN, flash, efficient, math and
   torch's default pick), torch.mv / torch.matmul in f16 and f32. Inputs rotate over
   sets spanning 256 MB like metalkv-bench's; times are medians of CUDA-graph replays.
4. Prints one merged table last; --json FILE holds everything.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import copy_ceiling, device_name, log, rotation_sets, table, time_calls  # noqa: E402

GROUPS = ("decode", "prefill", "linear")
REPO = Path(__file__).resolve().parents[2]


def find_bench(path: str | None) -> str:
    """--bench, else $METALKV_BENCH, metalkv-bench on PATH, the newest build/*/metalkv-bench:
    the first that has the gpu_kernels groups (an installed copy can be older than the build)."""
    if path:
        return path
    candidates = [os.environ.get("METALKV_BENCH"), shutil.which("metalkv-bench")]
    candidates += sorted(map(str, REPO.glob("build/*/metalkv-bench")), key=os.path.getmtime, reverse=True)
    tried = []
    for c in filter(None, candidates):
        try:
            listing = subprocess.run([c, "--list"], capture_output=True, text=True, timeout=60).stdout
        except OSError:
            continue
        if "gpu_kernels_decode" in listing:
            return c
        tried.append(c)
    sys.exit("kernels.py: no metalkv-bench with the gpu_kernels groups found"
             + (f" (too old: {', '.join(tried)})" if tried else "") + "; build metalkv or pass --bench PATH")


def run_bench(bench: str, device: str, quick: bool, repeat: int | None, timeout: int, notes: list) -> list[dict]:
    """Rows of every group that finished; a group that failed or timed out leaves a note."""
    env = dict(os.environ)
    env["METALKV_CUDA_GRAPHS"] = "0"  # graphs would add their capture to (t(2R) - t(R)) / R
    rows = []
    for group in GROUPS:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            out = f.name
        cmd = [bench, "--device", device, "--filter", f"gpu_kernels_{group}", "--json", out]
        if quick:
            cmd.append("--quick")
        if repeat:
            cmd += ["--repeat", str(repeat)]
        log("$ " + " ".join(cmd))
        t0 = time.perf_counter()
        try:  # the bench's table and progress go to stderr; stdout stays for the final table
            rc = subprocess.run(cmd, env=env, stdout=sys.stderr, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            notes.append(f"metalkv-bench gpu_kernels_{group}: timed out after {timeout} s (--timeout)")
            rc = None
        log(f"gpu_kernels_{group}: {time.perf_counter() - t0:.1f} s, rc {rc}")
        try:
            got = json.loads(Path(out).read_text() or "[]")
        except (OSError, json.JSONDecodeError):
            got = []
        os.unlink(out)
        if rc not in (0, None) and not got:
            notes.append(f"metalkv-bench gpu_kernels_{group}: exit status {rc}, no results")
        rows += got
    for r in rows:
        if str(r.get("note", "")).startswith("failed"):
            notes.append(f"metalkv: {r['note']} @ {r['name']}")
    return rows


# ---- torch peers -------------------------------------------------------------------
def sdpa_backends():
    from torch.nn.attention import SDPBackend

    names = [("cudnn", "CUDNN_ATTENTION"), ("flash", "FLASH_ATTENTION"), ("efficient", "EFFICIENT_ATTENTION"),
             ("math", "MATH")]
    return [(n, getattr(SDPBackend, a)) for n, a in names if hasattr(SDPBackend, a)] + [("default", None)]


def sdpa_call(q, k, v, backend, mask=None):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    def f():
        if backend is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

    return f


def first_line(e: Exception) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:160]}"


def attention_peers(dev: str, shape: dict, ceiling: float, notes: list) -> list[dict]:
    """shape: head_dim, n_q_heads, n_kv_heads, context, n_queries (1 = decode)."""
    import torch

    D, nq, nkv, n, m = (int(shape[k]) for k in ("head_dim", "n_q_heads", "n_kv_heads", "context", "n_queries"))
    kv_bytes = 2 * n * nkv * D * 2
    set_bytes = kv_bytes + 2 * m * nq * D * 2
    sets = rotation_sets(set_bytes)
    # Our cache layout, (2, slots, n_kv_heads, D), viewed as torch's (batch, heads, seq, D).
    kvs = [torch.empty(2, n, nkv, D, dtype=torch.float16, device=dev).uniform_(-1, 1) for _ in range(sets)]
    ks = [kv[0].unsqueeze(0).transpose(1, 2) for kv in kvs]
    vs = [kv[1].unsqueeze(0).transpose(1, 2) for kv in kvs]
    qs = [torch.randn(1, nq, m, D, dtype=torch.float16, device=dev) for _ in range(sets)]
    masks = [(None, None)]
    if m > 1:  # the queries are the last m positions: causal aligned to the bottom right
        masks = []
        try:
            from torch.nn.attention.bias import causal_lower_right
            masks.append(("causal_lower_right", causal_lower_right(m, n)))
        except ImportError:
            pass
        masks.append(("bool tensor", torch.ones(m, n, dtype=torch.bool, device=dev).tril(n - m)))
    key_visits = m * (n - m) + m * (m + 1) / 2
    flops = 4.0 * nq * D * key_visits
    out = []
    for name, backend in sdpa_backends():
        if name == "math" and m > 1 and n > 8192:
            continue  # materializes (heads, m, n) scores: slow, and far from the others
        rec, errors = None, []
        for mask_name, mask in masks:
            try:
                calls = [sdpa_call(qs[i], ks[i], vs[i], backend, mask) for i in range(sets)]
                r = time_calls(calls, dev)
                rec = dict(peer=f"torch.sdpa[{name}]", us=r["us"], min_us=r["min_us"], how=r["how"], mask=mask_name)
                break
            except Exception as e:  # this backend does not take these inputs here
                errors.append(first_line(e))
        if rec is None:
            notes.append(f"torch.sdpa[{name}] unavailable ({'; '.join(dict.fromkeys(errors))}) "
                         f"@ D{D} {nq}/{nkv} ctx {n} q {m}")
            continue
        nbytes = set_bytes
        rec.update(GB_per_s=nbytes / (rec["us"] * 1e-6) / 1e9, bytes_MB=nbytes / 1e6)
        rec["pct_ceiling"] = 100 * rec["GB_per_s"] / ceiling
        if m > 1:
            rec["TFLOP_per_s"] = flops / (rec["us"] * 1e-6) / 1e12
        out.append(rec)
        log(f"  torch.sdpa[{name}] D{D} {nq}/{nkv} ctx {n} q {m}: {rec['us']:.1f} us ({rec['how']})")
    del kvs, ks, vs, qs
    if dev == "cuda":
        torch.cuda.empty_cache()
    return out


def linear_peers(dev: str, dtype: str, n_out: int, n_in: int, T: int, ceiling: float, notes: list) -> list[dict]:
    import torch

    td = {"f16": torch.float16, "f32": torch.float32}[dtype]
    es = 2 if dtype == "f16" else 4
    nbytes = n_out * n_in * es + T * (n_in + n_out) * es
    sets = rotation_sets(nbytes)
    ws = [torch.empty(n_out, n_in, dtype=td, device=dev).uniform_(-1, 1) for _ in range(sets)]
    xs = [torch.empty(T, n_in, dtype=td, device=dev).uniform_(-1, 1) for _ in range(sets)]
    ways = [("torch.matmul", lambda i: (lambda: torch.matmul(xs[i], ws[i].t())))]
    if T == 1:
        ways.insert(0, ("torch.mv", lambda i: (lambda: torch.mv(ws[i], xs[i][0]))))
    out = []
    for name, mk in ways:
        try:
            r = time_calls([mk(i) for i in range(sets)], dev)
        except Exception as e:
            notes.append(f"{name} {dtype} {n_out}x{n_in} t{T}: failed ({first_line(e)})")
            continue
        gbps = nbytes / (r["us"] * 1e-6) / 1e9
        out.append(dict(peer=f"{name}[{dtype}]", us=r["us"], min_us=r["min_us"], how=r["how"], GB_per_s=gbps,
                        bytes_MB=nbytes / 1e6, pct_ceiling=100 * gbps / ceiling,
                        TFLOP_per_s=2.0 * T * n_out * n_in / (r["us"] * 1e-6) / 1e12))
        log(f"  {name}[{dtype}] {n_out}x{n_in} t{T}: {r['us']:.1f} us ({r['how']})")
    del ws, xs
    if dev == "cuda":
        torch.cuda.empty_cache()
    return out


def peer_key(row: dict):
    """What a metalkv row is compared with: the same problem, whatever kernel or split mode."""
    op = row.get("op")
    if op in ("attn_decode", "attn_prefill"):
        return ("attn", int(row["head_dim"]), int(row["n_q_heads"]), int(row["n_kv_heads"]), int(row["context"]),
                int(row.get("n_queries", 1)))
    if op in ("gemv", "gemm"):
        dense = row["dtype"] if row["dtype"] in ("f16", "f32") else "f16"  # torch has no GGUF kernels
        return ("linear", dense, int(row["n_out"]), int(row["n_in"]), int(row["n_tokens"]))
    return None


def run_peers(rows: list[dict], dev: str, ceiling: float, notes: list) -> dict:
    keys = []
    for r in rows:
        k = peer_key(r)
        if k is not None and k not in keys:
            keys.append(k)
    peers = {}
    for k in keys:
        try:
            if k[0] == "attn":
                shape = dict(zip(("head_dim", "n_q_heads", "n_kv_heads", "context", "n_queries"), k[1:]))
                peers[k] = attention_peers(dev, shape, ceiling, notes)
            else:
                peers[k] = linear_peers(dev, *k[1:], ceiling, notes)
        except Exception as e:  # e.g. out of memory: note it, go on
            notes.append(f"peers for {k}: {first_line(e)}")
            peers[k] = []
    return peers


# ---- merge and print -----------------------------------------------------------------
def shape_text(r: dict) -> str:
    if r.get("op") in ("attn_decode", "attn_prefill"):
        s = f"D{int(r['head_dim'])} {int(r['n_q_heads'])}/{int(r['n_kv_heads'])} ctx {int(r['context'])}"
        return s + (f" q{int(r['n_queries'])}" if r.get("op") == "attn_prefill" else f" c{int(r['chunks'])}")
    if r.get("op") in ("gemv", "gemm"):
        return f"{int(r['n_out'])}x{int(r['n_in'])} t{int(r['n_tokens'])}"
    return ""


def merge(rows: list[dict], peers: dict, ceiling: float) -> list[dict]:
    merged = []
    for r in rows:
        if "us" not in r or r.get("op") in (None, "failed", "floor"):
            continue
        k = peer_key(r)
        best = min(peers.get(k, []), key=lambda p: p["us"], default=None)
        merged.append(dict(
            name=r["name"], kernel=r.get("kernel", ""), shape=shape_text(r), us=r["us"], GB_per_s=r["GB_per_s"],
            pct_ceiling=100 * r["GB_per_s"] / ceiling if ceiling else None, TFLOP_per_s=r.get("TFLOP_per_s"),
            peer=best["peer"] if best else None, peer_us=best["us"] if best else None,
            peer_pct_ceiling=best["pct_ceiling"] if best else None,
            ratio=r["us"] / best["us"] if best else None))
    return merged


def short_notes(notes: list[str]) -> list[str]:
    """The same message for many shapes once, with a count ("... @ shape" marks the shape)."""
    seen: dict[str, list[str]] = {}
    for n in notes:
        msg, _, where = n.partition(" @ ")
        seen.setdefault(msg, []).append(where)
    return [m + (f" ({len(w)} shapes, e.g. {w[0]})" if len(w) > 1 else f" ({w[0]})" if w[0] else "")
            for m, w in seen.items()]


def summary(merged: list[dict]) -> list[dict]:
    """The rows to read first: Llama-3-8B's attention (D128, 32/8) at 4k/32k/128k (single
    pass, the automatic choice, the same through a shuffled block table, the best split
    of the sweep), its prefill, and every
    weight format at the FFN shape (14336x4096) for 1 and 512 tokens."""
    out = []
    for ctx in (4096, 32768, 131072):
        pre = f"attn_decode_d128_h32_kv8_ctx{ctx}_"
        rows = [m for m in merged if m["name"].startswith(pre)]
        out += [m for m in rows if m["name"] in (pre + "single", pre + "auto", pre + "auto_paged")]
        sweep = [m for m in rows if m["name"].startswith(pre + "split")]
        if sweep:
            out.append(min(sweep, key=lambda m: m["us"]))
    out += [m for m in merged if m["name"].startswith("attn_prefill_d128_h32_kv8_")]
    out += [m for m in merged if m["name"].startswith("gemv_") and m["name"].endswith("_14336x4096")]
    out += [m for m in merged if m["name"].startswith("gemm_") and m["name"].endswith("_14336x4096_t512")]
    return out


def targets(merged: list[dict], peers: dict) -> list[list]:
    """Issue 12's targets, each with the measured value and whether it is met: decode
    attention (D128, 32/8, the automatic choice) >= 85 % of the ceiling at 32k and 128k
    and faster than torch's cuDNN SDPA at 4k; f16 gemv >= 85 % at 4096x4096 and
    14336x4096 (f32, bf16 alike); quantized gemv >= 75 % at those shapes."""
    by_name = {m["name"]: m for m in merged}
    rows = []
    for ctx in (32768, 131072):
        m = by_name.get(f"attn_decode_d128_h32_kv8_ctx{ctx}_auto")
        if m and m["pct_ceiling"] is not None:
            rows.append([m["name"], ">= 85 % ceiling", f"{m['pct_ceiling']:.1f} %", m["pct_ceiling"] >= 85])
    m = by_name.get("attn_decode_d128_h32_kv8_ctx4096_auto")
    if m:
        cudnn = [p["us"] for p in peers.get(("attn", 128, 32, 8, 4096, 1), []) if p["peer"] == "torch.sdpa[cudnn]"]
        if cudnn:
            rows.append([m["name"], f"< cuDNN {min(cudnn):.1f} us", f"{m['us']:.1f} us", m["us"] < min(cudnn)])
    for m in merged:
        if m["name"].startswith("gemv_") and m["name"].rsplit("_", 1)[-1] in ("4096x4096", "14336x4096"):
            want = 85 if m["name"].split("_")[1] in ("f16", "bf16", "f32") else 75  # dense: like f16
            if m["pct_ceiling"] is not None:
                rows.append([m["name"], f">= {want} % ceiling", f"{m['pct_ceiling']:.1f} %", m["pct_ceiling"] >= want])
    return rows


HEADERS = ["case", "shape", "metalkv us", "GB/s", "% ceiling", "TFLOP/s", "best torch peer", "peer us",
           "peer % ceiling", "ratio"]


def table_rows(merged: list[dict]) -> list[list]:
    return [[m["name"], m["shape"], m["us"], m["GB_per_s"], m["pct_ceiling"], m["TFLOP_per_s"], m["peer"],
             m["peer_us"], m["peer_pct_ceiling"], m["ratio"]] for m in merged]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", help="metalkv-bench binary (default: on PATH, else build/*/metalkv-bench)")
    ap.add_argument("--device", default="cuda", help="metalkv device: cuda (default) or host (a local smoke test)")
    ap.add_argument("--quick", action="store_true", help="the bench's --quick grid (D=128 32/8 at 4k/32k/128k, ...)")
    ap.add_argument("--repeat", type=int, help="metalkv-bench --repeat (command buffers of R and 2R per row)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per metalkv-bench group (default 300)")
    ap.add_argument("--from-json", help="reuse the 'metalkv' rows of an earlier --json instead of running the bench")
    ap.add_argument("--no-peers", action="store_true", help="skip the torch peers")
    ap.add_argument("--json", help="write everything here")
    a = ap.parse_args(argv)
    t_start = time.perf_counter()
    notes: list[str] = []
    if a.from_json:
        rows = json.loads(Path(a.from_json).read_text())["metalkv"]
    else:
        rows = run_bench(find_bench(a.bench), a.device, a.quick, a.repeat, a.timeout, notes)

    import torch

    dev = "cuda" if a.device != "host" else "cpu"
    if dev == "cuda" and not torch.cuda.is_available():
        sys.exit("kernels.py: torch sees no CUDA GPU; --device host runs the local smoke test")
    torch.manual_seed(0)
    log(f"torch {torch.__version__} on {device_name(dev)}")
    ceiling = copy_ceiling(dev)
    peers = {} if a.no_peers else run_peers(rows, dev, ceiling["GBps"], notes)
    merged = merge(rows, peers, ceiling["GBps"])
    floor = next((r for r in rows if r.get("op") == "floor" and "us" in r), None)

    if a.json:
        Path(a.json).write_text(json.dumps(dict(
            device=device_name(dev), torch=torch.__version__, metalkv_device=a.device, ceiling=ceiling,
            dispatch_floor_us=floor["us"] if floor else None, metalkv=rows,
            torch_peers=[dict(key=list(k), results=v) for k, v in peers.items()], merged=merged, notes=notes,
            seconds=time.perf_counter() - t_start), indent=1))
    log(f"kernels.py: {time.perf_counter() - t_start:.0f} s")
    print(f"\n## metalkv kernels vs torch on {device_name(dev)} (torch {torch.__version__})\n")
    floor_text = f"metalkv dispatch floor {floor['us']:.1f} us per call" if floor else "no dispatch floor row"
    print(f"copy ceiling {ceiling['GBps']:.0f} GB/s (device-to-device copy, read + write); {floor_text}")
    print("GB/s = bytes a call must move (K/V or weights once, plus activations) / time. "
          "Quantized rows are compared with torch's f16 on the same shape (torch has no GGUF kernels); "
          "ratio = metalkv us / peer us.\n")
    for n in short_notes(notes):
        print(f"note: {n}")
    print("\n### every case\n")
    print(table(HEADERS, table_rows(merged)))
    key = summary(merged)
    if key:
        print("\n### summary: Llama-3-8B attention (D128, 32/8), prefill, and the FFN shape in every format\n")
        print(table(HEADERS, table_rows(key)))
    goals = targets(merged, peers)
    if goals:
        print("\n### issue 12 targets (bench/gpu/kernels.py targets())\n")
        print(table(["case", "target", "measured", "met"], goals))
    return 0 if merged else 1


if __name__ == "__main__":
    sys.exit(main())
