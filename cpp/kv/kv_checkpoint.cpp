// KVCache::checkpoint / restore: a call that fails part-way (a device error,
// an exception from a callback, Ctrl-C) puts the cache back as it was.
//
// Lengths, token ids and messages are host state and are simply copied. Slots
// need care where the call may overwrite a position the old state holds:
//   full layer  only after a truncation, in the truncated rows [keep, length)
//               (rows beyond the old length are unused once it is restored);
//   ring layer  after a truncation, or when more than max_chunk tokens arrive,
//               the oldest slots overwritten include positions the window at the
//               old length still reads: the whole ring is saved.
// Saved rows go to device buffers through one blit command buffer each way.
#include "kv/kv_cache.h"

#include <algorithm>

namespace mkv::kv {
namespace {

enum class Direction { save, restore };

void copy_rows(gpu::CommandQueue& queue, const std::vector<gpu::BufferPtr>& regions,
               const std::vector<LayerLayout>& layouts, const std::vector<KVCache::SavedRows>& rows,
               Direction dir) {
  auto cb = queue.command_buffer();
  gpu::BlitEncoder* blit = nullptr;
  for (size_t l = 0; l < rows.size(); ++l) {
    const KVCache::SavedRows& r = rows[l];
    if (r.count == 0) continue;
    if (!blit) blit = &cb->blit_encoder();
    const size_t row = layouts[l].row_bytes(), block = size_t(r.count) * row;
    for (uint32_t kv = 0; kv < 2; ++kv) {
      const size_t in_region = layouts[l].row_offset(kv, r.first), in_copy = kv * block;
      if (dir == Direction::save)
        blit->copy(regions[l], in_region, r.copy, in_copy, block);
      else
        blit->copy(r.copy, in_copy, regions[l], in_region, block);
    }
  }
  if (!blit) return;
  blit->end_encoding();
  cb->commit();
  cb->wait();
}

}  // namespace

KVCache::Checkpoint KVCache::checkpoint(gpu::CommandQueue& queue, uint32_t keep, uint64_t n_store) const {
  Checkpoint cp{lengths_, tokens_, messages_, std::vector<SavedRows>(spec_.n_layers)};
  std::vector<LayerLayout> layouts;
  for (uint32_t l = 0; l < spec_.n_layers; ++l) {
    layouts.push_back(layout(l));
    const uint32_t n = lengths_[l];
    SavedRows& r = cp.rows[l];
    if (wraps(l)) {
      if (n > 0 && (keep < n || n_store > spec_.max_chunk)) r = {0, slots_[l], nullptr};
    } else if (keep < n && n_store > 0) {
      r = {keep, uint32_t(std::min<uint64_t>(n - keep, n_store)), nullptr};
    }
    if (r.count) r.copy = device_->new_buffer(2 * size_t(r.count) * layouts[l].row_bytes());
  }
  copy_rows(queue, buffers_, layouts, cp.rows, Direction::save);
  return cp;
}

void KVCache::restore(gpu::CommandQueue& queue, const Checkpoint& cp) {
  std::vector<LayerLayout> layouts;
  for (uint32_t l = 0; l < spec_.n_layers; ++l) layouts.push_back(layout(l));
  copy_rows(queue, buffers_, layouts, cp.rows, Direction::restore);
  lengths_ = cp.lengths;
  tokens_ = cp.tokens;
  messages_ = cp.messages;
}

}  // namespace mkv::kv
