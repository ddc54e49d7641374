// The prefix cache: full KV blocks found again by their tokens, so a new
// sequence whose prompt starts like an earlier one takes that prefix's blocks
// without computing or copying them (docs/KV_CACHE.md, "Prefix cache").
//
// Keys are a chain of hashes: block i's hash covers its B token ids and
// block i-1's hash, so it names the whole prefix up to its end; each shared
// pool's BlockPool maps hashes to blocks (per window group) and verifies the
// tokens and parent hash of a hit. A block is published once its B positions
// are canonical (KvCache::canonical: stored by steps of >= 2 tokens), so a
// prefix taken from the cache holds exactly the bits a prefill of the same
// tokens gives: a sequence gets the same output with and without the cache.
// Cached blocks nobody holds stay in the pool, evictable in LRU order. Caches
// with a residual window publish their blocks' f16 rows beside them (the
// pool's PrefixRows) and their chains start from a root of their own (root():
// their blocks' bits differ from a cache's without one); an adoption writes the
// rows its window reads into the adopter's ring. Caches with an eviction policy
// neither publish nor adopt (KvCache::shares_prefixes).
#pragma once

#include <cstdint>
#include <vector>

#include "kv/kv_cache.h"

namespace mkv::kv::prefix {

// Block i's chain hash: of `parent` (block i-1's, root() for the first) and its
// kBlockTokens ids.
uint64_t chain_hash(uint64_t parent, const int32_t* ids);
// The first block's parent for caches with a residual window of `residual`
// positions (0: none, the hash every other cache and the prefix store use).
uint64_t root(uint32_t residual);

// The longest prefix of ids[0..n) a new cache can take from `pool`: at most
// max_tokens tokens, a whole number of blocks, each full group holding every
// block, each sliding group the blocks its window at the prefix's end needs.
struct Match {
  uint32_t tokens = 0;
  std::vector<std::vector<int64_t>> blocks;  // per group, per logical block (-1: not needed)
  std::vector<uint64_t> hashes;              // per block of the prefix
  std::vector<uint32_t> evictable;           // per group: of those blocks, how many nobody holds now
  // With a residual window: the f16 rows (PrefixRows) of the prefix's last
  // blocks, those the window at its end reads, oldest first.
  std::vector<PrefixRows::Rows> rows;
};
// Call with the pool's mutex held, and keep it until the blocks are adopted.
// residual: the adopter's residual window (0: none): its chains' root, and (adopting)
// a prefix then ends where the rows of its window's blocks are at hand.
Match find(const KvPool& pool, const int32_t* ids, uint32_t n, uint32_t max_tokens, uint32_t residual = 0,
           bool adopting = true);

// Publishes the cache's canonical full blocks not yet published (their hashes
// go to cache.record().block_hashes()); a block whose tokens already have a block stays
// the cache's alone. Needs the cache's token ids (an engine's cache).
void publish(KvCache& cache);

// Cached blocks to and from host memory (the prefix store beyond the pool:
// python/metalkv/prefix_store.py). A block's record is its rows in every layer
// as the pool holds them: for each group, each of its layers' K block then V
// block (kv_layout.h), in the pool's formats; for caches with a residual
// window, then a byte (1: its window rows follow, 0: the pool had none) and
// room for its PrefixRows. Pools whose groups are all full (no sliding window)
// only: ArgumentError otherwise.
size_t record_bytes(const KvPool& pool, uint32_t residual = 0);
// The records of the blocks of ids' longest cached prefix (at most max_tokens)
// in the chains of caches with that residual window.
std::vector<std::vector<uint8_t>> export_blocks(const KvPool& pool, const int32_t* ids, uint32_t n,
                                                uint32_t max_tokens, uint32_t residual = 0);
// Puts n_blocks records (block i of ids, each record_bytes long) into the
// pool's prefix cache: each block its key does not already hold is written into
// a fresh block, registered and left evictable (its window rows beside it).
// Stops at the first block the pool has no room for. Returns the tokens of ids'
// prefix a call could then take from the cache.
uint32_t import_blocks(KvPool& pool, const int32_t* ids, const std::vector<const uint8_t*>& records,
                       uint32_t residual = 0);

}  // namespace mkv::kv::prefix
