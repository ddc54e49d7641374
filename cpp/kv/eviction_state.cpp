// EvictionState: what an eviction policy keeps, and what an eviction chooses.
//
// An eviction (before a store of n_new tokens that would pass the budget, or
// inside a prompt held whole the prompt's end: limit()) runs for every layer
// of a group at once (the full layers share a block table; pyramidkv's are a
// group each, with budgets of their own): the count drops to keep (kv_policy.h
// evict_keep of the budget: room for the store in whole blocks, and at most
// the budget less a step of a sixteenth of it, in whole blocks), so decode
// evicts a block's worth or more at a time, not a token per step: the rule's
// selection and the copies are paid once per step tokens. Per (layer, head)
// the rule picks keep indices; the kept rows at indices >= keep move into the
// dropped ones below keep (KvCache::evict: one kv_move_rows dispatch per
// layer, a move per row; its sources and destinations never meet, so the moves
// need no order), positions and scores move with them here. Index order then
// no longer follows position order; no kernel needs it to (attention is a sum
// over keys; the new tokens always come after every kept one).
#include "kv/eviction_state.h"

#include <algorithm>

#include "kv/kv_cache_errors.h"
#include "kv/block_pool.h"
#include "ops/attention.h"
#include "ops/kv_evict.h"

namespace mkv::kv {
using detail::fail;
using detail::str;

void EvictionState::init(gpu::Device& device, const Allocator& alloc, const KvPolicySpec& policy, const std::vector<uint32_t>& windows,
                         uint32_t n_kv_heads, uint32_t head_dim, uint32_t capacity) {
  device_ = &device;
  alloc_ = alloc;
  policy_ = policy;
  n_kv_heads_ = n_kv_heads;
  head_dim_ = head_dim;
  capacity_ = capacity;
  const uint32_t n_layers = uint32_t(windows.size());
  budgets_ = policy.kind == PolicyKind::none ? std::vector<uint32_t>{} : layer_budgets(policy, windows);
  counts_.assign(n_layers, 0);
  since_.assign(n_layers, 0);
  share_mask_.assign(n_layers, 0);
  kept_pos_.assign(n_layers, {});
  score_at_.assign(n_layers, -1);
  if (policy.kind == PolicyKind::none) return;
  const size_t per_layer = size_t(n_kv_heads) * capacity;
  const bool scored = policy.traits().scores_keys || policy.traits().scores_attention;
  int64_t n_scored = 0;
  for (uint32_t l = 0; l < n_layers; ++l) {
    if (windows[l] != 0) continue;
    kept_pos_[l].assign(per_layer, 0);
    if (scored) score_at_[l] = n_scored++;
  }
  n_scored_ = uint32_t(n_scored);
  if (n_scored) {  // one buffer: an eviction reads and writes every layer's in one copy each
    scores_ = alloc_(size_t(n_scored) * per_layer * sizeof(float), "an eviction policy's scores");
    const std::vector<float> zeros(size_t(n_scored) * per_layer, 0.0f);
    scores_->write(0, zeros.data(), zeros.size() * sizeof(float));
  }
}

std::vector<uint32_t> EvictionState::kept_positions(uint32_t layer, uint32_t head, uint32_t length) const {
  if (head >= n_kv_heads_)
    fail("head " + str(head) + " is out of range; the cache has " + str(n_kv_heads_) + " KV heads");
  std::vector<uint32_t> out(counts_[layer]);
  for (uint32_t i = 0; i < counts_[layer]; ++i)
    out[i] = evicts(layer) ? kept_pos_[layer][size_t(head) * capacity_ + i] : i + length - counts_[layer];
  return out;
}

int64_t EvictionState::position(uint32_t layer, uint32_t index) const {
  return evicts(layer) ? int64_t(kept_pos_[layer][index]) : int64_t(index);
}

ops::BufferView EvictionState::scores(uint32_t layer) const {
  if (score_at_[layer] < 0) return {};
  return {scores_, size_t(score_at_[layer]) * n_kv_heads_ * capacity_ * sizeof(float)};
}

// The observation window: the last `window` indices before the eviction to
// come, at the budget or, inside an open prompt, at the prompt's end.
uint32_t EvictionState::observed_from(uint32_t layer, uint32_t count, uint32_t length) const {
  uint32_t end = budget(layer);
  if (length > prompt_start_ && length <= prompt_end_)
    end = uint32_t(std::min<uint64_t>(capacity_, uint64_t(count) + (prompt_end_ - length)));
  return end > policy_.window ? end - policy_.window : 0;
}

uint32_t EvictionState::score_rows_from(uint32_t layer, uint32_t n_queries, uint32_t length) const {
  if (!policy_.observes()) return 0;
  const uint32_t count = counts_[layer];  // the step's queries are stored already
  const uint32_t first_index = count - n_queries, observed = observed_from(layer, count, length);
  return observed > first_index ? std::min(observed - first_index, n_queries) : 0;
}

uint32_t EvictionState::room(uint32_t layer, uint32_t length) const {
  const uint32_t lim = limit(layer, length);
  return lim > counts_[layer] ? lim - counts_[layer] : 0;
}

// Row r of n_rows sees the layer as decoding it alone would once it is
// stored: n_rows - 1 - r fewer indices and positions.
ops::BufferView EvictionState::share(uint32_t layer, uint32_t row, uint32_t n_rows, uint32_t length) {
  if (!scores_attention(layer) || n_rows > 32 || row >= n_rows)
    fail("verify_share: layer " + str(layer) + ", row " + str(row) + " of " + str(n_rows) +
         " (a layer whose policy scores by attention; at most 32 rows)");
  if (row == 0) share_mask_[layer] = 0;
  const uint32_t later = n_rows - 1 - row, count = counts_[layer] - later;
  if (policy_.observes() && observed_from(layer, count, length - later) > count - 1) return {};
  if (share_stride_ == 0)
    for (uint32_t l = 0; l < counts_.size(); ++l)
      if (scores_attention(l)) share_stride_ = std::max(share_stride_, budget(l));
  if (counts_[layer] > share_stride_)
    fail("verify_share: layer " + str(layer) + " holds " + str(counts_[layer]) + " indices, past its budget " +
         str(share_stride_) + " (a verified segment is stored only where no eviction is due)");
  const size_t row_floats = size_t(n_scored_) * n_kv_heads_ * share_stride_;
  if (n_rows > share_rows_) {
    shares_ = alloc_(n_rows * row_floats * sizeof(float), "a verified segment's score shares");
    share_rows_ = n_rows;
  }
  share_mask_[layer] |= 1u << row;
  return {shares_, (row * row_floats + size_t(score_at_[layer]) * n_kv_heads_ * share_stride_) * sizeof(float)};
}

void EvictionState::apply_shares(EncoderSession& enc, uint32_t rows) {
  if (rows == 0) return;
  for (uint32_t l = 0; l < counts_.size(); ++l) {
    const uint32_t mask = share_mask_[l] & (rows >= 32 ? ~0u : (1u << rows) - 1);
    share_mask_[l] = 0;
    if (!scores_attention(l) || mask == 0) continue;
    ops::ScoresApplyDesc d;
    d.n_kv_heads = n_kv_heads_;
    d.keys = counts_[l] - rows + 1;  // row 0's: the kept rows are the last stored
    d.rows = rows;
    d.row_mask = mask;
    d.row_stride = n_scored_ * n_kv_heads_ * share_stride_;
    d.share_stride = share_stride_;
    d.score_stride = capacity_;
    ops::attention_scores_apply(*device_, enc.compute(), d,
                                {shares_, size_t(score_at_[l]) * n_kv_heads_ * share_stride_ * sizeof(float)}, scores(l));
  }
}

void EvictionState::open_prompt(uint32_t n, const std::vector<uint32_t>& lengths) {
  prompt_start_ = prompt_end_ = 0;
  uint32_t full = uint32_t(counts_.size());
  for (uint32_t l = 0; l < counts_.size() && full == counts_.size(); ++l)
    if (evicts(l)) full = l;
  if (n == 0 || full == counts_.size() || !policy_.holds_prompts()) return;
  prompt_start_ = lengths[full];
  prompt_end_ = uint32_t(std::min<uint64_t>(uint64_t(prompt_start_) + n, ~uint32_t(0)));
}

uint32_t EvictionState::limit(uint32_t layer, uint32_t length) const {
  const uint32_t c = counts_[layer], b = budget(layer);
  // inside the open prompt: past its first store, or at it when no earlier
  // prompt waits to be compressed (a count over the budget) first
  const bool inside = length >= prompt_start_ && length < prompt_end_ && (length > prompt_start_ || c <= b);
  if (!inside) return b;
  return uint32_t(std::max<uint64_t>(b, std::min<uint64_t>(capacity_, uint64_t(c) + (prompt_end_ - length))));
}

void EvictionState::stored(EncoderSession& enc, uint32_t layer, const ops::BufferView& k_new, uint32_t first,
                           uint32_t n_new) {
  const uint32_t index = counts_[layer];
  counts_[layer] = index + n_new;
  since_[layer] += n_new;
  if (!evicts(layer)) return;
  for (uint32_t h = 0; h < n_kv_heads_; ++h)
    for (uint32_t t = 0; t < n_new; ++t) kept_pos_[layer][size_t(h) * capacity_ + index + t] = first + t;
  if (policy_.traits().scores_keys)
    ops::kv_key_scores(*device_, enc.compute(), k_new, scores(layer), {n_new, n_kv_heads_, head_dim_, index, capacity_});
}

EvictionState::Plan EvictionState::plan(const std::vector<uint32_t>& layers, uint32_t n_new) const {
  constexpr uint32_t B = kBlockTokens;
  Plan p;
  p.count = counts_[layers[0]];
  for (uint32_t l : layers)
    if (counts_[l] != p.count)
      fail("layer " + str(l) + " holds " + str(counts_[l]) + " tokens and layer " + str(layers[0]) + " " +
           str(p.count) + "; an eviction (kv_policy) runs for the full layers together: store them in step");
  p.keep = evict_keep(budget(layers[0]), n_new);  // (a group's layers share a budget)
  const uint32_t count = p.count, keep = p.keep, cap = capacity_, H = n_kv_heads_;
  const size_t per_layer = size_t(H) * cap;

  // the group's layers' scores: one run of the buffer, read here and written back moved by apply()
  int64_t hi = -1;
  for (uint32_t l : layers)
    if (score_at_[l] >= 0)
      p.scores_lo = p.scores_lo < 0 ? score_at_[l] : std::min(p.scores_lo, score_at_[l]),
      hi = std::max(hi, score_at_[l] + 1);
  if (p.scores_lo >= 0) {
    p.scores.resize(size_t(hi - p.scores_lo) * per_layer);
    scores_->read(size_t(p.scores_lo) * per_layer * sizeof(float), p.scores.data(), p.scores.size() * sizeof(float));
  }
  std::vector<uint8_t> written(ops::ceil_div(keep, B), 0);
  p.kept_pos.resize(layers.size());
  p.first_move.assign(layers.size() + 1, 0);
  for (size_t i = 0; i < layers.size(); ++i) {
    const uint32_t l = layers[i];
    p.first_move[i] = p.moves.size() / 3;
    p.kept_pos[i] = kept_pos_[l];
    for (uint32_t h = 0; h < H; ++h) {
      uint32_t* pos = p.kept_pos[i].data() + size_t(h) * cap;
      float* sc = score_at_[l] >= 0 ? p.scores.data() + size_t(score_at_[l] - p.scores_lo) * per_layer + size_t(h) * cap
                                    : nullptr;
      const std::vector<uint32_t> kept = select_kept(policy_, pos, sc, count, keep);
      std::vector<uint8_t> is_kept(count, 0);
      for (uint32_t k : kept) is_kept[k] = 1;
      uint32_t hole = 0;
      for (uint32_t from = keep; from < count; ++from) {
        if (!is_kept[from]) continue;
        while (is_kept[hole]) ++hole;  // kept rows past keep = dropped rows below it
        p.moves.insert(p.moves.end(), {h, from, hole});
        written[hole / B] = 1;
        pos[hole] = pos[from];
        if (sc) sc[hole] = sc[from];
        ++hole;
      }
      // (snapkv observes anew from here on; the others' scores stay with their rows)
      if (sc) std::fill(sc + (policy_.observes() ? 0 : keep), sc + cap, 0.0f);
    }
  }
  p.first_move[layers.size()] = p.moves.size() / 3;
  for (uint32_t b = 0; b < written.size(); ++b)
    if (written[b]) p.written.push_back(b);
  return p;
}

void EvictionState::apply(const std::vector<uint32_t>& layers, Plan& p) {
  if (p.scores_lo >= 0)
    scores_->write(size_t(p.scores_lo) * n_kv_heads_ * capacity_ * sizeof(float), p.scores.data(),
                   p.scores.size() * sizeof(float));
  for (size_t i = 0; i < layers.size(); ++i) {
    kept_pos_[layers[i]] = std::move(p.kept_pos[i]);
    counts_[layers[i]] = p.keep;
    since_[layers[i]] = 0;
  }
  evicted_ += p.count - p.keep;
}

void EvictionState::clear_scores(uint32_t layer, uint32_t from) {
  const ops::BufferView v = scores(layer);
  if (!v.buffer || from >= capacity_) return;
  const std::vector<float> zeros(capacity_ - from, 0.0f);
  for (uint32_t h = 0; h < n_kv_heads_; ++h)
    v.buffer->write(v.offset + (size_t(h) * capacity_ + from) * sizeof(float), zeros.data(),
                    zeros.size() * sizeof(float));
}

void EvictionState::truncated(uint32_t n, const std::vector<uint32_t>& lengths) {
  for (uint32_t l = 0; l < counts_.size(); ++l) {
    const uint32_t back = lengths[l] - n, count = counts_[l] - back;  // (back <= since_[l] where it evicted)
    if (back) clear_scores(l, count);
    counts_[l] = count;
    since_[l] = since_[l] > back ? since_[l] - back : 0;
  }
  prompt_start_ = prompt_end_ = 0;  // (a call opens its prompt after rolling back)
}

void EvictionState::reset() {
  for (uint32_t l = 0; l < counts_.size(); ++l)
    if (counts_[l]) clear_scores(l, 0);
  std::fill(counts_.begin(), counts_.end(), 0u);
  std::fill(since_.begin(), since_.end(), 0u);
  evicted_ = 0;
  prompt_start_ = prompt_end_ = 0;
}

void EvictionState::start_at(const std::vector<uint32_t>& first) {
  counts_ = first;
  std::fill(since_.begin(), since_.end(), 0u);  // (what came before is not this cache's to take back)
}

void EvictionState::set_kept(uint32_t layer, uint32_t length, const std::vector<uint32_t>& positions,
                             const float* scores_in) {
  const uint32_t n = counts_[layer], H = n_kv_heads_;
  if (!evicts(layer)) fail("layer " + str(layer) + " keeps no budget by eviction (no kv_policy, or sliding)");
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
              kept_pos_[layer].begin() + size_t(h) * capacity_);
  const ops::BufferView v = scores(layer);
  clear_scores(layer, 0);
  if (v.buffer && scores_in)
    for (uint32_t h = 0; h < H; ++h)
      v.buffer->write(v.offset + size_t(h) * capacity_ * sizeof(float), scores_in + size_t(h) * n, n * sizeof(float));
  evicted_ = length - n;
  since_[layer] = 0;
}

EvictionState::Saved EvictionState::save() const {
  Saved s{counts_, since_, kept_pos_, {}, evicted_, prompt_start_, prompt_end_};
  if (scores_) {
    s.scores.resize(scores_->length() / sizeof(float));
    scores_->read(0, s.scores.data(), scores_->length());
  }
  return s;
}

void EvictionState::restore(const Saved& s) {
  counts_ = s.counts;
  since_ = s.since;
  kept_pos_ = s.kept_pos;
  evicted_ = s.evicted;
  prompt_start_ = s.prompt_start;
  prompt_end_ = s.prompt_end;
  if (scores_) scores_->write(0, s.scores.data(), scores_->length());
}

}  // namespace mkv::kv
