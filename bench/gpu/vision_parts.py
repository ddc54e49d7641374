#!/usr/bin/env python3
"""Where Gemma 3's vision tower spends its time: one layer's attention at SigLIP-so400m's
896 px shape (4,096 patches, 16 heads, head_dim 72 padded to 80, one bidirectional block over
the image, K and V f16 as the tower stores them), on metalkv's prefill attention beside
torch's SDPA in bf16 at head_dim 72, in one run. Multiplied by the 27 layers it is the part
of bench/gpu/vision.py's encode time that attention takes.

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

HEADS, HEAD_DIM, STORED_DIM, LAYERS = 16, 72, 80, 27


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

    def ours():
        _core.ops.attention_prefill(dev, *bufs, out, n_q_heads=HEADS, n_kv_heads=HEADS, head_dim=STORED_DIM,
                                    n_queries=n, q_pos0=0, slots=n, scale=HEAD_DIM ** -0.5, blocks=[(0, n)])

    t_ours = median_seconds(ours, args.repeat, lambda: None)  # each call waits for its work
    torch_dev = "cuda" if args.device == "cuda" else "cpu"
    x = [torch.randn(1, HEADS, n, HEAD_DIM, device=torch_dev, dtype=torch.bfloat16) for _ in range(3)]
    sync = torch.cuda.synchronize if torch_dev == "cuda" else (lambda: None)
    t_sdpa = median_seconds(lambda: torch.nn.functional.scaled_dot_product_attention(*x), args.repeat, sync)
    flops = 4 * n * n * HEAD_DIM * HEADS  # q·k and p·v, the true head_dim
    result = {"device": device_name(args.device), "date": time.strftime("%Y-%m-%d"), "patches": n,
              "metalkv_attention_s": t_ours, "sdpa_bf16_s": t_sdpa, "layers": LAYERS,
              "metalkv_attention_tower_s": LAYERS * t_ours, "sdpa_tower_s": LAYERS * t_sdpa,
              "metalkv_tflops": flops / t_ours / 1e12, "sdpa_tflops": flops / t_sdpa / 1e12}
    print(table(["one layer's attention", "s", "x 27 layers", "TFLOP/s"],
                [["metalkv (f32 q, f16 K/V, d 80)", f"{t_ours:.5f}", f"{LAYERS * t_ours:.4f}",
                  f"{result['metalkv_tflops']:.1f}"],
                 ["torch SDPA (bf16, d 72)", f"{t_sdpa:.5f}", f"{LAYERS * t_sdpa:.4f}", f"{result['sdpa_tflops']:.1f}"]]))
    report(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
