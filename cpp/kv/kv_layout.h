// The one definition of how a layer's KV cache is laid out in device memory.
// Attention kernels, the stores and the Python views all derive offsets from
// here; docs/KV_CACHE.md describes the same layout in prose.
//
// A layer's region is half precision, shaped (2, R, n_kv_heads, head_dim):
// the K block (R, n_kv_heads, head_dim), then the V block of the same shape.
// R = slots. The token at position p lives in slot p % R. After n tokens have
// been stored (n = the position of the next token), slot s < min(n, R) holds
// position (n-1) - ((n-1-s) mod R); slots at or past min(n, R) are empty.
// A full layer has R = capacity and never wraps (n <= R); a sliding layer is a
// ring of R = window + max_chunk - 1 slots (see layer_slots).
#pragma once

#include <cstddef>
#include <cstdint>

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

// Slots of a layer. Full (window 0): capacity. Sliding with window W (a query
// at position q attends keys at q-W < p <= q): W + max_chunk - 1, because a
// chunk of max_chunk queries stored in one call needs the W-1 keys before its
// first query plus the chunk itself; with max_chunk = 1 that is W exactly.
// A ring that would be larger than capacity is pointless (capacity bounds the
// context), so such a sliding layer gets capacity slots and, like a full
// layer, never wraps: it overflows past capacity.
inline uint32_t layer_slots(uint32_t window, uint32_t capacity, uint32_t max_chunk) {
  if (window == 0) return capacity;
  const uint64_t ring = uint64_t(window) + max_chunk - 1;
  return ring < capacity ? uint32_t(ring) : capacity;
}

// True when the layer is a ring buffer (it may hold more than R tokens ever).
inline bool layer_wraps(uint32_t window, uint32_t capacity, uint32_t max_chunk) {
  return window != 0 && uint64_t(window) + max_chunk - 1 <= capacity;
}

inline uint32_t slot_of(uint64_t pos, uint32_t slots) { return uint32_t(pos % slots); }

// Position held by slot s of a layer holding n tokens in R slots; -1 if empty.
inline int64_t slot_position(uint64_t n, uint32_t slots, uint32_t s) {
  const uint64_t held = n < slots ? n : slots;
  if (s >= held) return -1;
  return int64_t((n - 1) - ((n - 1 - s) % slots));
}

}  // namespace mkv::kv
