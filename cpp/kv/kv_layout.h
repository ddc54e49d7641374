// The one definition of how a layer's KV cache is laid out in device memory.
// Attention kernels, the stores and the Python views all derive offsets from
// here; docs/KV_CACHE.md describes the same layout in prose.
//
// A layer's region (its pool) is half precision, shaped (2, R, n_kv_heads,
// head_dim): the K block (R, n_kv_heads, head_dim), then the V block of the
// same shape. R = slots = n_blocks * kBlockTokens; the slots of block b are
// [b * B, (b + 1) * B). Which position a slot holds is the block table's
// business (kv/block_pool.h): position p lives in slot
// table[p / B] * B + p % B.
#pragma once

#include <cstddef>
#include <cstdint>

#include "metal/kv_params.h"

namespace mkv::kv {

constexpr size_t kKVElementBytes = 2;  // the cache holds half

struct LayerLayout {
  uint32_t slots = 0;  // R
  uint32_t n_kv_heads = 0;
  uint32_t head_dim = 0;

  // One token's K (or V) row: (n_kv_heads, head_dim).
  size_t row_elems() const { return size_t(n_kv_heads) * head_dim; }
  size_t row_bytes() const { return row_elems() * kKVElementBytes; }
  // The K block, or the V block: (slots, n_kv_heads, head_dim).
  size_t block_bytes() const { return size_t(slots) * row_bytes(); }
  // The whole region: (2, slots, n_kv_heads, head_dim).
  size_t nbytes() const { return 2 * block_bytes(); }
  // Byte offset, from the region start, of slot s of block kv (0 = K, 1 = V).
  size_t row_offset(uint32_t kv, uint32_t slot) const { return kv * block_bytes() + slot * row_bytes(); }
  size_t k_offset(uint32_t slot) const { return row_offset(0, slot); }
  size_t v_offset(uint32_t slot) const { return row_offset(1, slot); }
  // Element index of (kv, slot, head, d).
  size_t element(uint32_t kv, uint32_t slot, uint32_t head, uint32_t d) const {
    return ((size_t(kv) * slots + slot) * n_kv_heads + head) * head_dim + d;
  }
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
