// ResidualRing: a KvCache's residual window (KvCacheSpec::residual; docs/
// KV_QUANT.md "Residual window"), the part of the cache that owns the ring of
// recent f16 rows beside a quantized pool, its upkeep, and its share of a
// checkpoint and of a saved cache (kv_residual.cpp says how it works).
//
// Layout: every layer with a quantized K or V has a ring, its K (slots,
// n_kv_heads, head_dim) half then its V; position p at slot p % slots. lo(l):
// the ring holds the rows of positions lo .. length - 1 (a prefix adopted from
// the prefix cache, a saved cache read back or a deep truncate leave the rows
// below it to the pool: the queries read them quantized even in their window).
#pragma once

#include <cstdint>
#include <vector>

#include "gpu/device.h"
#include "kv/kv_budget.h"
#include "kv/kv_layout.h"
#include "ops/attention.h"
#include "ops/ops.h"

namespace mkv::kv {

class ResidualRing {
 public:
  // Rings for the layers whose layout quantizes K or V, of max_chunk + residual +
  // a block less one positions in whole blocks; none at all with residual 0.
  // The buffer is made by the first store (ensure()) and let go by release():
  // a cache waiting in a queue, or emptied, holds none (kv_memory counts it).
  void init(const Allocator& alloc, uint32_t residual, uint32_t max_chunk, const std::vector<LayerLayout>& layouts);
  // The bytes of that buffer (0 without rings), made or not.
  static size_t bytes_for(uint32_t residual, uint32_t max_chunk, const std::vector<LayerLayout>& layouts);
  size_t full_nbytes() const { return full_bytes_; }
  void ensure();
  void release();

  bool has(uint32_t layer) const { return index_.at(layer) >= 0; }
  uint32_t residual() const { return residual_; }
  uint32_t slots() const { return slots_; }
  uint32_t lo(uint32_t layer) const { return lo_.at(layer); }
  ops::BufferView view(uint32_t layer) const;  // a null view for a layer without one
  size_t nbytes() const { return buffer_ ? buffer_->length() : 0; }
  // Whether some ring holds a row of its layer's length positions.
  bool holds_rows(const std::vector<uint32_t>& lengths) const;
  // Sets d's residual, ring_slots, ring_lo and ring for attention over `layer`
  // (nothing without one, or before the first store: then the ring holds no row).
  void describe(uint32_t layer, ops::AttentionDesc& d) const;

  // Upkeep. A store ending at `end` overwrote the slots of end - slots and below;
  // rows written into the pool at [first, end) are not in the ring; a truncate to
  // n keeps what was valid below n; every layer starting over at `first`.
  void stored(uint32_t layer, uint32_t end);
  void pool_written(uint32_t layer, uint32_t end);
  void truncated(uint32_t n);
  void start_at(const std::vector<uint32_t>& first) { lo_ = first; }
  void start_all_at(uint32_t n) { lo_.assign(lo_.size(), n); }

  // What a saved cache keeps of the window: the f16 rows of positions first ..
  // first + n - 1 of a layer holding `length`, K and V, n * row bytes each (GpuError
  // when the ring does not hold them). write() puts them back as the rows of the
  // layer's last positions (first + n = length) and makes first its lo.
  void read(uint32_t layer, uint32_t first, uint32_t n, uint32_t length, uint8_t* k, uint8_t* v) const;
  void write(uint32_t layer, uint32_t first, uint32_t n, uint32_t length, const uint8_t* k, const uint8_t* v);

  // Its share of a checkpoint: the whole ring when the call may write it (whole)
  // and it holds a row of `lengths`, and every layer's lo. restore() puts the copy
  // back; without one, a ring that held no row holds none again (its lo), and one
  // the call did not write keeps what the call cannot have made valid (the larger lo).
  struct Saved {
    gpu::BufferPtr copy;
    std::vector<uint32_t> lo;
    bool written = false;  // the call may write the ring
  };
  Saved save(gpu::CommandQueue& queue, bool whole, const std::vector<uint32_t>& lengths) const;
  void restore(gpu::CommandQueue& queue, const Saved& saved);

 private:
  void copy_rows(uint32_t layer, uint32_t first, uint32_t n, uint8_t* k, uint8_t* v, bool write) const;

  gpu::BufferPtr buffer_;      // every ringed layer's K ring, then its V ring, in index_ order
  Allocator alloc_;
  size_t full_bytes_ = 0;      // buffer_'s length once made
  uint32_t residual_ = 0;
  uint32_t slots_ = 0;
  size_t row_bytes_ = 0;       // one position's f16 row: n_kv_heads * head_dim * 2
  std::vector<int32_t> index_;  // per layer: its place in buffer_, -1 without one
  std::vector<uint32_t> lo_;    // per layer
};

}  // namespace mkv::kv
