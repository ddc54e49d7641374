"""References for the op tests: weights in every format, made by the PyPI
`gguf` package (its quantize/dequantize are the independent reference of the
GGUF block layouts), and float64 numpy versions of each op."""
from __future__ import annotations

import gguf
import numpy as np
from gguf import quants

from metalkv._core import ops

WTYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k"]
QUANTIZED = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k"]
K_QUANTS = ["q4_k", "q5_k", "q6_k"]  # 256-weight super-blocks; gguf-py can dequantize but not quantize them
# Rewritten at load into planes of one field each, rows padded to 16 bytes
# (metal/linear_params.h); the other types are read as the file stores them.
PACKED = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q6_k"]

# Where a K-quant super-block keeps its f16 scales (byte offsets, ggml-common.h):
# d and dmin first in Q4_K/Q5_K, d last in Q6_K.
K_SCALES = {"q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,)}


def row_multiple(wtype: str) -> int:
    """What the kernels need a row length to be a multiple of."""
    if wtype in ("f32", "f16", "bf16"):
        return 4
    return quant_size(wtype)[0]


def quant_size(wtype: str) -> tuple[int, int]:
    """(weights, bytes) of one block (f32/f16/bf16: one weight), from gguf."""
    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[wtype.upper()]]


def file_row_bytes(wtype: str, cols: int) -> int:
    """Bytes of a row of `cols` weights in a GGUF file."""
    block, block_bytes = quant_size(wtype)
    return cols // block * block_bytes


def device_row_bytes(wtype: str, cols: int) -> int:
    """Bytes of a row as the kernels read it: the file's, padded to 16 for PACKED types."""
    n = file_row_bytes(wtype, cols)
    return -(-n // 16) * 16 if wtype in PACKED else n


def kernel_bytes(wtype: str, stored: np.ndarray) -> np.ndarray:
    """What the kernels read for `stored` (rows in the file's layout): ops.pack_weights."""
    rows = np.ascontiguousarray(stored).view(np.uint8).reshape(len(stored), -1)
    block, block_bytes = quant_size(wtype)
    return ops.pack_weights(wtype, rows, cols=rows.shape[1] // block_bytes * block)


def fit(wtype: str, n: int) -> int:
    """n rounded up to a row length `wtype` takes (K-quants: a multiple of 256)."""
    m = row_multiple(wtype)
    return -(-n // m) * m


def random_k_blocks(wtype: str, rows: int, cols: int, rng: np.random.Generator,
                    spread: float = 1.0) -> np.ndarray:
    """Random valid K-quant blocks, uint8 (rows, bytes per row): random quants and
    packed sub-block scales, and f16 super-block scales of either sign chosen so
    the weights are of order `spread` (like bench/bench_linear.cpp's random weights)."""
    qtype = gguf.GGMLQuantizationType[wtype.upper()]
    block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = rows * cols // block
    b = rng.integers(0, 256, (n_blocks, block_bytes), dtype=np.uint8)
    # |weight| <= d·63·31 + dmin·63 (Q4_K/Q5_K), d·127·32 (Q6_K)
    size = {"q4_k": 1 / 256, "q5_k": 1 / 512, "q6_k": 1 / 1024}[wtype] * spread
    for at in K_SCALES[wtype]:
        v = (rng.uniform(0.5, 1.5, n_blocks) * rng.choice([-1.0, 1.0], n_blocks) * size).astype(np.float16)
        b[:, at:at + 2] = v.view(np.uint8).reshape(n_blocks, 2)
    return b.reshape(rows, cols // block * block_bytes)


def make_weights(wtype: str, rows: int, cols: int, rng: np.random.Generator,
                 spread: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """A random (rows, cols) matrix as a GGUF file stores it in `wtype` (upload
    kernel_bytes(wtype, stored)) and as float64 (what those bytes mean, by gguf's
    dequantize)."""
    if wtype in K_QUANTS:
        qtype = gguf.GGMLQuantizationType[wtype.upper()]
        stored = random_k_blocks(wtype, rows, cols, rng, spread)
        return stored, quants.dequantize(stored, qtype).astype(np.float64)
    w = (rng.standard_normal((rows, cols)) * spread).astype(np.float32)
    if wtype == "f32":
        return w, w.astype(np.float64)
    if wtype == "f16":
        h = w.astype(np.float16)
        return h, h.astype(np.float64)
    qtype = gguf.GGMLQuantizationType[wtype.upper()]
    stored = quants.quantize(w, qtype)  # uint8 (rows, bytes per row); bf16: 2 bytes a weight
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


def rounded(wtype: str, x: np.ndarray) -> np.ndarray:
    """x rounded to the 16-bit type of wtype's weights: numpy's float16, gguf's bf16."""
    if wtype == "f16":
        return x.astype(np.float16).astype(np.float32)
    qtype = gguf.GGMLQuantizationType.BF16
    return quants.dequantize(quants.quantize(x, qtype), qtype).astype(np.float32)


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
