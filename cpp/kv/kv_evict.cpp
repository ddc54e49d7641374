// KvCache's eviction policy (KvCacheSpec::policy, kv_policy.h): the cache's
// side of an eviction. The policy's state and its choice are the
// EvictionState part's (eviction_state.{h,cpp}); here the rows move and the
// blocks go.
//
// Per eviction of a group (EvictionState::plan): the blocks the moves write
// that a checkpoint still shares are copied first (BlockTable::make_writable,
// which raises, changing nothing, when the pool is short), the plan becomes
// the state, one kv_move_rows dispatch per layer moves the kept rows from past
// keep into the dropped ones, and the table lets the blocks past keep go.
#include <algorithm>

#include "kv/kv_cache.h"
#include "kv/kv_cache_errors.h"
#include "ops/kv_evict.h"

namespace mkv::kv {
using detail::fail;
using detail::Lock;
using detail::str;

uint32_t KvCache::budget(uint32_t layer) const {
  check_layer(layer);
  return eviction_.budget(layer);
}

bool KvCache::evicts(uint32_t layer) const {
  check_layer(layer);
  return eviction_.evicts(layer);
}

uint32_t KvCache::count(uint32_t layer) const {
  check_layer(layer);
  return eviction_.count(layer);
}

std::vector<uint32_t> KvCache::kept_positions(uint32_t layer, uint32_t head) const {
  check_layer(layer);
  return eviction_.kept_positions(layer, head, lengths_[layer]);
}

BufferView KvCache::scores(uint32_t layer) const {
  check_layer(layer);
  return eviction_.scores(layer);
}

uint32_t KvCache::score_rows_from(uint32_t layer, uint32_t n_queries) const {
  check_layer(layer);
  return eviction_.score_rows_from(layer, n_queries, lengths_[layer]);
}

void KvCache::open_prompt(uint32_t n) { eviction_.open_prompt(n, lengths_); }

uint32_t KvCache::room_before_eviction() const {
  uint32_t room = ~0u;
  for (uint32_t l = 0; l < spec_.n_layers; ++l)
    if (eviction_.evicts(l)) room = std::min(room, eviction_.room(l, lengths_[l]));
  return room;
}

BufferView KvCache::verify_share(uint32_t layer, uint32_t row, uint32_t n_rows) {
  check_layer(layer);
  return eviction_.share(layer, row, n_rows, lengths_[layer]);
}

void KvCache::evict(EncoderSession& enc, Group& g, uint32_t n_new) {
  constexpr uint32_t B = kBlockTokens;
  EvictionState::Plan plan = eviction_.plan(g.layers, n_new);
  // 1. blocks a checkpoint shares are copied before the moves write them
  std::vector<BlockCopy> copies;
  {
    Lock lock(pool_->mutex());
    copies = g.table->make_writable(plan.written);  // raises (changing nothing) when the pool is short
  }
  if (!copies.empty()) sync_table(g, 0);
  encode_copies(enc, g, copies);

  // 2. the plan becomes the state; the moves (one list for every layer, in
  // the group's buffer), then the blocks past keep go
  eviction_.apply(g.layers, plan);
  const uint32_t cap = spec_.capacity, H = spec_.n_kv_heads;
  const size_t list_bytes = size_t(g.layers.size()) * H * cap * 3 * sizeof(uint32_t);  // the most moves
  if (!g.moves || g.moves->length() < list_bytes) g.moves = alloc_(list_bytes, "an eviction's move list");
  if (!plan.moves.empty()) g.moves->write(0, plan.moves.data(), plan.moves.size() * sizeof(uint32_t));
  // The moves read their sources through the table as it is now, in a copy:
  // the store after this may put another block where the shrink below lets
  // one go (over a shared pool a checkpoint keeps that one, and the new id
  // differs), and the mirror it writes is read when the moves run, later.
  const std::vector<int64_t>& blocks = g.table->blocks();
  std::vector<uint32_t> ids(blocks.size());
  for (size_t b = 0; b < ids.size(); ++b) ids[b] = blocks[b] < 0 ? 0u : uint32_t(blocks[b]);
  if (!g.move_table || g.move_table->length() < ids.size() * sizeof(uint32_t))
    g.move_table = alloc_(std::max<size_t>(ids.size(), ops::ceil_div(cap, B)) * sizeof(uint32_t),
                          "an eviction's block table copy");
  if (!plan.moves.empty()) g.move_table->write(0, ids.data(), ids.size() * sizeof(uint32_t));
  for (size_t i = 0; i < g.layers.size(); ++i) {
    const uint32_t l = g.layers[i];
    const uint32_t n_moves = uint32_t(plan.first_move[i + 1] - plan.first_move[i]);
    if (n_moves == 0) continue;
    const LayerLayout lay = layout(l);
    const ops::KvMoveDesc d{n_moves, H, spec_.head_dim, lay.k_format, lay.v_format, lay.slots, plan.count};
    ops::kv_move_rows(*device_, enc.compute(), region(l), {g.move_table, 0},
                      {g.moves, plan.first_move[i] * 3 * sizeof(uint32_t)}, d);
  }
  {
    Lock lock(pool_->mutex());
    g.table->shrink(plan.keep);  // (the moves read past keep through move_table: the pool hands those blocks out after them)
  }
}

void KvCache::set_kept(uint32_t layer, uint32_t length, const std::vector<uint32_t>& positions,
                       const float* scores_in) {
  check_layer(layer);
  if (eviction_.evicts(layer) && lengths_[layer] != eviction_.count(layer))
    fail("set_kept needs a layer whose indices are its positions (none evicted yet)");
  eviction_.set_kept(layer, length, positions, scores_in);
  lengths_[layer] = length;
}

}  // namespace mkv::kv
