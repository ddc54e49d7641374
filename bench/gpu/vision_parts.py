#!/usr/bin/env python3
"""Where Gemma 3's vision tower spends its time: one layer's attention at SigLIP-so400m's
896 px shape (4,096 patches, 16 heads, head_dim 72 padded to 80, one bidirectional block over
the image, K and V f16 as the tower stores them), on metalkv's prefill attention beside
torch's SDPA in bf16 at head_dim 72, and the MLP's first gemm (4,096 x 1152 -> 4304, bf16
weights as in bench/gpu/vision.py) beside torch's bf16 matmul, in one run. metalkv runs each
with float operands and with 16-bit ones (the towers' operands_16bit: half Q and P, bf16
activations). Then the layer's four gemms (q/k/v, output, MLP up and down) with 16-bit
activations beside torch's bf16 matmul of the same shapes. Multiplied by the 27 layers it is the part of
bench/gpu/vision.py's encode time that each takes.

    python bench/gpu/vision_parts.py --json FILE      # tools/cuda_run.sh bench-vision-parts
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import device_name, median_seconds, report, table  # noqa: E402

HEADS, HEAD_DIM, STORED_DIM, LAYERS, HIDDEN, FFN = 16, 72, 80, 27, 1152, 4304


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--patches", type=int, default=4096, help="the image's patches (896 px: 4096; fewer for a look on the host)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    n = args.patches
    import torch

    import metalkv
    from metalkv import _core

    dev = metalkv.Device(args.device)
    rng = np.random.default_rng(0)
    q = rng.normal(size=(n, HEADS, STORED_DIM)).astype(np.float32)
    pool = rng.normal(size=(2, n, HEADS, STORED_DIM)).astype(np.float16)
    table_ids = np.arange(-(-n // 32), dtype=np.uint32)
    bufs = [dev.buffer_from(a) for a in (q, pool, table_ids)]
    out = dev.buffer(q.nbytes)

    def attention(half):
        _core.ops.attention_prefill(dev, *bufs, out, n_q_heads=HEADS, n_kv_heads=HEADS, head_dim=STORED_DIM,
                                    n_queries=n, q_pos0=0, slots=n, scale=HEAD_DIM ** -0.5, blocks=[(0, n)],
                                    half_operands=half)

    x_mlp = dev.buffer_from(rng.normal(size=(n, HIDDEN)).astype(np.float32))
    w32 = (rng.normal(size=(FFN, HIDDEN)) / HIDDEN ** 0.5).astype(np.float32)
    w_mlp = dev.buffer_from((w32.view(np.uint32) >> 16).astype(np.uint16))  # bf16 bits
    y_mlp = dev.buffer(n * FFN * 4)

    def gemm(half):
        _core.ops.matmul(dev, x_mlp, w_mlp, y_mlp, n_tokens=n, n_in=HIDDEN, n_out=FFN, wtype="bf16", kernel="gemm",
                         activations_16bit=half)

    # Each call waits for its work.
    t = {(part, half): median_seconds(lambda f=f, h=half: f(h), args.repeat, lambda: None)
         for part, f in (("attention", attention), ("gemm", gemm)) for half in (False, True)}
    torch_dev = "cuda" if args.device == "cuda" else "cpu"
    x = [torch.randn(1, HEADS, n, HEAD_DIM, device=torch_dev, dtype=torch.bfloat16) for _ in range(3)]
    sync = torch.cuda.synchronize if torch_dev == "cuda" else (lambda: None)
    t_sdpa = median_seconds(lambda: torch.nn.functional.scaled_dot_product_attention(*x), args.repeat, sync)
    a = torch.randn(n, HIDDEN, device=torch_dev, dtype=torch.bfloat16)
    b = torch.randn(HIDDEN, FFN, device=torch_dev, dtype=torch.bfloat16)
    t_mm = median_seconds(lambda: a @ b, args.repeat, sync)
    # The layer's four gemms with 16-bit activations (the tower's default) beside torch's bf16:
    # q/k/v (heads padded to 80), the output projection, the MLP's up and down.
    A = HEADS * STORED_DIM
    layer_gemms = {"qkv": (HIDDEN, 3 * A), "out": (A, HIDDEN), "up": (HIDDEN, FFN), "down": (FFN, HIDDEN)}
    t_layer, t_layer_torch = {}, {}
    for name, (n_in, n_out) in layer_gemms.items():
        xb = dev.buffer_from(rng.normal(size=(n, n_in)).astype(np.float32))
        wb = dev.buffer_from(np.zeros((n_out, n_in), np.uint16))  # bf16 zeros: the timing does not depend on values
        yb = dev.buffer(n * n_out * 4)
        t_layer[name] = median_seconds(lambda xb=xb, wb=wb, yb=yb, n_in=n_in, n_out=n_out: _core.ops.matmul(
            dev, xb, wb, yb, n_tokens=n, n_in=n_in, n_out=n_out, wtype="bf16", kernel="gemm",
            activations_16bit=True), args.repeat, lambda: None)
        at = torch.randn(n, n_in, device=torch_dev, dtype=torch.bfloat16)
        bt = torch.randn(n_in, n_out, device=torch_dev, dtype=torch.bfloat16)
        t_layer_torch[name] = median_seconds(lambda at=at, bt=bt: at @ bt, args.repeat, sync)
    attn_flops = 4 * n * n * HEAD_DIM * HEADS  # q·k and p·v, the true head_dim
    gemm_flops = 2 * n * HIDDEN * FFN
    result = {"device": device_name(args.device), "date": time.strftime("%Y-%m-%d"), "patches": n, "layers": LAYERS,
              "metalkv_attention_s": t["attention", False], "metalkv_attention_half_s": t["attention", True],
              "sdpa_bf16_s": t_sdpa, "metalkv_attention_tower_s": LAYERS * t["attention", False],
              "sdpa_tower_s": LAYERS * t_sdpa, "metalkv_tflops": attn_flops / t["attention", False] / 1e12,
              "metalkv_half_tflops": attn_flops / t["attention", True] / 1e12, "sdpa_tflops": attn_flops / t_sdpa / 1e12,
              "metalkv_gemm_s": t["gemm", False], "metalkv_gemm_half_s": t["gemm", True], "torch_matmul_bf16_s": t_mm,
              "metalkv_gemm_tflops": gemm_flops / t["gemm", False] / 1e12,
              "metalkv_gemm_half_tflops": gemm_flops / t["gemm", True] / 1e12,
              "torch_matmul_tflops": gemm_flops / t_mm / 1e12,
              "layer_gemms_16bit_s": t_layer, "layer_gemms_torch_bf16_s": t_layer_torch,
              "layer_gemms_16bit_tower_s": LAYERS * sum(t_layer.values()),
              "layer_gemms_torch_tower_s": LAYERS * sum(t_layer_torch.values())}

    def row(name, s, flops):
        return [name, f"{s:.5f}", f"{LAYERS * s:.4f}", f"{flops / s / 1e12:.1f}"]

    print(table(["one layer's part", "s", "x 27 layers", "TFLOP/s"],
                [row("attention: metalkv (f32 q, f16 K/V, d 80)", t["attention", False], attn_flops),
                 row("attention: metalkv, half q and p", t["attention", True], attn_flops),
                 row("attention: torch SDPA (bf16, d 72)", t_sdpa, attn_flops),
                 row("MLP up gemm: metalkv (f32 x, bf16 w)", t["gemm", False], gemm_flops),
                 row("MLP up gemm: metalkv, bf16 activations", t["gemm", True], gemm_flops),
                 row("MLP up gemm: torch (bf16)", t_mm, gemm_flops)]))
    flops = {k: 2 * n * a * b for k, (a, b) in layer_gemms.items()}
    print(table(["a layer's gemm (in -> out)", "metalkv 16-bit s", "TFLOP/s", "torch bf16 s", "TFLOP/s"],
                [[f"{k} ({a} -> {b})", f"{t_layer[k]:.5f}", f"{flops[k] / t_layer[k] / 1e12:.1f}",
                  f"{t_layer_torch[k]:.5f}", f"{flops[k] / t_layer_torch[k] / 1e12:.1f}"]
                 for k, (a, b) in layer_gemms.items()]
                + [["x 27 layers", f"{LAYERS * sum(t_layer.values()):.4f}", "",
                    f"{LAYERS * sum(t_layer_torch.values()):.4f}", ""]]))
    report(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
