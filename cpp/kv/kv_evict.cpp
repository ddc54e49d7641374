// KVCache's eviction policy (KVCacheSpec::policy, kv_policy.h): the state it
// keeps per full layer, the eviction a store runs when the budget is reached,
// and its part in checkpoints.
//
// State per evicting layer: the position of each index per KV head (host,
// (n_kv_heads, capacity) uint32, what the rule and saved caches read), and for
// a scoring policy a device buffer of one float per (head, index) that the
// store (keynorm) or the attention (h2o, snapkv) writes.
//
// An eviction (before a store of n_new tokens that would pass capacity) runs
// for every layer of the full group at once (they share the block table): the
// count drops to keep = (capacity - n_new) rounded down to a whole block, so a
// decode step evicts a block's worth of tokens once per 32 steps. Per (layer,
// head) the rule picks keep indices; the kept rows at indices >= keep move into
// the dropped ones below keep (one kv_move_rows dispatch per layer, a move per
// row: its sources and destinations never meet, so the moves need no order),
// positions and scores move with them on the host, and the table lets the
// blocks past keep go. Index order then no longer follows position order; no
// kernel needs it to (attention is a sum over keys; the new tokens always come
// after every kept one). A destination block a checkpoint still shares is
// copied first (BlockTable::make_writable).
#include <algorithm>

#include "kv/kv_cache.h"
#include "ops/kv_evict.h"

namespace mkv::kv {
namespace {

[[noreturn]] void fail(const std::string& message) { ops::fail("kv_cache", message); }
std::string str(uint64_t v) { return std::to_string(v); }
using Lock = std::lock_guard<std::recursive_mutex>;

}  // namespace

void KVCache::init_policy() {
  const KvPolicySpec& p = spec_.policy;
  counts_.assign(spec_.n_layers, 0);
  kept_pos_.assign(spec_.n_layers, {});
  scores_.assign(spec_.n_layers, nullptr);
  if (p.kind == PolicyKind::none) return;
  const size_t per_layer = size_t(spec_.n_kv_heads) * spec_.capacity;
  for (uint32_t l = 0; l < spec_.n_layers; ++l) {
    if (spec_.windows[l] != 0) continue;
    kept_pos_[l].assign(per_layer, 0);
    if (policy_scores_keys(p.kind) || policy_scores_attention(p.kind)) {
      scores_[l] = device_->new_buffer(per_layer * sizeof(float));
      clear_scores(l, 0);
    }
  }
}

bool KVCache::evicts(uint32_t layer) const {
  check_layer(layer);
  return !kept_pos_[layer].empty();
}

uint32_t KVCache::count(uint32_t layer) const {
  check_layer(layer);
  return counts_[layer];
}

std::vector<uint32_t> KVCache::kept_positions(uint32_t layer, uint32_t head) const {
  check_layer(layer);
  if (head >= spec_.n_kv_heads)
    fail("head " + str(head) + " is out of range; the cache has " + str(spec_.n_kv_heads) + " KV heads");
  std::vector<uint32_t> out(counts_[layer]);
  for (uint32_t i = 0; i < counts_[layer]; ++i)
    out[i] = evicts(layer) ? kept_pos_[layer][size_t(head) * spec_.capacity + i] : i + lengths_[layer] - counts_[layer];
  return out;
}

BufferView KVCache::scores(uint32_t layer) const {
  check_layer(layer);
  return {scores_[layer], 0};
}

bool KVCache::scores_attention(uint32_t layer) const {
  return evicts(layer) && policy_scores_attention(spec_.policy.kind);
}

uint32_t KVCache::score_rows_from(uint32_t layer, uint32_t n_queries) const {
  check_layer(layer);
  if (spec_.policy.kind != PolicyKind::snapkv) return 0;
  const uint32_t first_index = counts_[layer] - n_queries;  // of the step's queries (stored already)
  const uint32_t observed = spec_.capacity > spec_.policy.window ? spec_.capacity - spec_.policy.window : 0;
  return observed > first_index ? std::min(observed - first_index, n_queries) : 0;
}

void KVCache::clear_scores(uint32_t layer, uint32_t from) {
  if (!scores_[layer] || from >= spec_.capacity) return;
  const std::vector<float> zeros(spec_.capacity - from, 0.0f);
  for (uint32_t h = 0; h < spec_.n_kv_heads; ++h)
    scores_[layer]->write((size_t(h) * spec_.capacity + from) * sizeof(float), zeros.data(), zeros.size() * sizeof(float));
}

void KVCache::evict(EncoderSession& enc, Group& g, uint32_t n_new) {
  constexpr uint32_t B = kBlockTokens;
  const uint32_t count = counts_[g.layers[0]];
  for (uint32_t l : g.layers)
    if (counts_[l] != count)
      fail("layer " + str(l) + " holds " + str(counts_[l]) + " tokens and layer " + str(g.layers[0]) + " " +
           str(count) + "; an eviction (kv_policy) runs for the full layers together: store them in step");
  const uint32_t keep = (spec_.capacity - n_new) / B * B;  // check_policy: > sinks
  const uint32_t cap = spec_.capacity, H = spec_.n_kv_heads;
  const bool scored = scores_[g.layers[0]] != nullptr;

  // 1. per layer and head, the rule's choice and the moves it makes
  std::vector<std::vector<uint32_t>> moves(g.layers.size());
  std::vector<std::vector<float>> scores(g.layers.size());
  std::vector<uint8_t> written(ops::ceil_div(keep, B), 0);  // logical blocks a move writes
  for (size_t i = 0; i < g.layers.size(); ++i) {
    const uint32_t l = g.layers[i];
    std::vector<float>& s = scores[i];
    if (scored) {
      s.resize(size_t(H) * cap);
      scores_[l]->read(0, s.data(), s.size() * sizeof(float));
    }
    for (uint32_t h = 0; h < H; ++h) {
      uint32_t* pos = kept_pos_[l].data() + size_t(h) * cap;
      float* sc = scored ? s.data() + size_t(h) * cap : nullptr;
      const std::vector<uint32_t> kept = select_kept(spec_.policy, pos, sc, count, keep);
      std::vector<uint8_t> is_kept(count, 0);
      for (uint32_t k : kept) is_kept[k] = 1;
      uint32_t hole = 0;
      for (uint32_t from = keep; from < count; ++from) {
        if (!is_kept[from]) continue;
        while (is_kept[hole]) ++hole;  // kept rows past keep = dropped rows below it
        moves[i].insert(moves[i].end(), {h, from, hole});
        written[hole / B] = 1;
        pos[hole] = pos[from];
        if (sc) sc[hole] = sc[from];
        ++hole;
      }
      // (snapkv observes anew from here on; the others' scores stay with their rows)
      if (sc) std::fill(sc + (spec_.policy.kind == PolicyKind::snapkv ? 0 : keep), sc + cap, 0.0f);
    }
  }

  // 2. blocks a checkpoint shares are copied before the moves write them
  std::vector<uint32_t> logical;
  for (uint32_t b = 0; b < written.size(); ++b)
    if (written[b]) logical.push_back(b);
  std::vector<BlockCopy> copies;
  {
    Lock lock(pool_->mutex());
    copies = g.table->make_writable(logical);  // raises (changing nothing) when the pool is short
  }
  if (!copies.empty()) sync_table(g, 0);
  encode_copies(enc, g, copies);

  // 3. the moves, then the blocks past keep go
  for (size_t i = 0; i < g.layers.size(); ++i) {
    const uint32_t l = g.layers[i];
    if (scored) scores_[l]->write(0, scores[i].data(), scores[i].size() * sizeof(float));
    counts_[l] = keep;
    if (moves[i].empty()) continue;
    gpu::BufferPtr list = device_->new_buffer(moves[i].size() * sizeof(uint32_t));
    list->write(0, moves[i].data(), moves[i].size() * sizeof(uint32_t));
    const LayerLayout lay = layout(l);
    const ops::KvMoveDesc d{uint32_t(moves[i].size() / 3), H, spec_.head_dim, lay.k_format, lay.v_format,
                            lay.slots, count};
    ops::kv_move_rows(enc.compute(), *device_, region(l), table(l), {list, 0}, d);
  }
  {
    Lock lock(pool_->mutex());
    g.table->shrink(keep);  // the moves read past keep: the pool hands those blocks out after them
  }
  evicted_ += count - keep;
}

void KVCache::note_policy_store(EncoderSession& enc, uint32_t layer, const BufferView& k_new, uint32_t index,
                                uint32_t n_new) {
  const uint32_t n = lengths_[layer];
  for (uint32_t h = 0; h < spec_.n_kv_heads; ++h)
    for (uint32_t t = 0; t < n_new; ++t) kept_pos_[layer][size_t(h) * spec_.capacity + index + t] = n + t;
  if (policy_scores_keys(spec_.policy.kind))
    ops::kv_key_scores(enc.compute(), *device_, k_new, scores(layer),
                       {n_new, spec_.n_kv_heads, spec_.head_dim, index, spec_.capacity});
}

void KVCache::save_policy(Checkpoint& cp) const {
  cp.counts = counts_;
  cp.kept_pos = kept_pos_;
  cp.evicted = evicted_;
  cp.scores.assign(spec_.n_layers, {});
  for (uint32_t l = 0; l < spec_.n_layers; ++l)
    if (scores_[l]) {
      cp.scores[l].resize(size_t(spec_.n_kv_heads) * spec_.capacity);
      scores_[l]->read(0, cp.scores[l].data(), cp.scores[l].size() * sizeof(float));
    }
}

void KVCache::restore_policy(const Checkpoint& cp) {
  counts_ = cp.counts;
  kept_pos_ = cp.kept_pos;
  evicted_ = cp.evicted;
  for (uint32_t l = 0; l < spec_.n_layers; ++l)
    if (scores_[l]) scores_[l]->write(0, cp.scores[l].data(), cp.scores[l].size() * sizeof(float));
}

}  // namespace mkv::kv
