// KvCache::checkpoint / restore: a call that fails part-way (a device error,
// an exception from a callback, Ctrl-C) puts the cache back as it was.
//
// Lengths, token ids, messages, the prefix-cache state and each group's table
// (as data) are host state and are simply copied. Blocks need care where the
// call may overwrite or free one the old state holds.
//
// A pool of the cache's own (no other user) copies those blocks aside:
//   full group     the blocks of positions [keep, min(length, keep + n_store)):
//                  truncate() gives them back last first, so the call's appends
//                  take them again in position order and write exactly those;
//   sliding group  every held block, when the call stores or truncates: its
//                  window lets blocks go and the pool hands them out again.
// Restoring gives the tables their old block ids back (free again: nobody else
// takes them) and copies the saved blocks in; one blit command buffer each way.
//
// A shared pool's other sequences may take any block set free, so there the
// checkpoint holds an owner on every block the tables hold (RetainedBlocks):
// nothing is copied, freed blocks stay the checkpoint's, and the call's first
// write into a held tail block copies it (copy-on-write, as for any shared
// block). Restoring hands those owners back to the tables; a checkpoint that
// goes away unused gives them back to the pool. The engine reserves the blocks
// the call may take (KvCache::blocks_to_store), so the copies always fit.
//
// An eviction policy's state (EvictionState::save) is host data and the score
// buffers, copied through the host; its group saves every held block (own
// pool), as a sliding group does: an eviction writes and frees any of them.
//
// A residual window's ring is the sequence's own: its part (ResidualRing::save)
// copies it whole when the call stores or truncates, and its lo with it.
#include "kv/kv_cache.h"

#include <algorithm>

namespace mkv::kv {
namespace {

enum class Direction { save, restore };

// Copies the saved blocks of every layer of every group, one command buffer.
void copy_blocks(gpu::CommandQueue& queue, const KvPool& pools,
                 const std::vector<LayerLayout>& layouts, const std::vector<std::vector<uint32_t>>& group_layers,
                 const std::vector<KvCache::SavedBlocks>& saved, Direction dir) {
  auto cb = queue.command_buffer();
  gpu::BlitEncoder* blit = nullptr;
  for (size_t g = 0; g < saved.size(); ++g) {
    const KvCache::SavedBlocks& s = saved[g];
    for (size_t i = 0; i < group_layers[g].size() && !s.ids.empty(); ++i) {
      const uint32_t l = group_layers[g][i];
      if (!blit) blit = &cb->blit_encoder();
      const size_t n = s.ids.size();
      for (size_t b = 0; b < n; ++b)
        for (uint32_t kv = 0; kv < 2; ++kv) {  // the copy: n K blocks, then n V blocks
          const size_t block = layouts[l].block_bytes(kv);
          const size_t in_pool = layouts[l].block_offset(kv, s.ids[b]);
          const size_t in_copy = kv * n * layouts[l].block_bytes(0) + b * block;
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

KvCache::RetainedBlocks& KvCache::RetainedBlocks::operator=(RetainedBlocks&& o) noexcept {
  if (this != &o) {
    release();
    pool = std::move(o.pool);
    ids = std::move(o.ids);
    o.ids.clear();
  }
  return *this;
}

void KvCache::RetainedBlocks::release() {
  if (!pool) return;
  std::lock_guard<std::recursive_mutex> lock(pool->mutex());
  for (size_t g = 0; g < ids.size(); ++g)
    for (uint32_t id : ids[g]) pool->blocks(uint32_t(g)).release(id);
  ids.clear();
}

KvCache::Checkpoint KvCache::checkpoint(gpu::CommandQueue& queue, uint32_t keep, uint64_t n_store) const {
  std::lock_guard<std::recursive_mutex> lock(pool_->mutex());
  Checkpoint cp;
  cp.lengths = lengths_;
  cp.record = record_.save();
  cp.ring = ring_.save(queue, n_store > 0 || keep < lengths_[0], lengths_);
  cp.eviction = eviction_.save();
  if (!owns_pool_) {
    cp.retained.pool = pool_;
    for (uint32_t g = 0; g < groups_.size(); ++g) {
      cp.tables.push_back(groups_[g].table->state());
      std::vector<uint32_t> held;
      for (int64_t b : groups_[g].table->blocks())
        if (b >= 0) {
          pool_->blocks(g).retain(uint32_t(b));
          held.push_back(uint32_t(b));
        }
      cp.retained.ids.push_back(std::move(held));
    }
    return cp;
  }
  std::vector<LayerLayout> layouts;
  for (uint32_t l = 0; l < spec_.n_layers; ++l) layouts.push_back(layout(l));
  std::vector<std::vector<uint32_t>> group_layers;
  for (const Group& g : groups_) {
    cp.tables.push_back(g.table->state());
    group_layers.push_back(g.layers);
    const std::vector<int64_t>& blocks = g.table->blocks();
    const uint32_t length = g.table->length();
    SavedBlocks s;
    if (g.window != 0 || g.evicts) {  // (an eviction may write any block)
      if (n_store > 0 || keep < length)
        for (int64_t b : blocks)
          if (b >= 0) s.ids.push_back(uint32_t(b));
    } else if (keep < length && n_store > 0) {
      const uint64_t end = std::min<uint64_t>(length, keep + n_store);
      for (uint64_t i = keep / kBlockTokens; i * kBlockTokens < end; ++i) s.ids.push_back(uint32_t(blocks[i]));
    }
    for (size_t i = 0; i < g.layers.size() && !s.ids.empty(); ++i)
      s.copies.push_back(alloc_(s.ids.size() * (layouts[g.layers[i]].block_bytes(0) +
                                                layouts[g.layers[i]].block_bytes(1)), "a checkpoint's copy of blocks"));
    cp.blocks.push_back(std::move(s));
  }
  copy_blocks(queue, *pool_, layouts, group_layers, cp.blocks, Direction::save);
  return cp;
}

void KvCache::restore(gpu::CommandQueue& queue, Checkpoint& cp) {
  std::lock_guard<std::recursive_mutex> lock(pool_->mutex());
  lengths_ = cp.lengths;
  record_.restore(cp.record);
  eviction_.restore(cp.eviction);
  ring_.restore(queue, cp.ring);
  if (cp.retained.pool) {
    for (size_t i = 0; i < groups_.size(); ++i) {
      groups_[i].table->restore_owned(cp.tables[i]);
      sync_table(groups_[i], 0);
    }
    cp.retained.ids.clear();  // the tables own them now
    return;
  }
  std::vector<LayerLayout> layouts;
  for (uint32_t l = 0; l < spec_.n_layers; ++l) layouts.push_back(layout(l));
  std::vector<std::vector<uint32_t>> group_layers;
  for (size_t i = 0; i < groups_.size(); ++i) {
    groups_[i].table->restore(cp.tables[i]);
    sync_table(groups_[i], 0);
    group_layers.push_back(groups_[i].layers);
  }
  copy_blocks(queue, *pool_, layouts, group_layers, cp.blocks, Direction::restore);
}

}  // namespace mkv::kv
