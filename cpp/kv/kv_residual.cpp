// The residual window (KvCacheSpec::residual; docs/KV_QUANT.md,
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
#include <string>

#include "kv/kv_cache.h"
#include "kv/kv_cache_errors.h"
#include "kv/residual_ring.h"
#include "ops/kv_store.h"

namespace mkv::kv {
using detail::fail;
using detail::str;

namespace {
bool ringed(const LayerLayout& l) { return l.k_format != mkv_params::kKvF16 || l.v_format != mkv_params::kKvF16; }
uint32_t ring_slots(uint32_t residual, uint32_t max_chunk) {
  const uint64_t span = uint64_t(max_chunk) + residual + kBlockTokens - 1;
  return uint32_t(ops::ceil_div(span, kBlockTokens) * kBlockTokens);
}
}  // namespace

size_t ResidualRing::bytes_for(uint32_t residual, uint32_t max_chunk, const std::vector<LayerLayout>& layouts) {
  if (residual == 0 || layouts.empty()) return 0;
  const size_t rings = size_t(std::count_if(layouts.begin(), layouts.end(), ringed));
  return rings * 2 * ring_slots(residual, max_chunk) * size_t(layouts[0].n_kv_heads) * layouts[0].head_dim * 2;
}

void ResidualRing::init(const Allocator& alloc, uint32_t residual, uint32_t max_chunk,
                        const std::vector<LayerLayout>& layouts) {
  alloc_ = alloc;
  residual_ = residual;
  index_.assign(layouts.size(), -1);
  lo_.assign(layouts.size(), 0);
  full_bytes_ = bytes_for(residual, max_chunk, layouts);
  if (full_bytes_ == 0) return;
  int32_t rings = 0;
  for (size_t l = 0; l < layouts.size(); ++l)
    if (ringed(layouts[l])) index_[l] = rings++;
  slots_ = ring_slots(residual, max_chunk);
  row_bytes_ = size_t(layouts[0].n_kv_heads) * layouts[0].head_dim * 2;
}

void ResidualRing::ensure() {
  if (!buffer_ && full_bytes_) buffer_ = alloc_(full_bytes_, "a residual window's ring");
}

void ResidualRing::release() { buffer_.reset(); }

bool ResidualRing::holds_rows(const std::vector<uint32_t>& lengths) const {
  if (!buffer_) return false;
  for (size_t l = 0; l < lo_.size(); ++l)
    if (has(uint32_t(l)) && lo_[l] < lengths.at(l)) return true;
  return false;
}

ops::BufferView ResidualRing::view(uint32_t layer) const {
  if (!has(layer) || !buffer_) return {};
  return {buffer_, size_t(index_[layer]) * 2 * slots_ * row_bytes_};
}

void ResidualRing::describe(uint32_t layer, ops::AttentionDesc& d) const {
  if (!has(layer) || !buffer_) return;
  d.residual = residual_;
  d.ring_slots = slots_;
  d.ring_lo = lo_[layer];
  d.ring = view(layer);
}

void ResidualRing::stored(uint32_t layer, uint32_t end) {
  if (end > slots_) lo_[layer] = std::max(lo_[layer], end - slots_);
}

void ResidualRing::pool_written(uint32_t layer, uint32_t end) {
  if (has(layer)) lo_[layer] = std::max(lo_[layer], end);
}

void ResidualRing::truncated(uint32_t n) {
  for (uint32_t& lo : lo_) lo = std::min(lo, n);
}

void ResidualRing::read(uint32_t layer, uint32_t first, uint32_t n, uint32_t length, uint8_t* k, uint8_t* v) const {
  if (!has(layer)) fail("layer " + str(layer) + " keeps no residual window");
  if (first < lo_[layer] || uint64_t(first) + n > length)
    fail("layer " + str(layer) + "'s ring holds positions " + str(lo_[layer]) + ".." +
         std::to_string(int64_t(length) - 1) + ", not " + str(first) + ".." + std::to_string(int64_t(first) + n - 1));
  copy_rows(layer, first, n, k, v, false);
}

void ResidualRing::write(uint32_t layer, uint32_t first, uint32_t n, uint32_t length, const uint8_t* k,
                         const uint8_t* v) {
  if (!has(layer)) fail("layer " + str(layer) + " keeps no residual window");
  ensure();
  if (uint64_t(first) + n != length || n > slots_)
    fail("write_ring takes the rows of the layer's last positions, at most its " + str(slots_) +
         " slots, ending at its length " + str(length) + "; not " + str(first) + ".." +
         std::to_string(int64_t(first) + n - 1));
  copy_rows(layer, first, n, const_cast<uint8_t*>(k), const_cast<uint8_t*>(v), true);
  lo_[layer] = first;
}

void ResidualRing::copy_rows(uint32_t layer, uint32_t first, uint32_t n, uint8_t* k, uint8_t* v, bool write) const {
  const ops::BufferView r = view(layer);
  for (uint32_t i = 0; i < n; ++i) {
    const size_t slot = (first + i) % slots_;
    uint8_t* rows[2] = {k + i * row_bytes_, v + i * row_bytes_};
    for (uint32_t kv = 0; kv < 2; ++kv) {
      const size_t at = r.offset + (kv * slots_ + slot) * row_bytes_;
      if (write) r.buffer->write(at, rows[kv], row_bytes_);
      else r.buffer->read(at, rows[kv], row_bytes_);
    }
  }
}

ResidualRing::Saved ResidualRing::save(gpu::CommandQueue& queue, bool whole,
                                       const std::vector<uint32_t>& lengths) const {
  Saved s{nullptr, lo_, whole};
  if (!buffer_ || !whole || !holds_rows(lengths)) return s;  // (nothing to put back)
  s.copy = alloc_(buffer_->length(), "a checkpoint's copy of a residual window's ring");
  auto cb = queue.command_buffer();
  gpu::BlitEncoder& blit = cb->blit_encoder();
  blit.copy(buffer_, 0, s.copy, 0, buffer_->length());
  blit.end_encoding();
  cb->commit();
  cb->wait();
  return s;
}

void ResidualRing::restore(gpu::CommandQueue& queue, const Saved& saved) {
  if (!saved.copy && saved.written) {  // it held no row before the call: none again
    lo_ = saved.lo;
    return;
  }
  if (!saved.copy) {  // the call wrote no ring row: what it made invalid stays so
    for (size_t l = 0; l < lo_.size() && l < saved.lo.size(); ++l) lo_[l] = std::max(lo_[l], saved.lo[l]);
    return;
  }
  auto cb = queue.command_buffer();
  gpu::BlitEncoder& blit = cb->blit_encoder();
  blit.copy(saved.copy, 0, buffer_, 0, buffer_->length());
  blit.end_encoding();
  cb->commit();
  cb->wait();
  lo_ = saved.lo;
}

// The store's side: the ring's rows went in with the pool's (kv_store); a q2 K
// block is sealed from them by the store that fills it.
void KvCache::store_window(EncoderSession& enc, uint32_t layer, uint32_t n, uint32_t n_new) {
  const uint32_t end = n + n_new;
  ring_.stored(layer, end);
  if (layout(layer).k_format != mkv_params::kKvQ2K) return;
  const uint32_t first = n / kBlockTokens, last = end / kBlockTokens;  // the blocks this store fills
  if (last == first) return;
  ops::KvSealDesc d{spec_.n_kv_heads, spec_.head_dim, slots(layer), first * kBlockTokens, last - first,
                    ring_.slots(), ring_.lo(layer)};
  ops::kv_seal_q2k(*device_, enc.compute(), region(layer), ring_.view(layer), table(layer), d);
}

}  // namespace mkv::kv
