// KvCache's accounting: the blocks a call may take (what a shared pool's
// scheduler reserves) and the cache's bytes, exact.
#include "kv/kv_cache.h"
#include "kv/kv_cache_errors.h"

#include <algorithm>

#include "ops/ops.h"

namespace mkv::kv {
using detail::Lock;
using ops::ceil_div;

size_t KvCache::layer_nbytes(uint32_t layer) const { return layout(layer).nbytes(); }

size_t KvCache::staging_nbytes() const { return staging_ ? staging_->length() : 0; }

size_t KvCache::table_nbytes() const {
  size_t total = 0;
  for (const Group& g : groups_) total += g.mirror ? g.mirror->length() : 0;
  return total;
}

std::vector<uint32_t> KvCache::blocks_to_store(uint32_t keep, uint64_t n_store) const {
  std::vector<uint32_t> out;
  for (const Group& g : groups_) {
    const uint64_t stored = n_store > (uint64_t(1) << 40) ? (uint64_t(1) << 40) : n_store;  // no overflow below
    const uint64_t end = std::min<uint64_t>(keep + stored, g.wraps ? ~uint64_t(0) : spec_.capacity);
    const uint64_t from = keep / kBlockTokens, to = (end + kBlockTokens - 1) / kBlockTokens;  // from: the tail
    uint64_t need = to > from ? to - from : 0;                                               // (copied when shared)
    if (g.window != 0) need = std::min<uint64_t>(need, group_blocks(g.window, spec_.capacity, spec_.max_chunk) + 1);
    // an evicting group: its budget's blocks and a tail, and a copy of each
    // block an eviction writes while a checkpoint shares it
    if (g.evicts) need = std::min<uint64_t>(need, 2 * group_blocks(0, spec_.capacity, spec_.max_chunk) + 1);
    out.push_back(uint32_t(need));
  }
  return out;
}

bool KvCache::reserve(const std::vector<uint32_t>& per_group) {
  Lock lock(pool_->mutex());
  for (size_t g = 0; g < groups_.size(); ++g)
    if (!groups_[g].table->reserve(per_group.at(g))) {
      for (size_t h = 0; h < g; ++h) groups_[h].table->unreserve();
      return false;
    }
  return true;
}

bool KvCache::top_up(uint32_t n) {
  Lock lock(pool_->mutex());
  std::vector<uint32_t> more(groups_.size(), 0);
  for (uint32_t g = 0; g < groups_.size(); ++g) {
    const BlockTable& t = *groups_[g].table;
    const uint32_t need = t.blocks_needed(n);
    more[g] = need > t.reserved() ? need - t.reserved() : 0;
    if (more[g] > pool_->blocks(g).available()) return false;
  }
  for (uint32_t g = 0; g < groups_.size(); ++g)
    if (more[g]) groups_[g].table->reserve(more[g]);  // (checked above, under the same lock)
  return true;
}

void KvCache::unreserve() {
  Lock lock(pool_->mutex());
  for (Group& g : groups_) g.table->unreserve();
}

size_t KvCache::held_nbytes() const {
  Lock lock(pool_->mutex());
  size_t total = 0;
  for (uint32_t g = 0; g < groups_.size(); ++g) total += groups_[g].table->held_blocks() * pool_->block_bytes(g);
  return total;
}

size_t KvCache::nbytes() const {
  return (owns_pool_ ? pool_->nbytes() : held_nbytes()) + staging_nbytes() + table_nbytes() + ring_nbytes() +
         eviction_.nbytes();
}

namespace {
size_t mirror_bytes(uint32_t capacity) { return size_t(ceil_div(capacity, kBlockTokens)) * sizeof(uint32_t); }
// An evicting group's move list (kv_evict.cpp): 3 uint32 per index of each layer and head; and its table copy.
size_t move_list_bytes(size_t layers, const KvCacheSpec& s) { return layers * s.n_kv_heads * s.capacity * 3 * 4; }
size_t move_table_bytes(const KvCacheSpec& s) { return mirror_bytes(s.capacity); }
}  // namespace

size_t KvCache::staging_bytes(const KvCacheSpec& spec, const KvPoolSpec& shape) {
  size_t most = 0;  // the layer whose formats take the most bytes a token (staging_for)
  for (uint32_t l = 0; l < shape.windows.size(); ++l)
    most = std::max(most, shape.layout(l, kBlockTokens).nbytes() / kBlockTokens);
  return size_t(spec.max_chunk) * most;
}

size_t KvCache::own_bytes_to_run(uint32_t keep, uint64_t n_store) const {
  Lock lock(pool_->mutex());
  size_t total = 0;
  for (const Group& g : groups_) {
    if (!g.mirror) total += mirror_bytes(spec_.capacity);
    if (g.evicts && !g.moves) total += move_list_bytes(g.layers.size(), spec_) + move_table_bytes(spec_);
  }
  if (spec_.store == StorePath::blit && !staging_) total += staging_bytes(spec_, pool_->spec());
  total += ring_.full_nbytes() - ring_.nbytes();
  if ((n_store > 0 || keep < lengths_[0]) && ring_.holds_rows(lengths_)) total += ring_.full_nbytes();
  return total;
}

size_t KvCache::own_bytes_to_run(const KvCacheSpec& spec, const KvPoolSpec& shape) {
  std::vector<LayerLayout> layouts;
  for (uint32_t l = 0; l < shape.windows.size(); ++l) layouts.push_back(shape.layout(l, kBlockTokens));
  const std::vector<uint32_t> groups = KvPool::layer_groups(shape.windows, shape.split_full);
  const size_t n_groups = groups.empty() ? 0 : *std::max_element(groups.begin(), groups.end()) + 1;
  size_t total = n_groups * mirror_bytes(spec.capacity) + ResidualRing::bytes_for(spec.residual, spec.max_chunk, layouts);
  if (spec.store == StorePath::blit) total += staging_bytes(spec, shape);
  if (spec.policy.evicts()) {  // the full group evicts: its scores (EvictionState), move list and table copy
    const size_t full = size_t(std::count(shape.windows.begin(), shape.windows.end(), 0u));
    const PolicyTraits t = spec.policy.traits();
    if (t.scores_keys || t.scores_attention) total += full * spec.n_kv_heads * spec.capacity * sizeof(float);
    if (full) total += move_list_bytes(full, spec) + move_table_bytes(spec);
  }
  return total;
}

void KvCache::make_own_buffers() {
  Lock lock(pool_->mutex());
  for (Group& g : groups_) {
    if (!g.mirror) sync_table(g, 0);
    if (g.evicts && !g.moves) {
      g.moves = alloc_(move_list_bytes(g.layers.size(), spec_), "an eviction's move list");
      g.move_table = alloc_(move_table_bytes(spec_), "an eviction's block table copy");
    }
  }
  if (spec_.store == StorePath::blit) staging_for(spec_.max_chunk);
  ring_.ensure();
}

size_t KvCache::bytes_per_token() const {
  size_t total = 0;
  for (uint32_t l = 0; l < spec_.n_layers; ++l)
    if (!wraps(l)) total += layout(l).slot_bytes(0) + layout(l).slot_bytes(1);
  return total;
}

}  // namespace mkv::kv
