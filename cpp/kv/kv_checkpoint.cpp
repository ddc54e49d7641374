// KVCache::checkpoint / restore: a call that fails part-way (a device error,
// an exception from a callback, Ctrl-C) puts the cache back as it was.
//
// Lengths, token ids, messages and each group's table (as data) are host
// state and are simply copied. Blocks need care where the call may overwrite
// one the old state holds:
//   full group     the blocks of positions [keep, min(length, keep + n_store)):
//                  truncate() gives them back last first, so the call's appends
//                  take them again in position order and write exactly those;
//   sliding group  every held block, when the call stores or truncates: its
//                  window lets blocks go and the pool hands them out again.
// Restoring gives the tables their old block ids back and copies the saved
// blocks in; one blit command buffer each way. The ids are free once the live
// tables let go: the cache's own pool has no other user, and an engine runs
// one call at a time over its shared pool (what another cache frees meanwhile
// only moves the free stack, never takes an id of this one).
#include "kv/kv_cache.h"

#include <algorithm>

namespace mkv::kv {
namespace {

enum class Direction { save, restore };

// Copies the saved blocks of every layer of every group, one command buffer.
void copy_blocks(gpu::CommandQueue& queue, const KvPool& pools,
                 const std::vector<LayerLayout>& layouts, const std::vector<std::vector<uint32_t>>& group_layers,
                 const std::vector<KVCache::SavedBlocks>& saved, Direction dir) {
  auto cb = queue.command_buffer();
  gpu::BlitEncoder* blit = nullptr;
  for (size_t g = 0; g < saved.size(); ++g) {
    const KVCache::SavedBlocks& s = saved[g];
    for (size_t i = 0; i < group_layers[g].size() && !s.ids.empty(); ++i) {
      const uint32_t l = group_layers[g][i];
      if (!blit) blit = &cb->blit_encoder();
      const size_t block = kBlockTokens * layouts[l].row_bytes(), n = s.ids.size();
      for (size_t b = 0; b < n; ++b)
        for (uint32_t kv = 0; kv < 2; ++kv) {
          const size_t in_pool = layouts[l].row_offset(kv, s.ids[b] * kBlockTokens);
          const size_t in_copy = (kv * n + b) * block;
          if (dir == Direction::save)
            blit->copy(pools.region(l).buffer, in_pool, s.copies[i], in_copy, block);
          else
            blit->copy(s.copies[i], in_copy, pools.region(l).buffer, in_pool, block);
        }
    }
  }
  if (!blit) return;
  blit->end_encoding();
  cb->commit();
  cb->wait();
}

}  // namespace

KVCache::Checkpoint KVCache::checkpoint(gpu::CommandQueue& queue, uint32_t keep, uint64_t n_store) const {
  Checkpoint cp{lengths_, tokens_, messages_, {}, {}};
  std::vector<LayerLayout> layouts;
  for (uint32_t l = 0; l < spec_.n_layers; ++l) layouts.push_back(layout(l));
  std::vector<std::vector<uint32_t>> group_layers;
  for (const Group& g : groups_) {
    cp.tables.push_back(g.table->state());
    group_layers.push_back(g.layers);
    const std::vector<int64_t>& blocks = g.table->blocks();
    const uint32_t length = g.table->length();
    SavedBlocks s;
    if (g.window != 0) {
      if (n_store > 0 || keep < length)
        for (int64_t b : blocks)
          if (b >= 0) s.ids.push_back(uint32_t(b));
    } else if (keep < length && n_store > 0) {
      const uint64_t end = std::min<uint64_t>(length, keep + n_store);
      for (uint64_t i = keep / kBlockTokens; i * kBlockTokens < end; ++i) s.ids.push_back(uint32_t(blocks[i]));
    }
    for (size_t i = 0; i < g.layers.size() && !s.ids.empty(); ++i)
      s.copies.push_back(device_->new_buffer(2 * s.ids.size() * kBlockTokens * layouts[g.layers[i]].row_bytes()));
    cp.blocks.push_back(std::move(s));
  }
  copy_blocks(queue, *pool_, layouts, group_layers, cp.blocks, Direction::save);
  return cp;
}

void KVCache::restore(gpu::CommandQueue& queue, const Checkpoint& cp) {
  std::vector<LayerLayout> layouts;
  for (uint32_t l = 0; l < spec_.n_layers; ++l) layouts.push_back(layout(l));
  std::vector<std::vector<uint32_t>> group_layers;
  for (size_t i = 0; i < groups_.size(); ++i) {
    groups_[i].table->restore(cp.tables[i]);
    sync_table(groups_[i], 0);
    group_layers.push_back(groups_[i].layers);
  }
  copy_blocks(queue, *pool_, layouts, group_layers, cp.blocks, Direction::restore);
  lengths_ = cp.lengths;
  tokens_ = cp.tokens;
  messages_ = cp.messages;
}

}  // namespace mkv::kv
