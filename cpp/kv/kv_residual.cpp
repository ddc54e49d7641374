// KvCache's residual window (KvCacheSpec::residual; docs/KV_QUANT.md,
// "Residual window"): the ring of recent f16 rows beside a quantized pool.
//
// Every store into a layer with a quantized K or V also writes its rows as
// f16 to the layer's ring (the same dispatch: ops::KvStoreDesc::ring_slots),
// so the pool always holds every position quantized and the ring the last
// ring_slots ones in f16; attention takes each key from one or the other by
// the query's position (ops::AttentionDesc::residual). A q2 K section is the
// exception: it is quantized per channel over a whole block, so its blocks
// are sealed (ops::kv_seal_q2k) by the store that fills them, from the ring.
//
// The ring holds max_chunk + residual + B - 1 positions rounded up to a block:
// a store of n_new <= max_chunk tokens at n needs the rows from its first
// query's window start, S(n) >= n + 1 - residual - (B - 1), to n + n_new - 1;
// a seal needs its block's rows, from at most B - 1 before n.
//
// ring_lo (per layer) is the first position whose row the ring still holds:
// a store ending at m overwrites the slots of positions m - ring_slots and
// below; a truncate to n keeps what was valid below n; an adopted prefix or
// a saved cache read back holds none. Below ring_lo the queries read the
// pool even inside their window (the cost of rolling far back).
#include <algorithm>

#include "kv/kv_cache.h"
#include "kv/kv_cache_errors.h"
#include "ops/kv_store.h"

namespace mkv::kv {

void KvCache::init_ring() {
  ring_index_.assign(spec_.n_layers, -1);
  ring_lo_.assign(spec_.n_layers, 0);
  if (spec_.residual == 0) return;
  int32_t rings = 0;
  for (uint32_t l = 0; l < spec_.n_layers; ++l) {
    const LayerLayout lay = layout(l);
    if (lay.k_format != mkv_params::kKvF16 || lay.v_format != mkv_params::kKvF16) ring_index_[l] = rings++;
  }
  const uint64_t span = uint64_t(spec_.max_chunk) + spec_.residual + kBlockTokens - 1;
  ring_slots_ = uint32_t(ops::ceil_div(span, kBlockTokens) * kBlockTokens);
  if (rings) ring_ = device_->new_buffer(size_t(rings) * 2 * ring_slots_ * spec_.n_kv_heads * spec_.head_dim * 2);
}

bool KvCache::has_ring(uint32_t layer) const {
  check_layer(layer);
  return ring_index_[layer] >= 0;
}

BufferView KvCache::ring(uint32_t layer) const {
  if (!has_ring(layer)) return {};
  return {ring_, size_t(ring_index_[layer]) * 2 * ring_slots_ * spec_.n_kv_heads * spec_.head_dim * 2};
}

uint32_t KvCache::ring_lo(uint32_t layer) const {
  check_layer(layer);
  return ring_lo_[layer];
}

size_t KvCache::ring_nbytes() const { return ring_ ? ring_->length() : 0; }

void KvCache::describe_window(uint32_t layer, ops::AttentionDesc& d) const {
  if (!has_ring(layer)) return;
  d.residual = spec_.residual;
  d.ring_slots = ring_slots_;
  d.ring_lo = ring_lo_[layer];
  d.ring = ring(layer);
}

using detail::fail;

void KvCache::read_ring(uint32_t layer, uint32_t first, uint32_t n, uint8_t* k, uint8_t* v) const {
  if (!has_ring(layer)) fail("layer " + std::to_string(layer) + " keeps no residual window");
  if (first < ring_lo_[layer] || uint64_t(first) + n > lengths_[layer])
    fail("layer " + std::to_string(layer) + "'s ring holds positions " + std::to_string(ring_lo_[layer]) + ".." +
         std::to_string(int64_t(lengths_[layer]) - 1) + ", not " + std::to_string(first) + ".." +
         std::to_string(int64_t(first) + n - 1));
  copy_ring(layer, first, n, k, v, false);
}

void KvCache::write_ring(uint32_t layer, uint32_t first, uint32_t n, const uint8_t* k, const uint8_t* v) {
  if (!has_ring(layer)) fail("layer " + std::to_string(layer) + " keeps no residual window");
  if (uint64_t(first) + n != lengths_[layer] || n > ring_slots_)
    fail("write_ring takes the rows of the layer's last positions, at most its " + std::to_string(ring_slots_) +
         " slots, ending at its length " + std::to_string(lengths_[layer]) + "; not " + std::to_string(first) + ".." +
         std::to_string(int64_t(first) + n - 1));
  copy_ring(layer, first, n, const_cast<uint8_t*>(k), const_cast<uint8_t*>(v), true);
  ring_lo_[layer] = first;
}

void KvCache::copy_ring(uint32_t layer, uint32_t first, uint32_t n, uint8_t* k, uint8_t* v, bool write) const {
  const size_t row = size_t(spec_.n_kv_heads) * spec_.head_dim * 2;
  const BufferView r = ring(layer);
  for (uint32_t i = 0; i < n; ++i) {
    const size_t slot = (first + i) % ring_slots_;
    uint8_t* rows[2] = {k + i * row, v + i * row};
    for (uint32_t kv = 0; kv < 2; ++kv) {
      const size_t at = r.offset + (kv * ring_slots_ + slot) * row;
      if (write) r.buffer->write(at, rows[kv], row);
      else r.buffer->read(at, rows[kv], row);
    }
  }
}

void KvCache::store_window(EncoderSession& enc, uint32_t layer, uint32_t n, uint32_t n_new) {
  const uint32_t end = n + n_new;
  if (end > ring_slots_) ring_lo_[layer] = std::max(ring_lo_[layer], end - ring_slots_);
  if (layout(layer).k_format != mkv_params::kKvQ2K) return;
  const uint32_t first = n / kBlockTokens, last = end / kBlockTokens;  // the blocks this store fills
  if (last == first) return;
  ops::KvSealDesc d{spec_.n_kv_heads, spec_.head_dim, slots(layer), first * kBlockTokens, last - first, ring_slots_,
                    ring_lo_[layer]};
  ops::kv_seal_q2k(*device_, enc.compute(), region(layer), ring(layer), table(layer), d);
}

}  // namespace mkv::kv
