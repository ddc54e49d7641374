// KvPool: the device memory of a paged KV cache — per layer one pool buffer,
// (2, n_blocks * B, n_kv_heads, head_dim) half, cut into blocks of B =
// kBlockTokens slots — and per window group (the layers of one window, 0 =
// full) the BlockPool that hands out its block ids. Sequences (kv::KvCache)
// hold block tables over it: one KvPool may serve one cache (sized for one
// sequence) or every cache of an engine (sized by a memory budget).
//
// Threads: caches of one pool may be used and freed from different threads
// (the engine's scheduler, Python's garbage collector); every change to the
// block bookkeeping happens under mutex(), which KvCache takes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gpu/device.h"
#include "kv/block_pool.h"
#include "kv/kv_budget.h"
#include "kv/kv_layout.h"
#include "kv/prefix_rows.h"
#include "ops/ops.h"

namespace mkv::kv {

struct KvPoolSpec {
  uint32_t n_kv_heads = 0;
  uint32_t head_dim = 0;
  std::vector<uint32_t> windows;       // per layer: 0 = full, W = sliding
  std::vector<uint32_t> group_blocks;  // per group, in order of first appearance in windows
  std::vector<uint32_t> k_formats;     // per layer (metal/kv_format.h); empty: all f16
  std::vector<uint32_t> v_formats;
  bool rotate = false;                 // Hadamard-rotate the layers whose K or V is quantized
  bool split_full = false;             // each full layer a group of its own (per-layer budgets: pyramidkv)

  uint32_t k_format(uint32_t layer) const { return k_formats.empty() ? 0u : k_formats.at(layer); }
  uint32_t v_format(uint32_t layer) const { return v_formats.empty() ? 0u : v_formats.at(layer); }
  // Layer l's layout with `slots` slots.
  LayerLayout layout(uint32_t layer, uint32_t slots) const {
    return {slots, n_kv_heads, head_dim, k_format(layer), v_format(layer),
            rotate && (k_format(layer) != 0 || v_format(layer) != 0)};
  }
  // Raises ArgumentError for formats that do not fit (or per-layer lists of the wrong length).
  void check_formats() const;
  // Raises ArgumentError("[op] the engine's shared KV pool ...") unless a cache of these formats
  // (per layer; empty: f16) and rotation can live in this pool (a pool holds only its own).
  void check_serves(const std::vector<uint32_t>& k, const std::vector<uint32_t>& v, bool rotated,
                    const std::string& op) const;
};

class KvPool {
 public:
  // budget: an engine's kv_memory (kv_budget.h), which the pool's buffers are
  // charged to and its caches' own buffers after them; null for a cache's own pool.
  KvPool(gpu::DevicePtr device, KvPoolSpec spec, KvBudgetPtr budget = nullptr);  // raises GpuError "[kv_pool] ..."

  // The group of each layer: by window, in order of first appearance, or with
  // split_full each full layer its own group.
  static std::vector<uint32_t> layer_groups(const std::vector<uint32_t>& windows, bool split_full = false);
  // The blocks one sequence of `capacity` tokens needs in each group (see
  // kv_layout.h group_blocks), groups in order of first appearance.
  static std::vector<uint32_t> sequence_blocks(const std::vector<uint32_t>& windows, uint32_t capacity,
                                               uint32_t max_chunk);
  // A pool in `bytes` (or less) for layers shaped as `shape` (its
  // group_blocks are ignored): the sequence's blocks of each group scaled
  // by bytes / (one sequence's bytes), full groups rounded down, sliding ones
  // at least twice one sequence's and a block (a sliding layer needs its whole
  // window to run, and a call's checkpoint keeps the window it started with).
  // Raises ArgumentError(kv_memory) when that does not fit, or leaves a group
  // without a block. kept: of `bytes`, what is kept for sequences' own buffers
  // (kv_budget.h): the blocks get the rest.
  static KvPoolSpec for_budget(KvPoolSpec shape, uint32_t capacity, uint32_t max_chunk, size_t bytes,
                               size_t kept = 0);
  // Bytes of a pool with spec's blocks per group, in its formats.
  static size_t pool_bytes(const KvPoolSpec& spec);

  const KvPoolSpec& spec() const { return spec_; }
  uint32_t n_layers() const { return uint32_t(spec_.windows.size()); }
  uint32_t n_groups() const { return uint32_t(groups_.size()); }
  uint32_t group_of(uint32_t layer) const;
  uint32_t group_window(uint32_t group) const { return groups_.at(group).window; }
  const std::vector<uint32_t>& group_layers(uint32_t group) const { return groups_.at(group).layers; }
  BlockPool& blocks(uint32_t group) { return *groups_.at(group).pool; }
  const BlockPool& blocks(uint32_t group) const { return *groups_.at(group).pool; }

  ops::BufferView region(uint32_t layer) const;  // the layer's pool buffer
  LayerLayout layout(uint32_t layer) const;      // slots = its group's blocks * B
  size_t block_bytes(uint32_t group) const;      // one block id: its K and V rows in every layer of the group
  size_t nbytes() const;                         // every layer's pool buffer
  std::recursive_mutex& mutex() const { return mutex_; }
  const KvBudgetPtr& budget() const { return budget_; }
  // The residual windows' f16 rows beside the prefix cache's blocks (prefix_rows.h).
  PrefixRows& prefix_rows() { return prefix_rows_; }
  const PrefixRows& prefix_rows() const { return prefix_rows_; }

 private:
  struct Group {
    uint32_t window = 0;
    std::vector<uint32_t> layers;
    std::unique_ptr<BlockPool> pool;
  };
  void check_layer(uint32_t layer) const;
  KvPoolSpec spec_;
  std::vector<Group> groups_;
  std::vector<uint32_t> group_index_;  // per layer
  std::vector<gpu::BufferPtr> buffers_;
  KvBudgetPtr budget_;
  PrefixRows prefix_rows_;
  mutable std::recursive_mutex mutex_;
};

}  // namespace mkv::kv
