// The one definition of how a layer's KV cache is laid out in device memory.
// Attention kernels, the stores and the Python views all derive offsets from
// here and from metal/kv_format.h (the formats' bytes, shared with the
// kernels); docs/KV_CACHE.md and docs/KV_QUANT.md describe the same layout.
//
// A layer's region (its pool) has R = slots = n_blocks * kBlockTokens slots:
// its K section, then its V section, each in its own format (f16, q8, q4, q2).
// A section is cut into blocks of B slots, each one contiguous range (its
// data plane, then its parameter plane: kv_format.h); in f16 a section is the
// plain (R, n_kv_heads, head_dim) half array. Which position a slot holds is
// the block table's business (kv/block_pool.h): position p lives in slot
// table[p / B] * B + p % B.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "metal/kv_format.h"
#include "metal/kv_params.h"

namespace mkv::kv {

// The KV formats by name: "f16", "q8", "q4", "q2" (mkv_params::kKvF16 ...;
// q2 is kKvQ2K in a K section, kKvQ2V in a V section).
const char* kv_format_name(uint32_t format);
// The format called `name` in the section `what` names ("kv_v": V, else K);
// raises ArgumentError(what) naming the formats for another.
uint32_t parse_kv_format(const std::string& name, const char* what);
// Raises ArgumentError(what) when `format` cannot store heads of head_dim
// (the quantized formats need a multiple of 32 that their group divides), or
// is q2 of the other section (what "kv_v": a V section, else K).
void check_kv_format(uint32_t format, uint32_t head_dim, const char* what);

struct LayerLayout {
  uint32_t slots = 0;  // R
  uint32_t n_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t k_format = mkv_params::kKvF16;
  uint32_t v_format = mkv_params::kKvF16;
  // K, V and the queries are Hadamard-rotated before they are stored, and the
  // attention output rotated back (ops::hadamard): a rotated cache's layers
  // whose K or V is quantized.
  bool rotate = false;

  uint32_t format(uint32_t kv) const { return kv ? v_format : k_format; }
  // One token's K (kv = 0) or V (1) row in its format: data and parameters of every head.
  size_t slot_bytes(uint32_t kv) const { return mkv_params::kv_slot_bytes(format(kv), n_kv_heads, head_dim); }
  size_t section_bytes(uint32_t kv) const { return size_t(slots) * slot_bytes(kv); }
  size_t section_offset(uint32_t kv) const { return kv ? section_bytes(0) : 0; }
  // The whole region: K section, then V section.
  size_t nbytes() const { return section_bytes(0) + section_bytes(1); }
  // Block b of section kv: one contiguous range of block_bytes(kv).
  size_t block_bytes(uint32_t kv) const { return size_t(mkv_params::kKvBlockTokens) * slot_bytes(kv); }
  size_t block_offset(uint32_t kv, uint32_t block) const { return section_offset(kv) + block * block_bytes(kv); }
  // One slot's row in section kv's data plane (every head's codes or halfs)
  // and in its parameter plane (0 for f16).
  size_t data_row_bytes(uint32_t kv) const {
    return size_t(n_kv_heads) * mkv_params::kv_data_bytes(format(kv), head_dim);
  }
  size_t param_row_bytes(uint32_t kv) const {
    return mkv_params::kv_param_row_bytes(format(kv), n_kv_heads, head_dim);
  }
  // Slots [slot, slot + n) of one block of section kv, as (offset, bytes)
  // ranges: the data plane's, then (quantized) the parameter plane's.
  struct Range {
    size_t offset = 0;
    size_t bytes = 0;
  };
  std::vector<Range> slot_ranges(uint32_t kv, uint32_t slot, uint32_t n) const;
  // The same for a section of `rows` slots laid out as one unit (a blit store's staging buffer).
  static std::vector<Range> unit_ranges(uint32_t format, uint32_t n_kv_heads, uint32_t head_dim, uint32_t rows,
                                        size_t section_offset, uint32_t slot, uint32_t n);
};

// Blocks of a window group's pool for one sequence (cpp/kv/kv_cache.h):
//   full (window 0), or sliding where that is no smaller: ceil(capacity / B);
//   sliding, window W: the positions a store of max_chunk tokens may hold at
//   once — the window of its first query, the chunk, and max_chunk positions
//   of history that truncate() may take back (what a ring of W + max_chunk - 1
//   slots allowed) — W + 2 * max_chunk - 1, spread over at most one block
//   more than they fill.
inline uint32_t group_blocks(uint32_t window, uint32_t capacity, uint32_t max_chunk) {
  constexpr uint64_t block_tokens = mkv_params::kKvBlockTokens;
  const uint64_t full = (uint64_t(capacity) + block_tokens - 1) / block_tokens;
  if (window == 0) return uint32_t(full);
  const uint64_t span = uint64_t(window) + 2 * uint64_t(max_chunk) - 1;
  const uint64_t sliding = (span + block_tokens - 1) / block_tokens + 1;
  return uint32_t(sliding < full ? sliding : full);
}

// True when a sliding layer's pool is smaller than the context (its memory
// stays bounded however long the sequence); false for full layers and for
// sliding ones whose window spans the capacity anyway (they overflow at it).
inline bool layer_wraps(uint32_t window, uint32_t capacity, uint32_t max_chunk) {
  return window != 0 && group_blocks(window, capacity, max_chunk) < group_blocks(0, capacity, max_chunk);
}

}  // namespace mkv::kv
