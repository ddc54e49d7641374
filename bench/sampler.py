"""The device sampler's time a call (ops.sample: one row, metal/sample.metal),
for each shape, beside torch doing the same filters where torch is installed
(transformers' order: temperature, top-k, top-p, then a multinomial draw; on
the same device for cuda, the CPU otherwise).

    python bench/sampler.py --device host --vocab 262144 --calls 20
    python bench/sampler.py --device cuda --vocab 262144 --calls 200

A call's time includes its launch and wait, as a decode step pays it.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import metalkv
from metalkv._core import ops

CASES = {"plain": {}, "top-k 40": {"top_k": 40}, "top-p 0.9": {"top_p": 0.9},
         "top-k 40 + top-p 0.9": {"top_k": 40, "top_p": 0.9}}


def time_calls(fn, calls: int) -> float:
    """Median seconds of one call over `calls` timed calls, after 3 untimed."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def torch_sampler(logits: np.ndarray, device: str):
    """transformers' warpers, written out: temperature, top-k, top-p (sorted
    cumulative mass), softmax and torch.multinomial."""
    import torch

    x = torch.from_numpy(logits).to(device)

    def draw(top_k=0, top_p=1.0):
        y = x / 0.8
        if top_k:
            kth = torch.topk(y, top_k).values[-1]
            y = y.masked_fill(y < kth, float("-inf"))
        if top_p < 1.0:
            s, idx = torch.sort(y, descending=False)
            cum = s.softmax(-1).cumsum(-1)
            drop = cum <= 1 - top_p
            y = y.scatter(0, idx, s.masked_fill(drop, float("-inf")))
        token = torch.multinomial(y.softmax(-1), 1)
        if device == "cuda":
            torch.cuda.synchronize()
        return token

    return draw


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="host")
    ap.add_argument("--vocab", type=int, default=262144)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--shapes", default="gpu,simd", help="comma list of ops.sample shapes")
    args = ap.parse_args()
    dev = metalkv.Device(args.device)
    rng = np.random.default_rng(0)
    logits = (3.0 * rng.standard_normal(args.vocab)).astype(np.float32)
    buf = dev.buffer_from(logits)
    try:
        draw = torch_sampler(logits, "cuda" if args.device == "cuda" else "cpu")
    except ImportError:
        draw = None
    shapes = args.shapes.split(",")
    head = f"{'case':<22}" + "".join(f"{s + ' ms':>12}" for s in shapes) + (f"{'torch ms':>12}" if draw else "")
    print(f"ops.sample, {args.vocab} logits, temperature 0.8, {args.calls} calls, device {args.device}")
    print(head)
    for name, kw in CASES.items():
        row = f"{name:<22}"
        for shape in shapes:
            sec = time_calls(lambda: ops.sample(dev, buf, args.vocab, uniform=0.37, temperature=0.8, shape=shape,
                                                **kw), args.calls)
            row += f"{sec * 1e3:12.3f}"
        if draw:
            row += f"{time_calls(lambda: draw(**kw), args.calls) * 1e3:12.3f}"
        print(row)


if __name__ == "__main__":
    main()
