"""ops.pack_weights: the file's GGUF rows rewritten into the planes the kernels
read. The layout is restated here from ggml-common.h's block_* structs (where
each field sits in a block) and metal/linear_params.h's plane order (the
quants, then the high bits, then the scales); the matmul and embedding tests
check that the kernels decode the packed bytes to gguf's values."""
from __future__ import annotations

import numpy as np
import pytest

import metalkv
from metalkv._core import ops

from .reference import PACKED, WTYPES, file_row_bytes, fit, quant_size

# (offset in the GGUF block, size) of each field, in the order a packed row stores them.
FIELDS = {
    "q8_0": [(2, 32), (0, 2)],                    # qs, d
    "q4_0": [(2, 16), (0, 2)],                    # qs, d
    "q4_1": [(4, 16), (0, 4)],                    # qs, (d, m)
    "q5_0": [(6, 16), (2, 4), (0, 2)],            # qs, qh, d
    "q5_1": [(8, 16), (4, 4), (0, 4)],            # qs, qh, (d, m)
    "q6_k": [(0, 128), (128, 64), (192, 16), (208, 2)],  # ql, qh, scales, d
}


def packed_by_spec(wtype: str, file: np.ndarray) -> np.ndarray:
    """numpy's packing: per row, each field of every block back to back, then zeros to 16 bytes."""
    rows, row_bytes = file.shape
    _, block_bytes = quant_size(wtype)
    blocks = file.reshape(rows, row_bytes // block_bytes, block_bytes)
    planes = [blocks[:, :, at:at + size].reshape(rows, -1) for at, size in FIELDS[wtype]]
    pad = -row_bytes % 16
    return np.concatenate(planes + [np.zeros((rows, pad), np.uint8)], axis=1)


def test_the_packed_types_are_the_misaligned_blocks():
    """Every block size that is not a multiple of 16 bytes is packed, and only those."""
    misaligned = [t for t in WTYPES if quant_size(t)[0] > 1 and quant_size(t)[1] % 16]
    assert misaligned == PACKED == list(FIELDS)


@pytest.mark.parametrize("wtype", PACKED)
@pytest.mark.parametrize("cols", [32, 96, 512, 576])  # 1, 3, 16, 18 blocks (K-quants: fit to 256)
def test_pack_matches_the_spec(wtype, cols):
    cols = fit(wtype, cols)
    rng = np.random.default_rng(cols)
    file = rng.integers(0, 256, (5, file_row_bytes(wtype, cols)), dtype=np.uint8)
    packed = ops.pack_weights(wtype, file, cols=cols)
    np.testing.assert_array_equal(packed, packed_by_spec(wtype, file))


@pytest.mark.parametrize("wtype", [t for t in WTYPES if t not in PACKED])
def test_other_types_are_unchanged(wtype):
    cols = fit(wtype, 96)
    file = np.random.default_rng(1).integers(0, 256, (3, file_row_bytes(wtype, cols)), dtype=np.uint8)
    np.testing.assert_array_equal(ops.pack_weights(wtype, file, cols=cols), file)


def test_large_matrices_pack_on_several_threads_the_same():
    """Past 32 MB the rows are split among threads (one per 16 MB); every row still packs by the spec."""
    cols = 4096
    file = np.random.default_rng(2).integers(0, 256, (12289, file_row_bytes("q5_0", cols)), dtype=np.uint8)
    assert file.nbytes > 32 << 20
    np.testing.assert_array_equal(ops.pack_weights("q5_0", file, cols=cols), packed_by_spec("q5_0", file))


def test_bad_sizes_are_refused():
    file = np.zeros((2, 34), np.uint8)
    with pytest.raises(metalkv.GpuError, match=r"\[pack_weights\] 68 bytes for 2 rows of 64 q8_0 weights; "
                                              r"expected 136"):
        ops.pack_weights("q8_0", file, cols=64)
    with pytest.raises(metalkv.GpuError, match=r"\[pack_weights\] q8_0 weights need a row length that is a "
                                              r"positive multiple of 32, got 48"):
        ops.pack_weights("q8_0", file, cols=48)
    with pytest.raises(metalkv.GpuError, match=r"\[pack_weights\] unknown weight type 'q3_k'"):
        ops.pack_weights("q3_k", file, cols=32)
