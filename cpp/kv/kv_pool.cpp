#include "kv/kv_pool.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "gpu/errors.h"
#include "ops/rope.h"

namespace mkv::kv {
namespace {

[[noreturn]] void fail(const std::string& message) { ops::fail("kv_pool", message); }
[[noreturn]] void bad_budget(const std::string& message) { throw gpu::ArgumentError("kv_pool", "kv_memory", message); }
std::string str(uint64_t v) { return std::to_string(v); }

// Distinct windows in order of first appearance: the groups.
std::vector<uint32_t> group_windows(const std::vector<uint32_t>& windows) {
  std::vector<uint32_t> out;
  for (uint32_t w : windows)
    if (std::find(out.begin(), out.end(), w) == out.end()) out.push_back(w);
  return out;
}

}  // namespace

std::vector<uint32_t> KvPool::layer_groups(const std::vector<uint32_t>& windows, bool split_full) {
  std::vector<uint32_t> out, group_window;  // group_window: a sliding group's window (full groups: none)
  uint32_t n_groups = 0, shared_full = ~0u;
  for (uint32_t w : windows) {
    if (w == 0 && split_full) {
      out.push_back(n_groups++);
      group_window.push_back(~0u);
      continue;
    }
    if (w == 0 && shared_full != ~0u) {
      out.push_back(shared_full);
      continue;
    }
    const auto it = std::find(group_window.begin(), group_window.end(), w);
    if (w != 0 && it != group_window.end()) {
      out.push_back(uint32_t(it - group_window.begin()));
      continue;
    }
    if (w == 0) shared_full = n_groups;
    out.push_back(n_groups++);
    group_window.push_back(w == 0 ? ~0u : w);
  }
  return out;
}

std::vector<uint32_t> KvPool::sequence_blocks(const std::vector<uint32_t>& windows, uint32_t capacity,
                                              uint32_t max_chunk) {
  std::vector<uint32_t> out;
  for (uint32_t w : group_windows(windows)) out.push_back(group_blocks(w, capacity, max_chunk));
  return out;
}

void KvPoolSpec::check_formats() const {
  for (const std::vector<uint32_t>* f : {&k_formats, &v_formats})
    if (!f->empty() && f->size() != windows.size())
      throw gpu::ArgumentError("kv_cache", f == &k_formats ? "kv_k" : "kv_v",
                               "one KV format per layer is needed: got " + str(f->size()) + " for " +
                                   str(windows.size()) + " layers");
  for (uint32_t l = 0; l < windows.size(); ++l) {
    check_kv_format(k_format(l), head_dim, "kv_k");
    check_kv_format(v_format(l), head_dim, "kv_v");
  }
  if (rotate && !ops::hadamard_fits(head_dim))
    throw gpu::ArgumentError("kv_cache", "kv_rotate", "kv_rotate needs a power-of-two head_dim (the Hadamard "
                             "transform's size), not " + str(head_dim) + "; quantize without rotation");
}

void KvPoolSpec::check_serves(const std::vector<uint32_t>& k, const std::vector<uint32_t>& v, bool rotated,
                              const std::string& op) const {
  for (uint32_t l = 0; l < windows.size(); ++l)
    if ((k.empty() ? 0u : k.at(l)) != k_format(l) || (v.empty() ? 0u : v.at(l)) != v_format(l) || rotated != rotate)
      throw gpu::ArgumentError(op, "kv_k", "the engine's shared KV pool (kv_memory) stores layer " + str(l) +
                               " as K " + kv_format_name(k_format(l)) + ", V " + kv_format_name(v_format(l)) +
                               (rotate ? ", rotated" : "") +
                               "; its caches take those formats (load the engine with other kv_k/kv_v/kv_rotate, "
                               "or without kv_memory)");
}

size_t KvPool::pool_bytes(const KvPoolSpec& spec) {
  const std::vector<uint32_t> group = layer_groups(spec.windows, spec.split_full);
  size_t total = 0;
  for (uint32_t l = 0; l < spec.windows.size(); ++l)
    total += spec.layout(l, spec.group_blocks.at(group[l]) * kBlockTokens).nbytes();
  return total;
}

KvPoolSpec KvPool::for_budget(KvPoolSpec s, uint32_t capacity, uint32_t max_chunk, size_t total, size_t kept) {
  if (s.split_full) fail("a shared pool groups its full layers together (split_full is for a cache's own pool)");
  const size_t bytes = total > kept ? total - kept : 0;
  const std::string budget = "kv_memory " + str(total) + " bytes" +
                             (kept ? " (" + str(kept) + " of them kept for sequences' own buffers)" : "");
  const std::vector<uint32_t> gw = group_windows(s.windows);
  s.group_blocks = sequence_blocks(s.windows, capacity, max_chunk);
  const std::vector<uint32_t> one = s.group_blocks;
  const size_t one_bytes = pool_bytes(s);
  const double scale = double(bytes) / double(one_bytes);
  s.group_blocks.clear();
  for (size_t g = 0; g < gw.size(); ++g) {
    // A call's checkpoint keeps the blocks it started with (kv_checkpoint.cpp):
    // a sliding group needs its window twice (and a tail copy) for one call to run.
    const bool bounded = layer_wraps(gw[g], capacity, max_chunk);
    const double scaled = std::floor(scale * one[g]);
    s.group_blocks.push_back(bounded ? std::max<uint32_t>(2 * one[g] + 1, uint32_t(std::min(scaled, 4e9)))
                                     : uint32_t(std::min(scaled, 4e9)));
    if (s.group_blocks.back() == 0) {
      // one block id: its K and V blocks in every layer of the group (their formats may differ)
      size_t total = 0, first = 0;
      bool same = true;
      for (uint32_t l = 0; l < s.windows.size(); ++l) {
        if (s.windows[l] != gw[g]) continue;
        const size_t b = s.layout(l, kBlockTokens).nbytes();
        if (!first) first = b;
        same = same && b == first;
        total += b;
      }
      bad_budget(budget + " holds no block of the layers of window " + str(gw[g]) +
                 " (one block: " + (same ? str(first) + " bytes in each of their layers" : str(total) +
                 " bytes over their layers") + "; one sequence of " + str(capacity) + " tokens needs " +
                 str(one_bytes) + " bytes)");
    }
  }
  const size_t got = pool_bytes(s);
  if (got > bytes)
    bad_budget(budget + " is less than the " + str(got) + " the sliding layers need to run one " +
         "sequence (their window twice: a call keeps the one it started with) plus one block of the others");
  return s;
}

KvPool::KvPool(gpu::DevicePtr device, KvPoolSpec spec, KvBudgetPtr budget)
    : spec_(std::move(spec)), budget_(std::move(budget)) {
  if (!device) fail("device is null");
  if (spec_.windows.empty() || spec_.n_kv_heads == 0 || spec_.head_dim == 0)
    fail("n_layers, n_kv_heads and head_dim must be positive");
  spec_.check_formats();
  group_index_ = layer_groups(spec_.windows, spec_.split_full);
  const size_t n_groups = group_index_.empty() ? 0 : *std::max_element(group_index_.begin(), group_index_.end()) + 1;
  if (spec_.group_blocks.size() != n_groups)
    fail("group_blocks has " + str(spec_.group_blocks.size()) + " entries; the windows make " + str(n_groups) +
         " groups");
  for (size_t g = 0; g < n_groups; ++g) groups_.push_back(Group{0, {}, std::make_unique<BlockPool>(spec_.group_blocks[g])});
  for (uint32_t l = 0; l < spec_.windows.size(); ++l) {
    const uint32_t g = group_index_[l];
    groups_[g].window = spec_.windows[l];
    groups_[g].layers.push_back(l);
    const LayerLayout lay = layout(l);
    // The kernels address a layer's pool with 32-bit byte offsets.
    if (lay.nbytes() >= (uint64_t(1) << 32))
      fail("layer " + str(l) + " would hold " + str(lay.nbytes()) + " bytes; at most 2^32 - 1 bytes "
           "per layer are supported (lower capacity or kv_memory, or quantize the cache: kv_k, kv_v)");
    buffers_.push_back(budget_ ? budget_->pool_buffer(*device, lay.nbytes()) : device->new_buffer(lay.nbytes()));
  }
  prefix_rows_.set_max_bytes(nbytes() / 4);
}

void KvPool::check_layer(uint32_t layer) const {
  if (layer >= n_layers())
    fail("layer " + str(layer) + " is out of range; the pool has " + str(n_layers()) + " layers");
}

uint32_t KvPool::group_of(uint32_t layer) const {
  check_layer(layer);
  return group_index_[layer];
}

ops::BufferView KvPool::region(uint32_t layer) const {
  check_layer(layer);
  return {buffers_[layer], 0};
}

LayerLayout KvPool::layout(uint32_t layer) const {
  check_layer(layer);
  return spec_.layout(layer, groups_[group_index_[layer]].pool->capacity() * kBlockTokens);
}

size_t KvPool::block_bytes(uint32_t group) const {
  size_t total = 0;
  for (uint32_t l : groups_.at(group).layers) total += spec_.layout(l, kBlockTokens).nbytes();
  return total;
}

size_t KvPool::nbytes() const {
  size_t total = 0;
  for (const gpu::BufferPtr& b : buffers_) total += b->length();
  return total;
}

}  // namespace mkv::kv
