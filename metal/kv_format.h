// KV cache formats: the one definition of how K or V rows are stored, shared
// by the kernels (store, attention) and the C++ layout (cpp/kv/kv_layout.h).
// docs/KV_QUANT.md describes the same layout in prose.
//
// K and V each have a format, chosen per layer and apart; a format quantizes
// each group of G = kv_group(format, head_dim) elements of one (token, KV
// head) row with one half scale:
//   f16  half, as the model computed it (after RoPE for K)
//   q8   int8 codes, G = 64 (the whole head below 64): scale = half(max|x| / 127),
//        code = clamp(rint(x / scale), -127, 127), x' = code * scale
//   q4   4-bit codes, G = 32, symmetric with the sign of the largest value
//        (llama.cpp's q4_0 rule): m = the x of largest |x|, scale = half(m / -8),
//        code = clamp(rint(x / scale) + 8, 0, 15), x' = (code - 8) * scale;
//        element 2j in the low nibble of byte j, 2j + 1 in the high one
//   q2   KIVI's 2 bits, asymmetric: scale = half((max - min) / 3), lo = half(min),
//        code = clamp(rint((x - lo) / scale), 0, 3), x' = code * scale + lo;
//        element 4j + i in bits 2i of byte j. A section format of its own for
//        K and for V (the user's "q2" is q2k for K, q2v for V):
//          q2k  K per channel over the kKvBlockTokens tokens of a block: the
//               block's parameter plane is one (n_kv_heads, head_dim) array of
//               (scale, lo) half pairs. A block's K is quantized when the block
//               is full (kv_seal), from the f16 rows of the residual window
//               that holds it until then: q2 layers always have one.
//          q2v  V per token, groups of G = 64 (the whole head below 64), a
//               (scale, lo) half pair per group
// (the division is x * (1 / scale) in float; a zero scale gives code 0 or 8).
//
// Layout. A section (K or V) of `rows` slots is cut into units of U slots
// (the pool: U = kKvBlockTokens, one unit per block; a blit store's staging
// buffer: one unit of all its rows). A unit holds first its data plane
//   (U, n_kv_heads, data_bytes)  codes (or halfs) of slot i, head h at
//                                (i * n_kv_heads + h) * data_bytes
// then its parameter plane, one row of param_row_bytes per slot (the heads'
// parameters, padded to a multiple of 4 bytes so a run of slots is a range a
// blit may copy):
//   head h's parameters at h * param_bytes: per group g a half scale at g * 2
// so a block is one contiguous range (copied whole by copy-on-write and
// checkpoints) and every plane row stays aligned for the widest load
// (data_bytes is a multiple of 16). For f16 the parameter plane is empty and
// the layout is the plain (slots, n_kv_heads, head_dim) half array. A layer's
// region is its K section, then its V section.
#pragma once

#include "shared_params.h"
#include "kv_params.h"

namespace mkv_params {

MKV_CONSTANT uint32_t kKvF16 = 0;
MKV_CONSTANT uint32_t kKvQ8 = 1;
MKV_CONSTANT uint32_t kKvQ4 = 2;
MKV_CONSTANT uint32_t kKvQ2K = 3;  // K sections only
MKV_CONSTANT uint32_t kKvQ2V = 4;  // V sections only
MKV_CONSTANT uint32_t kKvFormats = 5;

constexpr bool kv_is_q2(uint32_t fmt) { return fmt == kKvQ2K || fmt == kKvQ2V; }

// Elements per quantization group. q8: the whole head up to 64, else 64 (a
// 2-byte scale per 64 codes: 1.94x smaller than f16); q4: 32 (16 bytes of
// codes and a scale: 3.56x; at those bytes groups of 32 with a scale beat
// groups of 64 with a scale and a minimum: docs/KV_QUANT.md). The formats take
// the head dims their kernels are built for: 32, 64 and multiples of 64
// (kv_format_fits), which every group divides.
constexpr uint32_t kv_group(uint32_t fmt, uint32_t head_dim) {
  return fmt == kKvQ4 ? 32 : head_dim < 64 ? head_dim : 64;
}

constexpr bool kv_format_fits(uint32_t fmt, uint32_t head_dim) {
  return fmt == kKvF16 || (fmt < kKvFormats && (head_dim == 32 || head_dim % 64 == 0));
}

// Bytes of one (slot, head) row in the data and parameter planes.
constexpr uint32_t kv_data_bytes(uint32_t fmt, uint32_t head_dim) {
  return fmt == kKvQ8 ? head_dim : fmt == kKvQ4 ? head_dim / 2 : kv_is_q2(fmt) ? head_dim / 4 : 2 * head_dim;
}
// q2k's per-block (scale, lo) per channel counts as each slot's share.
constexpr uint32_t kv_param_bytes(uint32_t fmt, uint32_t head_dim) {
  return fmt == kKvF16    ? 0
         : fmt == kKvQ2K  ? head_dim * 4 / kKvBlockTokens
         : fmt == kKvQ2V  ? (head_dim / kv_group(fmt, head_dim)) * 4
                          : (head_dim / kv_group(fmt, head_dim)) * 2;
}
// One slot's row of the parameter plane: every head's, padded to 4 bytes.
constexpr uint32_t kv_param_row_bytes(uint32_t fmt, uint32_t n_kv_heads, uint32_t head_dim) {
  return (n_kv_heads * kv_param_bytes(fmt, head_dim) + 3) / 4 * 4;
}
// Bytes one token costs in one section: every head's data and parameters.
constexpr uint32_t kv_slot_bytes(uint32_t fmt, uint32_t n_kv_heads, uint32_t head_dim) {
  return n_kv_heads * kv_data_bytes(fmt, head_dim) + kv_param_row_bytes(fmt, n_kv_heads, head_dim);
}

// Byte offsets inside a section cut into units of `unit_rows` slots: the data
// of element `elem` (even, so a q4 element starts a byte; q2: a multiple of 4)
// of (slot, head), and the parameters of elem's group (q2k: of channel elem,
// in units of kKvBlockTokens slots only).
constexpr uint32_t kv_data_offset(uint32_t fmt, uint32_t unit_rows, uint32_t n_kv_heads, uint32_t head_dim,
                                  uint32_t slot, uint32_t head, uint32_t elem) {
  return (slot / unit_rows) * unit_rows * kv_slot_bytes(fmt, n_kv_heads, head_dim) +
         ((slot % unit_rows) * n_kv_heads + head) * kv_data_bytes(fmt, head_dim) +
         (fmt == kKvQ8 ? elem : fmt == kKvQ4 ? elem / 2 : kv_is_q2(fmt) ? elem / 4 : 2 * elem);
}
constexpr uint32_t kv_param_offset(uint32_t fmt, uint32_t unit_rows, uint32_t n_kv_heads, uint32_t head_dim,
                                   uint32_t slot, uint32_t head, uint32_t elem) {
  return (slot / unit_rows) * unit_rows * kv_slot_bytes(fmt, n_kv_heads, head_dim) +
         unit_rows * n_kv_heads * kv_data_bytes(fmt, head_dim) +
         (fmt == kKvQ2K ? (head * head_dim + elem) * 4
                        : (slot % unit_rows) * kv_param_row_bytes(fmt, n_kv_heads, head_dim) +
                              head * kv_param_bytes(fmt, head_dim) +
                              (elem / kv_group(fmt, head_dim)) * (fmt == kKvQ2V ? 4 : 2));
}

}  // namespace mkv_params
