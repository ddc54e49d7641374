"""References for the op tests: weights in every format, made by the PyPI
`gguf` package (its quantize/dequantize are the independent reference of the
GGUF block layouts), and float64 numpy versions of each op."""
from __future__ import annotations

import gguf
import numpy as np
from gguf import quants

WTYPES = ["f32", "f16", "q8_0", "q4_0", "q4_1"]
QUANTIZED = ["q8_0", "q4_0", "q4_1"]


def make_weights(wtype: str, rows: int, cols: int, rng: np.random.Generator,
                 spread: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """A random (rows, cols) matrix as stored in `wtype` (the bytes the kernel
    reads) and as float64 (what those bytes mean)."""
    w = (rng.standard_normal((rows, cols)) * spread).astype(np.float32)
    if wtype == "f32":
        return w, w.astype(np.float64)
    if wtype == "f16":
        h = w.astype(np.float16)
        return h, h.astype(np.float64)
    qtype = gguf.GGMLQuantizationType[wtype.upper()]
    stored = quants.quantize(w, qtype)  # uint8 (rows, bytes per row)
    return stored, quants.dequantize(stored, qtype).astype(np.float64)


def matmul(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    y = x.astype(np.float64) @ w.T
    return y if bias is None else y + bias.astype(np.float64)


def matmul_tolerance(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Per-output bound on float32 accumulation error, (n_tokens, n_out).

    A float32 sum of n_in products errs by about 2^-24 · sqrt(n_in) · Σ|w·x|
    (gemm's single accumulator over n_in = 1536 measured 2.3e-7 · Σ|w·x|);
    the Q4 kernels' d·(Σq·x − 8·Σx) form has partial sums ~3x larger. 2e-6
    leaves ~10x headroom over the worst measured, while a misplaced weight or a
    wrong scale errs by O(|w·x|).
    """
    return 2e-6 * (np.abs(x.astype(np.float64)) @ np.abs(w).T)


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float, w_offset: float) -> np.ndarray:
    x = x.astype(np.float64)
    inv = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return x * inv * (w_offset + w.astype(np.float64))


def silu(g: np.ndarray) -> np.ndarray:
    g = g.astype(np.float64)
    return g / (1.0 + np.exp(-g))


def gelu_pytorch_tanh(g: np.ndarray) -> np.ndarray:
    g = g.astype(np.float64)
    return 0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g ** 3)))


def f32(buf, shape) -> np.ndarray:
    """A device buffer's contents as float32 of `shape` (a copy)."""
    n = int(np.prod(shape))
    return buf.numpy().view(np.float32)[:n].reshape(shape).copy()
