"""Non-finite weights refused at load, cheaply: every value of f32/f16/bf16
tensors, and the f16 scales (d, and m / dmin where the block has one) of
quantized blocks. A NaN or Inf there would otherwise reach every logit.

The check reads each tensor once through numpy views (no dequantization): the
default 98 MB model takes ~0.1 s. Quantized types not in _BLOCK_SCALES (IQ1_M,
MXFP4, TQ*, ... whose scales are not plain f16 fields) are not checked here.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .errors import ModelLoadError
from .tensor import Tensor

# Bit patterns: exponent all ones means Inf or NaN.
_EXP_MASK = {"f16": (np.uint16, 0x7C00), "bf16": (np.uint16, 0x7F80), "f32": (np.uint32, 0x7F800000)}

# ggml block layouts (ggml-common.h): bytes per block, byte offsets of its f16 scales.
_BLOCK_SCALES = {
    "q4_0": (18, (0,)), "q4_1": (20, (0, 2)), "q5_0": (22, (0,)), "q5_1": (24, (0, 2)),
    "q8_0": (34, (0,)), "iq4_nl": (18, (0,)), "iq4_xs": (136, (0,)),
    "q2_k": (84, (80, 82)), "q3_k": (110, (108,)), "q4_k": (144, (0, 2)), "q5_k": (176, (0, 2)),
    "q6_k": (210, (208,)),
}
_CHUNK = 1 << 22  # elements per pass: bounds the temporary masks to a few MB


def nonfinite_count(t: Tensor) -> int | None:
    """How many values (or block scales) of t are NaN or Inf; None when its type
    has no check here."""
    if t.dtype in _EXP_MASK:
        bits, mask = _EXP_MASK[t.dtype]
        return _count_exp_all_ones(np.ascontiguousarray(t.data).reshape(-1).view(bits), mask)
    if t.dtype in _BLOCK_SCALES:
        block_bytes, offsets = _BLOCK_SCALES[t.dtype]
        blocks = np.ascontiguousarray(t.data).reshape(-1, block_bytes)
        return sum(_count_exp_all_ones(blocks[:, o:o + 2].view(np.uint16)[:, 0], 0x7C00)
                   for o in offsets)
    return None


def _count_exp_all_ones(bits: np.ndarray, mask: int) -> int:
    n = 0
    for i in range(0, bits.size, _CHUNK):
        n += int(np.count_nonzero((bits[i:i + _CHUNK] & mask) == mask))
    return n


def check_finite(tensors: dict[str, Tensor], source: str,
                 hint: Callable[[str], str] | None = None) -> None:
    """Raise ModelLoadError naming the first tensor that holds NaN or Inf."""
    for name, t in tensors.items():
        n = nonfinite_count(t)
        if n:
            what = "block scales" if t.dtype in _BLOCK_SCALES else "values"
            label = name if hint is None else f"{name} ({hint(name)})"
            raise ModelLoadError(f"[load] {source}: tensor {label} ({t.dtype}, shape {t.shape}) has {n} "
                                 f"NaN or Inf {what}; expected finite weights: the file is corrupt")
