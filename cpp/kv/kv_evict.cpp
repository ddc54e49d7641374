// KvCache's eviction policy (KvCacheSpec::policy, kv_policy.h): the state it
// keeps per full layer, the eviction a store runs when the budget is reached,
// and its part in checkpoints.
//
// State per evicting layer: the position of each index per KV head (host,
// (n_kv_heads, capacity) uint32, what the rule and saved caches read), and for
// a scoring policy a device buffer of one float per (head, index) that the
// store (keynorm) or the attention (h2o, snapkv) writes.
//
// An eviction (before a store of n_new tokens that would pass the budget, or
// inside a prompt held whole the prompt's end: evict_limit) runs for every
// layer of its group at once (the full layers share a block table; pyramidkv's
// are a group each, with budgets of their own): the
// count drops to keep (kv_policy.h evict_keep of the budget: room for the store in whole
// blocks, and at most the budget less a step of a sixteenth of it, in whole
// blocks), so decode evicts a block's worth or more at a time, not a token per
// step: the rule's selection and the copies are paid once per step tokens. Per (layer,
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
#include "kv/kv_cache_errors.h"
#include "ops/kv_evict.h"

namespace mkv::kv {
using detail::fail;
using detail::Lock;
using detail::str;

uint32_t KvCache::budget(uint32_t layer) const {
  check_layer(layer);
  return budgets_.empty() || budgets_[layer] == 0 ? budget() : budgets_[layer];
}

void KvCache::init_policy() {
  const KvPolicySpec& p = spec_.policy;
  budgets_ = p.kind == PolicyKind::none ? std::vector<uint32_t>{} : layer_budgets(p, spec_.windows);
  counts_.assign(spec_.n_layers, 0);
  kept_pos_.assign(spec_.n_layers, {});
  score_at_.assign(spec_.n_layers, -1);
  if (p.kind == PolicyKind::none) return;
  const size_t per_layer = size_t(spec_.n_kv_heads) * spec_.capacity;
  const bool scored = policy_scores_keys(p.kind) || policy_scores_attention(p.kind);
  int64_t n_scored = 0;
  for (uint32_t l = 0; l < spec_.n_layers; ++l) {
    if (spec_.windows[l] != 0) continue;
    kept_pos_[l].assign(per_layer, 0);
    if (scored) score_at_[l] = n_scored++;
  }
  if (n_scored) {  // one buffer: an eviction reads and writes every layer's in one copy each
    scores_ = device_->new_buffer(size_t(n_scored) * per_layer * sizeof(float));
    const std::vector<float> zeros(size_t(n_scored) * per_layer, 0.0f);
    scores_->write(0, zeros.data(), zeros.size() * sizeof(float));
  }
}

bool KvCache::evicts(uint32_t layer) const {
  check_layer(layer);
  return !kept_pos_[layer].empty();
}

uint32_t KvCache::count(uint32_t layer) const {
  check_layer(layer);
  return counts_[layer];
}

std::vector<uint32_t> KvCache::kept_positions(uint32_t layer, uint32_t head) const {
  check_layer(layer);
  if (head >= spec_.n_kv_heads)
    fail("head " + str(head) + " is out of range; the cache has " + str(spec_.n_kv_heads) + " KV heads");
  std::vector<uint32_t> out(counts_[layer]);
  for (uint32_t i = 0; i < counts_[layer]; ++i)
    out[i] = evicts(layer) ? kept_pos_[layer][size_t(head) * spec_.capacity + i] : i + lengths_[layer] - counts_[layer];
  return out;
}

BufferView KvCache::scores(uint32_t layer) const {
  check_layer(layer);
  if (score_at_[layer] < 0) return {};
  return {scores_, size_t(score_at_[layer]) * spec_.n_kv_heads * spec_.capacity * sizeof(float)};
}

bool KvCache::scores_attention(uint32_t layer) const {
  return evicts(layer) && policy_scores_attention(spec_.policy.kind);
}

uint32_t KvCache::score_rows_from(uint32_t layer, uint32_t n_queries) const {
  check_layer(layer);
  if (!spec_.policy.observes()) return 0;
  const uint32_t count = counts_[layer], length = lengths_[layer];  // the step's queries are stored already
  const uint32_t first_index = count - n_queries;
  // the observation window: the last `window` indices before the eviction to
  // come, at the budget or, inside an open prompt, at the prompt's end
  uint32_t end = budget(layer);
  if (length > prompt_.start && length <= prompt_.end)
    end = uint32_t(std::min<uint64_t>(spec_.capacity, uint64_t(count) + (prompt_.end - length)));
  const uint32_t observed = end > spec_.policy.window ? end - spec_.policy.window : 0;
  return observed > first_index ? std::min(observed - first_index, n_queries) : 0;
}

void KvCache::open_prompt(uint32_t n) {
  prompt_ = {};
  uint32_t full = spec_.n_layers;
  for (uint32_t l = 0; l < spec_.n_layers && full == spec_.n_layers; ++l)
    if (evicts(l)) full = l;
  if (n == 0 || full == spec_.n_layers || !spec_.policy.holds_prompts()) return;
  prompt_.start = lengths_[full];
  prompt_.end = uint32_t(std::min<uint64_t>(uint64_t(prompt_.start) + n, ~uint32_t(0)));
}

uint32_t KvCache::evict_limit(uint32_t layer) const {
  const uint32_t c = counts_[layer], len = lengths_[layer], b = budget(layer);
  // inside the open prompt: past its first store, or at it when no earlier
  // prompt waits to be compressed (a count over the budget) first
  const bool inside = len >= prompt_.start && len < prompt_.end && (len > prompt_.start || c <= b);
  if (!inside) return b;
  return uint32_t(std::max<uint64_t>(b, std::min<uint64_t>(spec_.capacity, uint64_t(c) + (prompt_.end - len))));
}

void KvCache::clear_scores(uint32_t layer, uint32_t from) {
  const BufferView v = scores(layer);
  if (!v.buffer || from >= spec_.capacity) return;
  const std::vector<float> zeros(spec_.capacity - from, 0.0f);
  for (uint32_t h = 0; h < spec_.n_kv_heads; ++h)
    v.buffer->write(v.offset + (size_t(h) * spec_.capacity + from) * sizeof(float), zeros.data(),
                    zeros.size() * sizeof(float));
}

void KvCache::evict(EncoderSession& enc, Group& g, uint32_t n_new) {
  constexpr uint32_t B = kBlockTokens;
  const uint32_t count = counts_[g.layers[0]];
  for (uint32_t l : g.layers)
    if (counts_[l] != count)
      fail("layer " + str(l) + " holds " + str(counts_[l]) + " tokens and layer " + str(g.layers[0]) + " " +
           str(count) + "; an eviction (kv_policy) runs for the full layers together: store them in step");
  const uint32_t keep = evict_keep(budget(g.layers[0]), n_new);  // (a group's layers share a budget)
  const uint32_t cap = spec_.capacity, H = spec_.n_kv_heads;
  const size_t per_layer = size_t(H) * cap;

  // 1. per layer and head, the rule's choice and the moves it makes (the
  // group's layers' scores, one run of the buffer, read and written back
  // moved in one copy each)
  int64_t lo = -1, hi = -1;  // the group's layers' places in scores_
  for (uint32_t l : g.layers)
    if (score_at_[l] >= 0) lo = lo < 0 ? score_at_[l] : std::min(lo, score_at_[l]), hi = std::max(hi, score_at_[l] + 1);
  const size_t scores_from = lo < 0 ? 0 : size_t(lo) * per_layer * sizeof(float);
  std::vector<float> all_scores(lo < 0 ? 0 : size_t(hi - lo) * per_layer);
  if (!all_scores.empty()) scores_->read(scores_from, all_scores.data(), all_scores.size() * sizeof(float));
  // The positions are worked on in a copy: nothing of the cache changes before
  // make_writable below has found its blocks (it raises when the pool is short).
  std::vector<std::vector<uint32_t>> kept_pos(g.layers.size());
  std::vector<uint32_t> moves;  // (head, from, to), layer after layer
  std::vector<size_t> first_move(g.layers.size() + 1, 0);
  std::vector<uint8_t> written(ops::ceil_div(keep, B), 0);  // logical blocks a move writes
  for (size_t i = 0; i < g.layers.size(); ++i) {
    const uint32_t l = g.layers[i];
    first_move[i] = moves.size() / 3;
    kept_pos[i] = kept_pos_[l];
    for (uint32_t h = 0; h < H; ++h) {
      uint32_t* pos = kept_pos[i].data() + size_t(h) * cap;
      float* sc = score_at_[l] >= 0 ? all_scores.data() + size_t(score_at_[l] - lo) * per_layer + size_t(h) * cap
                                    : nullptr;
      const std::vector<uint32_t> kept = select_kept(spec_.policy, pos, sc, count, keep);
      std::vector<uint8_t> is_kept(count, 0);
      for (uint32_t k : kept) is_kept[k] = 1;
      uint32_t hole = 0;
      for (uint32_t from = keep; from < count; ++from) {
        if (!is_kept[from]) continue;
        while (is_kept[hole]) ++hole;  // kept rows past keep = dropped rows below it
        moves.insert(moves.end(), {h, from, hole});
        written[hole / B] = 1;
        pos[hole] = pos[from];
        if (sc) sc[hole] = sc[from];
        ++hole;
      }
      // (snapkv observes anew from here on; the others' scores stay with their rows)
      if (sc) std::fill(sc + (spec_.policy.observes() ? 0 : keep), sc + cap, 0.0f);
    }
  }

  first_move[g.layers.size()] = moves.size() / 3;

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

  // 3. the moves (one list for every layer, in the group's buffer), then
  // the blocks past keep go
  if (!all_scores.empty()) scores_->write(scores_from, all_scores.data(), all_scores.size() * sizeof(float));
  for (size_t i = 0; i < g.layers.size(); ++i) kept_pos_[g.layers[i]] = std::move(kept_pos[i]);
  const size_t list_bytes = size_t(g.layers.size()) * per_layer * 3 * sizeof(uint32_t);  // the most moves
  if (!g.moves || g.moves->length() < list_bytes) g.moves = device_->new_buffer(list_bytes);
  if (!moves.empty()) g.moves->write(0, moves.data(), moves.size() * sizeof(uint32_t));
  // The moves read their sources through the table as it is now, in a copy:
  // the store after this may put another block where the shrink below lets
  // one go (over a shared pool a checkpoint keeps that one, and the new id
  // differs), and the mirror it writes is read when the moves run, later.
  const std::vector<int64_t>& blocks = g.table->blocks();
  std::vector<uint32_t> ids(blocks.size());
  for (size_t b = 0; b < ids.size(); ++b) ids[b] = blocks[b] < 0 ? 0u : uint32_t(blocks[b]);
  if (!g.move_table || g.move_table->length() < ids.size() * sizeof(uint32_t))
    g.move_table = device_->new_buffer(std::max<size_t>(ids.size(), ops::ceil_div(cap, B)) * sizeof(uint32_t));
  if (!moves.empty()) g.move_table->write(0, ids.data(), ids.size() * sizeof(uint32_t));
  for (size_t i = 0; i < g.layers.size(); ++i) {
    const uint32_t l = g.layers[i];
    counts_[l] = keep;
    const uint32_t n_moves = uint32_t(first_move[i + 1] - first_move[i]);
    if (n_moves == 0) continue;
    const LayerLayout lay = layout(l);
    const ops::KvMoveDesc d{n_moves, H, spec_.head_dim, lay.k_format, lay.v_format, lay.slots, count};
    ops::kv_move_rows(*device_, enc.compute(), region(l), {g.move_table, 0}, {g.moves, first_move[i] * 3 * sizeof(uint32_t)},
                      d);
  }
  {
    Lock lock(pool_->mutex());
    g.table->shrink(keep);  // (the moves read past keep through move_table: the pool hands those blocks out after them)
  }
  evicted_ += count - keep;
}

void KvCache::note_policy_store(EncoderSession& enc, uint32_t layer, const BufferView& k_new, uint32_t index,
                                uint32_t n_new) {
  const uint32_t n = lengths_[layer];
  for (uint32_t h = 0; h < spec_.n_kv_heads; ++h)
    for (uint32_t t = 0; t < n_new; ++t) kept_pos_[layer][size_t(h) * spec_.capacity + index + t] = n + t;
  if (policy_scores_keys(spec_.policy.kind))
    ops::kv_key_scores(*device_, enc.compute(), k_new, scores(layer),
                       {n_new, spec_.n_kv_heads, spec_.head_dim, index, spec_.capacity});
}

void KvCache::set_kept(uint32_t layer, uint32_t length, const std::vector<uint32_t>& positions,
                       const float* scores_in) {
  check_layer(layer);
  const uint32_t n = counts_[layer], H = spec_.n_kv_heads;
  if (!evicts(layer)) fail("layer " + str(layer) + " keeps no budget by eviction (no kv_policy, or sliding)");
  if (lengths_[layer] != n) fail("set_kept needs a layer whose indices are its positions (none evicted yet)");
  if (positions.size() != size_t(H) * n)
    fail("set_kept: " + str(positions.size()) + " positions for " + str(H) + " heads of " + str(n) + " indices");
  for (uint32_t h = 0; h < H; ++h) {
    std::vector<uint32_t> head(positions.begin() + size_t(h) * n, positions.begin() + size_t(h + 1) * n);
    std::sort(head.begin(), head.end());
    if ((n && head.back() >= length) || std::adjacent_find(head.begin(), head.end()) != head.end())
      fail("set_kept: head " + str(h) + "'s positions are not distinct positions below " + str(length));
  }
  for (uint32_t h = 0; h < H; ++h)
    std::copy(positions.begin() + size_t(h) * n, positions.begin() + size_t(h + 1) * n,
              kept_pos_[layer].begin() + size_t(h) * spec_.capacity);
  const BufferView v = scores(layer);
  clear_scores(layer, 0);
  if (v.buffer && scores_in)
    for (uint32_t h = 0; h < H; ++h)
      v.buffer->write(v.offset + size_t(h) * spec_.capacity * sizeof(float), scores_in + size_t(h) * n,
                      n * sizeof(float));
  lengths_[layer] = length;
  evicted_ = length - n;
}

void KvCache::save_policy(Checkpoint& cp) const {
  cp.counts = counts_;
  cp.kept_pos = kept_pos_;
  cp.evicted = evicted_;
  cp.prompt = prompt_;
  cp.scores.clear();
  if (scores_) {
    cp.scores.resize(scores_->length() / sizeof(float));
    scores_->read(0, cp.scores.data(), scores_->length());
  }
}

void KvCache::restore_policy(const Checkpoint& cp) {
  counts_ = cp.counts;
  kept_pos_ = cp.kept_pos;
  evicted_ = cp.evicted;
  prompt_ = cp.prompt;
  if (scores_) scores_->write(0, cp.scores.data(), scores_->length());
}

}  // namespace mkv::kv
