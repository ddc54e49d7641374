// EvictionState: a KvCache's eviction policy (KvCacheSpec::policy, kv_policy.h),
// the part of the cache that owns what the policy keeps per layer, chooses
// what an eviction drops, and its share of a checkpoint and of a saved cache
// (eviction_state.cpp says how it works; KvCache::evict in kv_evict.cpp moves
// the rows and lets the blocks go).
//
// Per layer: count, the tokens it holds (its length, less what was evicted;
// every layer has one). Per evicting layer (a full layer of a cache with a
// policy): the position of each index per KV head (host, (n_kv_heads,
// capacity) uint32) and, for a scoring policy, one float per (head, index) in
// a device buffer that the store (keynorm) or the attention (h2o, snapkv)
// writes. Per cache: the tokens evicted so far and the prompt open_prompt
// announced.
#pragma once

#include <cstdint>
#include <vector>

#include "gpu/device.h"
#include "kv/kv_budget.h"
#include "kv/encoder_session.h"
#include "kv/kv_policy.h"
#include "ops/ops.h"

namespace mkv::kv {

class EvictionState {
 public:
  // Counts for n_layers layers, all 0; with a policy, the state of each full
  // layer (windows[l] == 0) and one zeroed score buffer for them all.
  void init(gpu::Device& device, const Allocator& alloc, const KvPolicySpec& policy, const std::vector<uint32_t>& windows,
            uint32_t n_kv_heads, uint32_t head_dim, uint32_t capacity);

  const KvPolicySpec& policy() const { return policy_; }
  bool evicts(uint32_t layer) const { return !kept_pos_[layer].empty(); }
  uint32_t count(uint32_t layer) const { return counts_[layer]; }
  uint64_t evicted() const { return evicted_; }
  size_t nbytes() const { return scores_ ? scores_->length() : 0; }  // the scores' device buffer
  // KvCache::budget(): kv_budget, or the capacity without one; a layer's own (pyramidkv).
  uint32_t budget() const { return policy_.budget ? policy_.budget : capacity_; }
  uint32_t budget(uint32_t layer) const { return budgets_.empty() || budgets_[layer] == 0 ? budget() : budgets_[layer]; }
  // The position of each of the layer's count() indices for one head (a layer
  // of `length` positions); position(l, index): head 0's.
  std::vector<uint32_t> kept_positions(uint32_t layer, uint32_t head, uint32_t length) const;
  int64_t position(uint32_t layer, uint32_t index) const;
  ops::BufferView scores(uint32_t layer) const;  // a null view for a layer without
  bool scores_attention(uint32_t layer) const { return evicts(layer) && policy_.traits().scores_attention; }
  // KvCache::score_rows_from, for a layer of `length` positions (its step's queries stored).
  uint32_t score_rows_from(uint32_t layer, uint32_t n_queries, uint32_t length) const;
  // KvCache::room: tokens the layer takes before a store evicts (0: the next store evicts).
  uint32_t room(uint32_t layer, uint32_t length) const;

  // Speculative verification of a scoring-by-attention layer (KvCache::verify_share):
  // row `row` of a segment of n_rows (stored, the layer at `length`) writes
  // its share of the scores here, or nowhere (a null view) when decoding it
  // alone would add none (snapkv outside its window). apply_shares adds the
  // shares of the first `rows` rows, the ones kept (KvCache::truncate first).
  ops::BufferView share(uint32_t layer, uint32_t row, uint32_t n_rows, uint32_t length);
  uint32_t share_stride() const { return share_stride_; }
  void apply_shares(EncoderSession& enc, uint32_t rows);

  // KvCache::open_prompt: the next n tokens are one prompt (lengths: the cache's now).
  void open_prompt(uint32_t n, const std::vector<uint32_t>& lengths);
  // The count past which a store into the layer (of `length` positions)
  // evicts first: the budget, or inside an open prompt what holds it whole.
  uint32_t limit(uint32_t layer, uint32_t length) const;

  // A store of n_new tokens at the layer's next index, positions first ..:
  // their positions and (keynorm) key scores, and the count.
  void stored(EncoderSession& enc, uint32_t layer, const ops::BufferView& k_new, uint32_t first, uint32_t n_new);

  // An eviction of a group's layers (same count, same budget) before a store
  // of n_new: plan() chooses per (layer, head) with the policy's rule and
  // changes nothing (raises when the layers' counts differ); apply() makes it
  // the state, once the cache has made the blocks the moves write its own.
  struct Plan {
    uint32_t count = 0, keep = 0;
    std::vector<std::vector<uint32_t>> kept_pos;  // per layer of the group
    std::vector<uint32_t> moves;                  // (head, from, to): the group's layers' lists, one after another
    std::vector<size_t> first_move;               // per layer: where its list starts (in moves), then the end
    std::vector<uint32_t> written;                // the logical blocks the moves write
    int64_t scores_lo = -1;                       // the group's run of the score buffer (layers), -1: none
    std::vector<float> scores;
  };
  Plan plan(const std::vector<uint32_t>& layers, uint32_t n_new) const;
  void apply(const std::vector<uint32_t>& layers, Plan& plan);

  // The cache's other moves: truncated to n (lengths: before; a layer that
  // has evicted goes back over the rows stored since, no further: KvCache::truncate checks),
  // reset, every layer starting at first[l] (an adopted prefix or a saved
  // cache read back).
  void truncated(uint32_t n, const std::vector<uint32_t>& lengths);
  void reset();
  void start_at(const std::vector<uint32_t>& first);
  // Rows stored into the layer since its last eviction: those a truncate can take back.
  uint32_t since_eviction(uint32_t layer) const { return since_[layer]; }

  // A saved evicting layer put back (KvCache::set_kept): its count() indices
  // become these positions ((n_kv_heads, count) uint32) with these scores
  // (null: zero) in a layer of `length` positions. Raises before changing anything.
  void set_kept(uint32_t layer, uint32_t length, const std::vector<uint32_t>& positions, const float* scores);

  // Its share of a checkpoint: the host state and a copy of the scores.
  struct Saved {
    std::vector<uint32_t> counts, since;
    std::vector<std::vector<uint32_t>> kept_pos;
    std::vector<float> scores;
    uint64_t evicted = 0;
    uint32_t prompt_start = 0, prompt_end = 0;
  };
  Saved save() const;
  void restore(const Saved& saved);

 private:
  void clear_scores(uint32_t layer, uint32_t from);  // zeroes indices from.. of every head
  uint32_t observed_from(uint32_t layer, uint32_t count, uint32_t length) const;  // snapkv's window's first index

  gpu::Device* device_ = nullptr;  // the cache's (it outlives this part)
  Allocator alloc_;                // its buffers: the cache's (kv_budget.h)
  KvPolicySpec policy_;
  uint32_t n_kv_heads_ = 0, head_dim_ = 0, capacity_ = 0;
  std::vector<uint32_t> counts_;                 // per layer
  std::vector<uint32_t> since_;                  // per layer: rows stored since its last eviction
  std::vector<uint32_t> budgets_;                // per layer with a policy: budget(layer) (0: sliding)
  std::vector<std::vector<uint32_t>> kept_pos_;  // evicting layers: (n_kv_heads, capacity) positions
  gpu::BufferPtr scores_;                        // a scoring policy's: (n_kv_heads, capacity) float per layer
  std::vector<int64_t> score_at_;                // per layer: its place in scores_, -1 without
  uint32_t n_scored_ = 0;                        // layers with a place
  // verified rows' shares: (rows, scored layers, n_kv_heads, share_stride_)
  // float, share_stride_ the largest budget; which rows of each layer wrote one
  gpu::BufferPtr shares_;
  uint32_t share_stride_ = 0, share_rows_ = 0;
  std::vector<uint32_t> share_mask_;
  uint64_t evicted_ = 0;
  uint32_t prompt_start_ = 0, prompt_end_ = 0;   // the open prompt, positions [start, end) (end 0: none)
};

}  // namespace mkv::kv
