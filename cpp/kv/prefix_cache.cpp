#include "kv/prefix_cache.h"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "gpu/errors.h"

namespace mkv::kv::prefix {
namespace {

// splitmix64's finalizer: a good 64-bit mixer.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

BlockKey key_of(uint64_t parent, const int32_t* ids) {
  return {chain_hash(parent, ids), parent, std::vector<int32_t>(ids, ids + kBlockTokens)};
}

// The lowest position a sliding window W needs at n tokens (the next query's window).
uint32_t first_needed(uint32_t window, uint32_t n) { return window == 0 || n < window ? 0 : n - window + 1; }

}  // namespace

uint64_t root(uint32_t residual) { return residual ? mix(0x7265736964ull ^ residual) : 0; }  // "resid"

uint64_t chain_hash(uint64_t parent, const int32_t* ids) {
  uint64_t h = mix(parent ^ 0x6d6b7666u);  // "mkvf": block 0's parent 0 still mixes
  for (uint32_t i = 0; i < kBlockTokens; ++i) h = mix(h ^ uint32_t(ids[i]));
  return h;
}

Match find(const KvPool& pool, const int32_t* ids, uint32_t n, uint32_t max_tokens, uint32_t residual,
           bool adopting) {
  Match m;
  m.evictable.assign(pool.n_groups(), 0);
  const uint32_t n_blocks = std::min(n, max_tokens) / kBlockTokens;
  if (n_blocks == 0) return m;
  // Per group, block i's id (or -1), as far as the chain goes.
  std::vector<BlockKey> keys;
  uint64_t parent = root(residual);
  for (uint32_t i = 0; i < n_blocks; ++i) {
    keys.push_back(key_of(parent, ids + size_t(i) * kBlockTokens));
    parent = keys.back().hash;
  }
  const uint32_t groups = pool.n_groups();
  std::vector<std::vector<int64_t>> found(groups, std::vector<int64_t>(n_blocks, -1));
  uint32_t full_run = n_blocks;  // blocks every full group holds from block 0
  for (uint32_t g = 0; g < groups; ++g)
    for (uint32_t i = 0; i < n_blocks; ++i) {
      found[g][i] = pool.blocks(g).find(keys[i]);
      if (pool.group_window(g) == 0 && found[g][i] < 0) full_run = std::min(full_run, i);
    }
  // The longest prefix of k blocks every sliding group can serve at k·B tokens
  // (and whose window's f16 rows are at hand: its last residual / B blocks').
  for (uint32_t k = full_run; k > 0; --k) {
    bool ok = true;
    std::vector<PrefixRows::Rows> rows;
    for (uint32_t i = k > residual / kBlockTokens ? k - residual / kBlockTokens : 0;
         residual && adopting && i < k && ok; ++i) {
      rows.push_back(pool.prefix_rows().get(keys[i]));
      ok = rows.back() != nullptr;
    }
    for (uint32_t g = 0; g < groups && ok; ++g) {
      const uint32_t w = pool.group_window(g);
      if (w == 0) continue;
      for (uint32_t i = first_needed(w, k * kBlockTokens) / kBlockTokens; i < k && ok; ++i) ok = found[g][i] >= 0;
    }
    if (!ok) continue;
    m.tokens = k * kBlockTokens;
    for (uint32_t g = 0; g < groups; ++g) {
      const uint32_t w = pool.group_window(g), first = first_needed(w, m.tokens) / kBlockTokens;
      std::vector<int64_t> blocks(k, -1);
      uint32_t evictable = 0;
      for (uint32_t i = first; i < k; ++i) {
        blocks[i] = found[g][i];
        if (pool.blocks(g).owners(uint32_t(blocks[i])) == 0) ++evictable;
      }
      m.blocks.push_back(std::move(blocks));
      m.evictable[g] = evictable;
    }
    for (uint32_t i = 0; i < k; ++i) m.hashes.push_back(keys[i].hash);
    m.rows = std::move(rows);
    return m;
  }
  return m;
}

namespace {

// Block i's rows in every ringed layer, K then V (PrefixRows' layout); empty
// when a ring no longer holds them.
std::vector<uint8_t> window_rows(const KvCache& cache, uint32_t i) {
  const ResidualRing& ring = cache.ring();
  const size_t rows = size_t(kBlockTokens) * cache.spec().n_kv_heads * cache.spec().head_dim * 2;  // f16
  std::vector<uint8_t> out;
  for (uint32_t l = 0; l < cache.n_layers(); ++l) {
    if (!ring.has(l)) continue;
    if (ring.nbytes() == 0 || ring.lo(l) > i * kBlockTokens) return {};
    out.resize(out.size() + 2 * rows);
    uint8_t* k = out.data() + out.size() - 2 * rows;
    ring.read(l, i * kBlockTokens, kBlockTokens, cache.length(l), k, k + rows);
  }
  return out;
}

}  // namespace

void publish(KvCache& cache) {
  if (!cache.shares_prefixes()) return;
  std::lock_guard<std::recursive_mutex> lock(cache.pool().mutex());
  const uint32_t done = uint32_t(cache.record().block_hashes().size());
  const uint32_t ready = std::min<uint32_t>(cache.record().canonical(), uint32_t(cache.record().tokens().size())) / kBlockTokens;
  const uint32_t residual = cache.spec().residual;
  for (uint32_t i = done; i < ready; ++i) {
    const uint64_t parent = i ? cache.record().block_hashes()[i - 1] : root(residual);
    const BlockKey key = key_of(parent, cache.record().tokens().data() + size_t(i) * kBlockTokens);
    KvPool& pool = cache.pool();
    if (residual) {  // its window's rows go beside it, or (gone from the ring) it stays unpublished
      std::vector<uint8_t> rows = window_rows(cache, i);
      if (rows.empty()) return;
      pool.prefix_rows().put(key, std::move(rows));
    }
    for (uint32_t g = 0; g < pool.n_groups(); ++g) {
      const std::vector<int64_t>& blocks = cache.block_table(pool.group_layers(g)[0]).blocks();
      if (i < blocks.size() && blocks[i] >= 0) pool.blocks(g).register_block(uint32_t(blocks[i]), key);
    }
    cache.record().add_block_hash(key.hash);
  }
}

namespace {

void check_full(const KvPool& pool, const char* op) {
  for (uint32_t g = 0; g < pool.n_groups(); ++g)
    if (pool.group_window(g) != 0)
      throw gpu::ArgumentError(op, "pool", "a pool whose layers are all full: sliding layers keep only a window of "
                                           "a prefix's blocks");
}

// Copies block `id` of group g's layers between the pool and `at` (a record's
// part for the group), K block then V block of each layer.
void copy_group(const KvPool& pool, uint32_t g, uint32_t id, uint8_t* at, bool to_pool) {
  for (uint32_t l : pool.group_layers(g)) {
    const ops::BufferView region = pool.region(l);
    const LayerLayout lay = pool.layout(l);
    for (uint32_t kv = 0; kv < 2; ++kv) {
      const size_t offset = region.offset + lay.block_offset(kv, id), bytes = lay.block_bytes(kv);
      if (to_pool)
        region.buffer->write(offset, at, bytes);
      else
        region.buffer->read(offset, at, bytes);
      at += bytes;
    }
  }
}

size_t group_bytes(const KvPool& pool, uint32_t g) {
  size_t total = 0;
  for (uint32_t l : pool.group_layers(g)) total += pool.layout(l).block_bytes(0) + pool.layout(l).block_bytes(1);
  return total;
}

// One block's window rows (PrefixRows' layout): K and V f16 rows of every layer with a ring.
size_t rows_bytes(const KvPool& pool) {
  const KvPoolSpec& s = pool.spec();
  size_t total = 0;
  for (uint32_t l = 0; l < pool.n_layers(); ++l)
    if (s.k_format(l) != mkv_params::kKvF16 || s.v_format(l) != mkv_params::kKvF16)
      total += 2 * size_t(kBlockTokens) * s.n_kv_heads * s.head_dim * 2;
  return total;
}

size_t blocks_bytes(const KvPool& pool) {
  size_t total = 0;
  for (uint32_t g = 0; g < pool.n_groups(); ++g) total += group_bytes(pool, g);
  return total;
}

}  // namespace

size_t record_bytes(const KvPool& pool, uint32_t residual) {
  return blocks_bytes(pool) + (residual ? 1 + rows_bytes(pool) : 0);
}

std::vector<std::vector<uint8_t>> export_blocks(const KvPool& pool, const int32_t* ids, uint32_t n,
                                                uint32_t max_tokens, uint32_t residual) {
  check_full(pool, "export_prefix");
  std::lock_guard<std::recursive_mutex> lock(pool.mutex());
  const Match m = find(pool, ids, n, max_tokens, residual, /*adopting=*/false);
  std::vector<std::vector<uint8_t>> out(m.tokens / kBlockTokens, std::vector<uint8_t>(record_bytes(pool, residual)));
  uint64_t parent = root(residual);
  for (size_t i = 0; i < out.size(); ++i) {
    uint8_t* at = out[i].data();
    for (uint32_t g = 0; g < pool.n_groups(); ++g) {
      copy_group(pool, g, uint32_t(m.blocks[g][i]), at, /*to_pool=*/false);
      at += group_bytes(pool, g);
    }
    const BlockKey key = key_of(parent, ids + i * kBlockTokens);
    parent = key.hash;
    if (!residual) continue;
    const PrefixRows::Rows rows = pool.prefix_rows().get(key);
    *at = rows ? 1 : 0;  // (a block whose rows are gone goes without: a hit ends before it needs them)
    if (rows) std::copy(rows->begin(), rows->end(), at + 1);
  }
  return out;
}

uint32_t import_blocks(KvPool& pool, const int32_t* ids, const std::vector<const uint8_t*>& records,
                       uint32_t residual) {
  check_full(pool, "import_prefix");
  std::lock_guard<std::recursive_mutex> lock(pool.mutex());
  const size_t rows = rows_bytes(pool);
  // The chain's blocks stay held until every record is in: released one by one, its
  // first blocks would be evictable, and the later allocations would evict them.
  std::vector<std::pair<uint32_t, uint32_t>> held;  // (group, block)
  uint64_t parent = root(residual);
  bool room = true;
  for (size_t i = 0; i < records.size() && room; ++i) {
    const BlockKey key = key_of(parent, ids + i * kBlockTokens);
    const uint8_t* at = records[i];
    if (residual && at[blocks_bytes(pool)] == 1 && !pool.prefix_rows().get(key))
      pool.prefix_rows().put(key, std::vector<uint8_t>(at + blocks_bytes(pool) + 1, at + blocks_bytes(pool) + 1 + rows));
    for (uint32_t g = 0; g < pool.n_groups() && room; ++g) {
      BlockPool& blocks = pool.blocks(g);
      if (const int64_t found = blocks.find(key); found >= 0) {
        blocks.retain(uint32_t(found));  // (an earlier import's: not to be evicted by this one's)
        held.emplace_back(g, uint32_t(found));
      } else if ((room = blocks.available() > 0)) {  // none: what is in stays, the call computes the rest
        const uint32_t id = blocks.allocate(1)[0];
        copy_group(pool, g, id, const_cast<uint8_t*>(at), /*to_pool=*/true);
        blocks.register_block(id, key);
        held.emplace_back(g, id);
      }
      at += group_bytes(pool, g);
    }
    parent = key.hash;
  }
  for (const auto& [g, id] : held) pool.blocks(g).release(id);  // cached, nobody's: evictable, as a finished call's
  const uint32_t n = uint32_t(records.size()) * kBlockTokens;    // blocks are
  return find(pool, ids, n, n, residual).tokens;                  // (the run in every group, from the first block)
}

}  // namespace mkv::kv::prefix
