"""Which 4-bit rule for the KV cache: candidate quantizers compared on the
default model without building kernels for them (docs/KV_QUANT.md, "Why q4 is
q4_0's rule").

    python bench/kv_quant_variants.py [--tokens 256]
    python bench/kv_quant_variants.py --q2 [--tokens 512] [--residual 128]

--q2 compares 2-bit rules (KIVI's per-channel K against per-token K, and
V's group and offset) with a full-precision residual window: each query
reads its last `residual` positions (and the block they start in) as f16.

The model is tests/engine/reference.py's float64 forward of the default model
(SmolLM2-135M-Instruct, Q4_1 dequantized by gguf-py), whose `storage` hook is
what attention reads back of every roped K and every V: here each candidate's
quantize-dequantize (K and V alike), optionally under the orthonormal Hadamard
rotation, then rounded to half as prefill stages it. Every position reads the
quantized K/V of all earlier positions, as decode does. Printed per candidate:
mean KL(f16 storage || candidate) over the positions, and perplexity.
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
TEXT = ROOT.parent / "shared" / "data" / "pride_and_prejudice.txt"


def hadamard(d: int) -> np.ndarray:
    h = np.ones((1, 1))
    while len(h) < d:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(d)


def groups(x: np.ndarray, g: int) -> np.ndarray:
    return x.reshape(x.shape[:-1] + (x.shape[-1] // g, g))


def scale_only(x: np.ndarray, g: int) -> np.ndarray:
    """q4_0's rule: scale = half(m / -8), m the value of largest |x|; codes 0..15 around 8."""
    y = groups(x, g)
    m = np.take_along_axis(y, np.abs(y).argmax(-1)[..., None], -1)
    d = (m / -8).astype(np.float16).astype(np.float32)
    inv = np.where(d != 0, 1 / np.where(d != 0, d, 1), 0)
    return ((np.clip(np.rint(y * inv) + 8, 0, 15) - 8) * d).reshape(x.shape)


def scale_min(x: np.ndarray, g: int) -> np.ndarray:
    """Asymmetric: scale = half((max - min) / 15), lo = half(min); codes 0..15."""
    y = groups(x, g)
    mn, mx = y.min(-1, keepdims=True), y.max(-1, keepdims=True)
    s = ((mx - mn) / 15).astype(np.float16).astype(np.float32)
    lo = mn.astype(np.float16).astype(np.float32)
    inv = np.where(s > 0, 1 / np.where(s > 0, s, 1), 0)
    return (np.clip(np.rint((y - lo) * inv), 0, 15) * s + lo).reshape(x.shape)


# name: (quantizer, bytes a head of 64)
CANDIDATES = {
    "scale + minimum, groups of 64": (lambda x: scale_min(x, 64), 36),
    "scale only (q4_0), groups of 32": (lambda x: scale_only(x, 32), 36),
    "scale only (q4_0), groups of 64": (lambda x: scale_only(x, 64), 34),
    "scale + minimum, groups of 32": (lambda x: scale_min(x, 32), 40),
}


def two_bits(x: np.ndarray, g: int, offset: bool) -> np.ndarray:
    """Per-token groups of g: asymmetric (scale and lo, KIVI's V) or symmetric
    (scale only: levels +-0.5 and +-1.5 scale)."""
    y = groups(x, g)
    if offset:
        mn, mx = y.min(-1, keepdims=True), y.max(-1, keepdims=True)
        s = ((mx - mn) / 3).astype(np.float16).astype(np.float32)
        lo = mn.astype(np.float16).astype(np.float32)
        inv = np.where(s > 0, 1 / np.where(s > 0, s, 1), 0)
        return (np.clip(np.rint((y - lo) * inv), 0, 3) * s + lo).reshape(x.shape)
    s = (np.abs(y).max(-1, keepdims=True) / 1.5).astype(np.float16).astype(np.float32)
    inv = np.where(s > 0, 1 / np.where(s > 0, s, 1), 0)
    return ((np.clip(np.floor(y * inv), -2, 1) + 0.5) * s).reshape(x.shape)


def q2_candidates():
    from kv import kv_quant_ref as qr
    # name: (K quantizer, V quantizer, bytes a head of 64 for K + V)
    return {
        "K per channel, V asym groups of 64": (qr.q2_roundtrip_k, lambda x: two_bits(x, 64, True), 44),
        "K per channel, V asym groups of 32": (qr.q2_roundtrip_k, lambda x: two_bits(x, 32, True), 48),
        "K per channel, V sym groups of 64": (qr.q2_roundtrip_k, lambda x: two_bits(x, 64, False), 42),
        "K per token, V asym groups of 64": (lambda x: two_bits(x, 64, True), lambda x: two_bits(x, 64, True), 40),
    }


def storage(quantize, rotate: bool, quantize_v=None):
    def store(k, v):
        out = []
        for x, q in ((k, quantize), (v, quantize_v or quantize)):
            h = hadamard(x.shape[-1]) if rotate else np.eye(x.shape[-1])
            y = q((x @ h).astype(np.float32))
            out.append(y.astype(np.float16).astype(np.float64) @ h)
        return tuple(out)
    return store


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=None, help="256 (q4), 512 (--q2)")
    ap.add_argument("--q2", action="store_true", help="the 2-bit rules with a residual window")
    ap.add_argument("--residual", type=int, default=128)
    a = ap.parse_args()
    a.tokens = a.tokens or (512 if a.q2 else 256)
    import metalkv
    from engine.reference import dequantized, llama_logits
    from metalkv.models import default_model_path, load_model
    from metalkv.ppl import log_softmax, text_ids

    m = load_model(default_model_path(), progress=False)
    W = dequantized(m)
    eng = metalkv.Engine.load(None, kv_memory=None, context=a.tokens + 1, progress=False)
    ids = [int(i) for i in text_ids(eng, str(TEXT), a.tokens)]
    targets = np.asarray(ids[1:])
    ref = log_softmax(llama_logits(m, ids[:-1], W))
    ppl0 = np.exp(-ref[np.arange(len(targets)), targets].mean())
    print(f"f16 storage: PPL {ppl0:.3f} over {len(targets)} tokens")
    if a.q2:
        table = {name: (k, v, b) for name, (k, v, b) in q2_candidates().items()}
        print(f"residual window: {a.residual} tokens (and the block they start in) in f16")
    else:
        table = {name: (q, None, b) for name, (q, b) in CANDIDATES.items()}
    residual = a.residual if a.q2 else 0
    print(f"{'q2 variant' if a.q2 else 'q4 variant':34s} {'bytes':>5} {'rotated':>8} {'KL':>8} {'PPL change':>10}")
    for name, (quantize, quantize_v, nbytes) in table.items():
        for rotate in (False, True):
            lp = log_softmax(llama_logits(m, ids[:-1], W, storage=storage(quantize, rotate, quantize_v),
                                          residual=residual))
            kl = (np.exp(ref) * (ref - lp)).sum(-1).mean()
            ppl = np.exp(-lp[np.arange(len(targets)), targets].mean())
            print(f"{name:34s} {nbytes:>5} {str(rotate):>8} {kl:8.4f} {100 * (ppl / ppl0 - 1):+9.2f}%", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
