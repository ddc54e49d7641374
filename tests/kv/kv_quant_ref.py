"""A numpy reference of the quantized KV formats (metal/kv_format.h,
docs/KV_QUANT.md), written from the documented rules, for clarity:

  q8: per group of G = 64 elements (the whole head below 64) of one (token,
      head) row, scale = f16(max|x| / 127), code = clip(rint(x * (1 / scale)), -127, 127)
  q4: per group of 32, m = the x of largest |x| (the first), scale = f16(m / -8),
      code = clip(rint(x * (1 / scale)) + 8, 0, 15), value (code - 8) * scale;
      element 2j in the low nibble of byte j
  q2 (KIVI's 2 bits, asymmetric: scale = f16((max - min) / 3), lo = f16(min),
      code = clip(rint((x - lo) * (1 / scale)), 0, 3), value code * scale + lo;
      element 4j + i in bits 2i of byte j), apart for K and V:
      q2k: K per channel, over the 32 tokens of a block (params per block: a
           (H, D) array of (scale, lo), laid out as the block's parameter plane)
      q2v: V per token, groups of G = 64 (the whole head below 64)
  (float32 arithmetic; a zero scale gives code 0, q4 8)

and of the block layout: a section (K or V) is cut into blocks of B slots,
each its data plane (B, H, data_bytes) then its parameter plane, one row per
slot of the H heads' f16 group scales, padded to a multiple of 4 bytes.
"""
from __future__ import annotations

import numpy as np

B = 32  # slots per block: metalkv._core.BLOCK_TOKENS, restated
FORMATS = ("f16", "q8", "q4")
SECTION_FORMAT = {("q2", 0): "q2k", ("q2", 1): "q2v"}  # the user's "q2" in K (0) and V (1)


def section_format(fmt: str, kv: int) -> str:
    return SECTION_FORMAT.get((fmt, kv), fmt)


def group(fmt: str, d: int) -> int:
    return 32 if fmt == "q4" else min(d, 64)


def data_bytes(fmt: str, d: int) -> int:
    return {"f16": 2 * d, "q8": d, "q4": d // 2, "q2k": d // 4, "q2v": d // 4}[fmt]


def param_bytes(fmt: str, d: int) -> int:
    """Parameter bytes of one (slot, head); q2k's (scale, lo) per channel and
    block count as a block's share per slot."""
    if fmt == "q2k":
        return d * 4 // B
    if fmt == "q2v":
        return (d // group(fmt, d)) * 4
    return 0 if fmt == "f16" else (d // group(fmt, d)) * 2


def param_row_bytes(fmt: str, n_kv: int, d: int) -> int:
    return -(-n_kv * param_bytes(fmt, d) // 4) * 4


def slot_bytes(fmt: str, n_kv: int, d: int) -> int:
    return n_kv * data_bytes(fmt, d) + param_row_bytes(fmt, n_kv, d)


def quantize(x: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """x (..., D) float32 -> (data (..., data_bytes) uint8, params (..., param_bytes) uint8)."""
    x = np.asarray(x, np.float32)
    d = x.shape[-1]
    if fmt == "f16":
        return x.astype(np.float16).view(np.uint8), np.zeros(x.shape[:-1] + (0,), np.uint8)
    g = x.reshape(x.shape[:-1] + (d // group(fmt, d), group(fmt, d)))
    if fmt == "q8":
        scale = (np.abs(g).max(-1) / np.float32(127)).astype(np.float16)
    else:
        extreme = np.take_along_axis(g, np.abs(g).argmax(-1)[..., None], -1)[..., 0]  # argmax: the first
        scale = (extreme / np.float32(-8)).astype(np.float16)
    s = scale.astype(np.float32)[..., None]
    inv = np.where(s != 0, np.float32(1) / np.where(s != 0, s, np.float32(1)), np.float32(0)).astype(np.float32)
    c = np.rint(g * inv)
    params = scale[..., None].view(np.uint8).reshape(x.shape[:-1] + (-1,))
    if fmt == "q8":
        data = np.clip(c, -127, 127).astype(np.int8).reshape(x.shape).view(np.uint8)
    else:
        c = np.clip(c + 8, 0, 15).astype(np.uint8).reshape(x.shape)
        data = (c[..., 0::2] | (c[..., 1::2] << 4)).astype(np.uint8)
    return np.ascontiguousarray(data), np.ascontiguousarray(params)


def q2_codes(g: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """KIVI's asymmetric 2 bits over `axis` of g: (codes uint8, scale f16, lo f16)."""
    mn, mx = g.min(axis, keepdims=True), g.max(axis, keepdims=True)
    scale = ((mx - mn) / np.float32(3)).astype(np.float16)
    lo = mn.astype(np.float16)
    s = scale.astype(np.float32)
    inv = np.where(s != 0, np.float32(1) / np.where(s != 0, s, np.float32(1)), np.float32(0)).astype(np.float32)
    codes = np.clip(np.rint((g - lo.astype(np.float32)) * inv), 0, 3).astype(np.uint8)
    return codes, scale, lo


def pack2(c: np.ndarray) -> np.ndarray:
    """Codes (..., D) of 2 bits -> (..., D / 4) bytes, element 4j + i in bits 2i of byte j."""
    return (c[..., 0::4] | (c[..., 1::4] << 2) | (c[..., 2::4] << 4) | (c[..., 3::4] << 6)).astype(np.uint8)


def unpack2(b: np.ndarray) -> np.ndarray:
    return np.stack([(b >> (2 * i)) & 3 for i in range(4)], -1).reshape(b.shape[:-1] + (-1,))


def quantize_q2v(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """V rows x (..., D) -> (codes (..., D / 4), params (..., groups * 4)): (scale, lo) halfs per group."""
    x = np.asarray(x, np.float32)
    d = x.shape[-1]
    g = x.reshape(x.shape[:-1] + (d // group("q2v", d), group("q2v", d)))
    codes, scale, lo = q2_codes(g, -1)
    params = np.concatenate([scale, lo], -1).view(np.uint8).reshape(x.shape[:-1] + (-1,))
    return pack2(codes.reshape(x.shape)), np.ascontiguousarray(params)


def quantize_q2k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One block of K, x (B, H, D) -> (codes (B, H, D / 4), params (H, D, 2) f16: scale, lo per channel)."""
    x = np.asarray(x, np.float32)
    codes, scale, lo = q2_codes(x, 0)
    return pack2(codes), np.concatenate([scale[0][..., None], lo[0][..., None]], -1)


def q2_roundtrip_k(x: np.ndarray) -> np.ndarray:
    """K (n, H, D) as a q2 cache reads it: each whole block of B tokens
    quantized per channel from its f16 rows (the residual window's ring, which
    held them until the block was full), read back as half; a partial last
    block is the window's f16 rows."""
    x = np.asarray(x, np.float32).astype(np.float16).astype(np.float32)
    out = x.copy()
    for b0 in range(0, len(x) - B + 1, B):
        codes, prm = quantize_q2k(x[b0:b0 + B])
        p = prm.astype(np.float32)
        out[b0:b0 + B] = half(unpack2(codes).astype(np.float32) * p[None, ..., 0] + p[None, ..., 1])
    return out


def q2_roundtrip_v(x: np.ndarray) -> np.ndarray:
    """V (..., D) as a q2 cache reads it (dequantized to half)."""
    codes, params = quantize_q2v(x)
    d = np.asarray(x).shape[-1]
    lead = codes.shape[:-1]
    prm = np.ascontiguousarray(params).view(np.float16).astype(np.float32).reshape(lead + (-1, 2))
    g = unpack2(codes).astype(np.float32).reshape(lead + (d // group("q2v", d), group("q2v", d)))
    return half((g * prm[..., 0, None] + prm[..., 1, None]).reshape(lead + (d,)))


def half(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def dequantize(data: np.ndarray, params: np.ndarray, fmt: str, d: int) -> np.ndarray:
    """The float32 values a kernel reads back (code * scale + lo)."""
    if fmt == "f16":
        return np.ascontiguousarray(data).view(np.float16).astype(np.float32)
    lead = data.shape[:-1]
    scale = np.ascontiguousarray(params).view(np.float16).astype(np.float32)
    if fmt == "q8":
        codes = np.ascontiguousarray(data).view(np.int8).astype(np.float32)
    else:
        codes = np.stack([data & 0xF, data >> 4], -1).reshape(lead + (d,)).astype(np.float32) - 8
    g = codes.reshape(lead + (d // group(fmt, d), group(fmt, d)))
    return (g * scale[..., None]).astype(np.float32).reshape(lead + (d,))


def roundtrip(x: np.ndarray, fmt: str) -> np.ndarray:
    """x as the cache holds it, read back in float32 (q2k, q2v: K (n, H, D), V rows)."""
    if fmt == "q2k":
        return q2_roundtrip_k(x)
    if fmt == "q2v":
        return q2_roundtrip_v(x)
    return dequantize(*quantize(x, fmt), fmt, np.asarray(x).shape[-1])


def section_rows(section: np.ndarray, fmt: str, n_kv: int, d: int, slots) -> tuple[np.ndarray, np.ndarray]:
    """(data, params) of the given slots, read from a section's raw bytes
    (blocks, block_bytes) (KVCache.section_bytes)."""
    flat = np.asarray(section).reshape(-1)
    db, pb = data_bytes(fmt, d), param_bytes(fmt, d)
    block, prow = B * slot_bytes(fmt, n_kv, d), param_row_bytes(fmt, n_kv, d)
    data = np.empty((len(slots), n_kv, db), np.uint8)
    params = np.empty((len(slots), n_kv, pb), np.uint8)
    for j, s in enumerate(slots):
        base, i = (s // B) * block, s % B
        for h in range(n_kv):
            at = base + (i * n_kv + h) * db
            data[j, h] = flat[at:at + db]
            at = base + B * n_kv * db + i * prow + h * pb
            params[j, h] = flat[at:at + pb]
    return data, params


def build_section(x: np.ndarray, fmt: str, table: np.ndarray, n_blocks: int, first: int = 0) -> np.ndarray:
    """A section of n_blocks blocks holding positions first.. of x (n, H, D)
    float32 in the slots `table` gives; every other slot is poison (NaN f16
    values, or NaN scales, so a kernel that reads it spoils its output)."""
    n, n_kv, d = x.shape
    db, pb = data_bytes(fmt, d), param_bytes(fmt, d)
    block, prow = B * slot_bytes(fmt, n_kv, d), param_row_bytes(fmt, n_kv, d)
    out = np.zeros(n_blocks * block, np.uint8)
    nan = np.full(1, np.nan, np.float16).view(np.uint8)
    if fmt == "f16":
        out.view(np.uint16)[:] = nan.view(np.uint16)[0]
    else:
        for b in range(n_blocks):  # NaN scales everywhere, then the held slots' real ones
            params = out[b * block + B * n_kv * db:(b + 1) * block]
            params.view(np.uint16)[:] = nan.view(np.uint16)[0]
    if fmt == "q2k":  # whole blocks only, their (H, D, 2) parameters as the block's parameter plane
        for b0 in range(first // B * B, n - B + 1, B):
            codes, prm = quantize_q2k(half(x[b0:b0 + B]))
            base = int(table[b0 // B]) * block
            for i in range(B):
                for h in range(n_kv):
                    at = base + (i * n_kv + h) * db
                    out[at:at + db] = codes[i, h]
            out[base + B * n_kv * db:base + block] = np.ascontiguousarray(prm).view(np.uint8).reshape(-1)
        return out
    data, params = quantize_q2v(x) if fmt == "q2v" else quantize(x, fmt)
    for p in range(first, n):
        s = int(table[p // B]) * B + p % B
        base, i = (s // B) * block, s % B
        for h in range(n_kv):
            at = base + (i * n_kv + h) * db
            out[at:at + db] = data[p, h]
            at = base + B * n_kv * db + i * prow + h * pb
            out[at:at + pb] = params[p, h]
    return out
