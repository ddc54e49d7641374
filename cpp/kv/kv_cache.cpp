// KVCache: allocation, checks, and the compute and blit store paths.
#include "kv/kv_cache.h"

#include <algorithm>

#include "ops/kv_store.h"

namespace mkv::kv {
namespace {

[[noreturn]] void fail(const std::string& message) { ops::fail("kv_cache", message); }

std::string str(uint64_t v) { return std::to_string(v); }

}  // namespace

StorePath parse_store_path(const std::string& name) {
  if (name == "compute") return StorePath::compute;
  if (name == "blit") return StorePath::blit;
  fail("unknown store path '" + name + "'; expected 'compute' (kernel writes the slots) or 'blit' "
       "(kernel writes a staging buffer, a blit encoder copies it)");
}

const char* store_path_name(StorePath path) { return path == StorePath::blit ? "blit" : "compute"; }

KVCache::KVCache(gpu::DevicePtr device, KVCacheSpec spec) : device_(std::move(device)), spec_(std::move(spec)) {
  if (!device_) fail("device is null");
  if (spec_.n_layers == 0 || spec_.n_kv_heads == 0 || spec_.head_dim == 0 || spec_.capacity == 0)
    fail("n_layers, n_kv_heads, head_dim and capacity must be positive (got " + str(spec_.n_layers) +
         ", " + str(spec_.n_kv_heads) + ", " + str(spec_.head_dim) + ", " + str(spec_.capacity) + ")");
  if (spec_.max_chunk == 0) fail("max_chunk must be at least 1");
  if (spec_.windows.empty()) spec_.windows.assign(spec_.n_layers, 0);
  if (spec_.windows.size() != spec_.n_layers)
    fail("windows has " + str(spec_.windows.size()) + " entries; expected one per layer (" +
         str(spec_.n_layers) + "), 0 for a full layer");
  for (uint32_t l = 0; l < spec_.n_layers; ++l) {
    slots_.push_back(layer_slots(spec_.windows[l], spec_.capacity, spec_.max_chunk));
    const LayerLayout lay = layout(l);
    // The store kernel indexes a region with 32-bit element offsets.
    if (lay.nbytes() / kKVElementBytes >= (uint64_t(1) << 32))
      fail("layer " + str(l) + " would hold " + str(lay.nbytes()) + " bytes; at most 2^32 half "
           "elements per layer are supported (lower capacity)");
    buffers_.push_back(device_->new_buffer(lay.nbytes()));
  }
  lengths_.assign(spec_.n_layers, 0);
  if (spec_.store == StorePath::blit) staging_for(spec_.max_chunk);
}

void KVCache::check_layer(uint32_t layer) const {
  if (layer >= spec_.n_layers)
    fail("layer " + str(layer) + " is out of range; the cache has " + str(spec_.n_layers) +
         " layers (0.." + str(spec_.n_layers - 1) + ")");
}

BufferView KVCache::region(uint32_t layer) const {
  check_layer(layer);
  return {buffers_[layer], 0};
}

LayerLayout KVCache::layout(uint32_t layer) const {
  check_layer(layer);
  return {slots_[layer], spec_.n_kv_heads, spec_.head_dim};
}

uint32_t KVCache::slots(uint32_t layer) const {
  check_layer(layer);
  return slots_[layer];
}

uint32_t KVCache::length(uint32_t layer) const {
  check_layer(layer);
  return lengths_[layer];
}

uint32_t KVCache::window(uint32_t layer) const {
  check_layer(layer);
  return spec_.windows[layer];
}

bool KVCache::wraps(uint32_t layer) const {
  check_layer(layer);
  return layer_wraps(spec_.windows[layer], spec_.capacity, spec_.max_chunk);
}

int64_t KVCache::position(uint32_t layer, uint32_t slot) const {
  check_layer(layer);
  return slot_position(lengths_[layer], slots_[layer], slot);
}

BufferView KVCache::staging_for(uint32_t n_new) {
  // A full layer may take a chunk larger than max_chunk: grow. Commands already
  // encoded keep the old buffer alive through their command buffer.
  if (n_new > staging_rows_) {
    staging_ = device_->new_buffer(2 * size_t(n_new) * LayerLayout{1, spec_.n_kv_heads, spec_.head_dim}.row_bytes());
    staging_rows_ = n_new;
  }
  return {staging_, 0};
}

void KVCache::check_store(uint32_t layer, uint32_t n_new, const RopeSpec* rope_k) const {
  check_layer(layer);
  if (n_new == 0) fail("storing 0 tokens in layer " + str(layer) + "; n_new must be at least 1");
  const uint32_t n = lengths_[layer], R = slots_[layer];
  if (spec_.windows[layer] != 0 && n_new > spec_.max_chunk)
    fail("layer " + str(layer) + " is sliding (window " + str(spec_.windows[layer]) + ", " + str(R) +
         " slots); storing " + str(n_new) + " tokens in one call exceeds max_chunk " +
         str(spec_.max_chunk) + " (create the cache with a larger max_chunk or store in smaller chunks)");
  if (!wraps(layer) && uint64_t(n) + n_new > R)
    fail("layer " + str(layer) + " holds " + str(n) + " tokens; storing " + str(n_new) + " more needs " +
         str(uint64_t(n) + n_new) + " > capacity " + str(R) +
         " (eviction is not implemented yet; create the cache with a larger capacity)");
  if (uint64_t(n) + n_new >= (uint64_t(1) << 32)) fail("layer " + str(layer) + " would pass 2^32 - 1 positions");
  if (rope_k) ops::check_rope("kv_cache", *rope_k, spec_.head_dim);
}

void KVCache::store(EncoderSession& enc, uint32_t layer, const BufferView& k_new,
                    const BufferView& v_new, uint32_t n_new, const RopeSpec* rope_k,
                    const ops::QueryRope& queries) {
  // 1. checks, before anything is encoded or n moves
  check_store(layer, n_new, rope_k);
  const uint32_t n = lengths_[layer], R = slots_[layer];

  // 2. encode: the compute path writes the slots directly ...
  const LayerLayout lay = layout(layer);
  const uint32_t first = slot_of(n, R);
  ops::KvStoreDesc d{n_new, spec_.n_kv_heads, spec_.head_dim, R, first, n, rope_k, queries};
  if (spec_.store == StorePath::compute) {
    ops::kv_store(enc.compute(), *device_, k_new, v_new, region(layer), d);
  } else {
    // ... the blit path stages rows (2, n_new, n_kv_heads, head_dim) and copies them.
    const BufferView staging = staging_for(n_new);
    d.dst_rows = n_new;
    d.dst_first_row = 0;
    ops::kv_store(enc.compute(), *device_, k_new, v_new, staging, d);
    gpu::BlitEncoder& blit = enc.blit();
    const uint32_t head = std::min(n_new, R - first);  // rows before the ring wraps
    const size_t row = lay.row_bytes();
    for (uint32_t kv = 0; kv < 2; ++kv) {
      const size_t src = staging.offset + size_t(kv) * n_new * row;
      blit.copy(staging.buffer, src, buffers_[layer], lay.row_offset(kv, first), head * row);
      if (head < n_new)
        blit.copy(staging.buffer, src + head * row, buffers_[layer], lay.row_offset(kv, 0), (n_new - head) * row);
    }
  }
  lengths_[layer] = n + n_new;
}

void KVCache::truncate(uint32_t n) {
  for (uint32_t l = 0; l < spec_.n_layers; ++l) {
    const uint32_t len = lengths_[l];
    if (n > len)
      fail("cannot truncate layer " + str(l) + " to " + str(n) + " tokens: it holds only " + str(len));
    if (wraps(l) && len - n > spec_.max_chunk)
      fail("cannot truncate layer " + str(l) + " from " + str(len) + " to " + str(n) + " tokens: it is a ring of " +
           str(slots_[l]) + " slots for window " + str(spec_.windows[l]) + ", and the positions the window "
           "at " + str(n) + " needs were overwritten (a ring can drop at most max_chunk = " +
           str(spec_.max_chunk) + " tokens)");
  }
  std::fill(lengths_.begin(), lengths_.end(), n);
  if (tokens_.size() > n) {
    tokens_.resize(n);
    messages_.clear();
  }
}

void KVCache::reset() {
  std::fill(lengths_.begin(), lengths_.end(), 0u);
  tokens_.clear();
  messages_.clear();
}

size_t KVCache::layer_nbytes(uint32_t layer) const { return layout(layer).nbytes(); }

size_t KVCache::staging_nbytes() const { return staging_ ? staging_->length() : 0; }

size_t KVCache::nbytes() const {
  size_t total = staging_nbytes();
  for (uint32_t l = 0; l < spec_.n_layers; ++l) total += layer_nbytes(l);
  return total;
}

size_t KVCache::bytes_per_token() const {
  const size_t kv_row = 2 * LayerLayout{1, spec_.n_kv_heads, spec_.head_dim}.row_bytes();
  size_t total = 0;
  for (uint32_t l = 0; l < spec_.n_layers; ++l)
    if (!wraps(l)) total += kv_row;
  return total;
}

}  // namespace mkv::kv
