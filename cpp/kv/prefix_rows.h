// PrefixRows: the f16 rows a residual window needs beside the prefix cache's
// blocks (docs/KV_CACHE.md, "Prefix cache"). A cache with a residual window
// reads each query's last `residual` positions from its ring in f16, which the
// pool's blocks hold quantized, so a prefix taken from the prefix cache gives
// the bits a prefill gives only when the adopter's ring gets those rows too.
// Each published block of such a cache leaves its rows here: for every layer
// with a ring (ascending), K then V, kBlockTokens rows of n_kv_heads * head_dim
// halves each. Host memory, keyed and checked like the blocks, least recently
// used out past max_bytes (a quarter of the pool's bytes); an adoption needs
// the rows of the blocks its window reads, and is cut short where they are gone.
// Under the pool's mutex, as the blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"

namespace mkv::kv {

class PrefixRows {
 public:
  using Rows = std::shared_ptr<const std::vector<uint8_t>>;
  void set_max_bytes(size_t bytes) { max_bytes_ = bytes; }
  size_t max_bytes() const { return max_bytes_; }
  size_t nbytes() const { return bytes_; }
  size_t count() const { return map_.size(); }
  void put(const BlockKey& key, std::vector<uint8_t> rows);
  // The block's rows (and now the most recently used), or null.
  Rows get(const BlockKey& key) const;

 private:
  struct Entry {
    BlockKey key;
    Rows rows;
    std::list<uint64_t>::iterator at;
  };
  std::unordered_map<uint64_t, Entry> map_;  // by the block's chain hash
  mutable std::list<uint64_t> lru_;  // least recently used first (a hit moves its entry: a cache's own order)
  size_t bytes_ = 0, max_bytes_ = 0;
};

}  // namespace mkv::kv
