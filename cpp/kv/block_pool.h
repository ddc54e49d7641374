// Blocks of the paged KV cache (issue 13; ../shared/DESIGN.md, "The KV cache,
// next: blocks"): the host-side bookkeeping, no device memory.
//
// A layer's pool is its region: a K section then a V section of
// n_blocks * kBlockTokens slots each, in the layer's formats (kv/kv_layout.h),
// cut into blocks of kBlockTokens consecutive slots, each block one contiguous
// range of each section. BlockPool hands out block ids with
// reference counts (several sequences may share a prefix's blocks); a
// BlockTable maps one sequence's positions to slots: position p lives in
// slot blocks[p / B] * B + p % B. Layers of one window share one table (the
// same block id in every layer of the group), so one pool of ids serves them.
//
// Why B = 32: the SIMD width of Apple GPUs and of NVIDIA warps (a lane per key
// of a block in the attention kernels), KIVI's per-channel quantization groups
// (issue 14), and a waste of at most 31 tokens per sequence and window group
// (vLLM uses 16 on CUDA, mistral.rs 32 on Metal).
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "metal/kv_params.h"

namespace mkv::kv {

constexpr uint32_t kBlockTokens = mkv_params::kKvBlockTokens;  // one definition, kernels and C++

// A full block's content in the prefix cache: the chain hash of every token
// up to its end (kv/prefix_cache.h) and what verifies it, so a hash collision
// can never hand out another prefix's rows.
struct BlockKey {
  uint64_t hash = 0;
  uint64_t parent = 0;          // the previous block's hash (0 for the first block)
  std::vector<int32_t> tokens;  // its kBlockTokens token ids
};

// Block ids with owner counts, a free stack, reservations, and the prefix
// cache's blocks. Not thread-safe: a KvPool's users serialize on its mutex.
//
// Cached blocks (register_block): a full block whose rows are those of a known
// token prefix. It is never written again (a table copies it before writing:
// copy-on-write), and when its last owner lets go it is not freed but kept,
// evictable, in least-recently-used order: find() hands it out again, and
// allocate() evicts the oldest when the free stack runs out. So available() =
// free + evictable.
//
// Reservations: a sequence of a shared pool reserves, before its call starts,
// the blocks the call may take (try_reserve); others' allocations leave
// reserved blocks alone, so an admitted call never finds the pool full.
class BlockPool {
 public:
  explicit BlockPool(uint32_t n_blocks);  // raises GpuError "[block_pool] ..." for 0

  uint32_t capacity() const { return uint32_t(refs_.size()); }
  uint32_t free_count() const { return uint32_t(free_.size() + lru_.size()); }  // free or evictable
  uint32_t used_count() const { return capacity() - free_count(); }
  uint32_t reserved_count() const { return reserved_; }
  uint32_t available() const { return free_count() - reserved_; }  // what an unreserved allocate may take

  // n blocks, each with one owner, `reserved` of them from reservations;
  // all or nothing: raises (taking none) when fewer are available. Free
  // blocks come first, the most recently freed first; then the least recently
  // used evictable ones, which leave the prefix cache.
  std::vector<uint32_t> allocate(uint32_t n, uint32_t reserved = 0);
  // Takes these free (or evictable) ids, one owner each (a table put back as
  // it was); all or nothing: raises when one has an owner.
  void acquire(const std::vector<uint32_t>& ids);
  void retain(uint32_t id);   // one more owner (a shared prefix; an evictable block leaves the LRU)
  void release(uint32_t id);  // one owner fewer; at none, free (or evictable when cached)
  uint32_t owners(uint32_t id) const;

  bool try_reserve(uint32_t n);  // reserves n if available() allows; false (reserving none) otherwise
  void unreserve(uint32_t n);

  // The prefix cache. register_block marks a held block as holding key's rows
  // (false when that key already has a block, or the block has a key);
  // find gives the block holding key's rows, or -1.
  bool register_block(uint32_t id, const BlockKey& key);
  int64_t find(const BlockKey& key) const;
  bool cached(uint32_t id) const;
  uint32_t cached_count() const { return uint32_t(key_of_.size()); }
  uint32_t evictable_count() const { return uint32_t(lru_.size()); }

 private:
  void check_id(const char* what, uint32_t id) const;
  void evict_one();  // the least recently used evictable block leaves the cache, free
  std::vector<uint32_t> refs_;  // owners per block id
  std::vector<uint32_t> free_;  // a stack of free ids
  uint32_t reserved_ = 0;
  std::unordered_map<uint64_t, uint32_t> by_hash_;  // cached: hash -> block
  std::unordered_map<uint32_t, BlockKey> key_of_;   // cached: block -> key
  std::list<uint32_t> lru_;                         // evictable (cached, no owner), oldest first
  std::unordered_map<uint32_t, std::list<uint32_t>::iterator> lru_pos_;
};

// A block to copy before a store writes into it: the first write after a fork
// into a partly filled block that another table still reads (copy-on-write).
struct BlockCopy {
  uint32_t src;
  uint32_t dst;
};

// One sequence's blocks in one window group. window 0: a full layer, every
// block kept; W > 0: a sliding layer, whose blocks wholly before the window
// of the next token's queries, less `history` positions more, go back to the
// pool as positions advance. history is what truncate() may take back: a
// sliding table can always go back to `history` positions before the start
// of its last append (after one-token appends: its last history + 1 tokens).
class BlockTable {
 public:
  BlockTable(BlockPool& pool, uint32_t window = 0, uint32_t history = 0);
  ~BlockTable();  // releases every block it holds
  BlockTable(const BlockTable&) = delete;
  BlockTable& operator=(const BlockTable&) = delete;

  uint32_t length() const { return length_; }  // tokens stored = position of the next
  uint32_t window() const { return window_; }
  uint32_t history() const { return history_; }
  // Physical block per logical block i (positions [iB, (i+1)B)); -1 where a
  // sliding table has let the block go.
  const std::vector<int64_t>& blocks() const { return blocks_; }
  uint32_t held_blocks() const;
  uint32_t slot(uint32_t pos) const;  // raises for a position not held
  // Lowest position whose row was stored: a window of 1 truncated into a
  // block it let go takes a fresh tail block, whose earlier rows hold nothing.
  uint32_t first_valid() const { return valid_from_; }
  bool holds(uint32_t pos) const;     // stored, not let go, and valid

  // Blocks a store of n more tokens would take from the pool (after freeing
  // what a sliding window lets go, and counting a tail block to copy or replace:
  // shared with another owner or in the prefix cache).
  uint32_t blocks_needed(uint32_t n) const;
  // Whether append(n) would find those blocks (counting what it lets go first).
  bool can_append(uint32_t n) const;
  // Makes room for positions length() .. length() + n - 1 and advances
  // length(); all or nothing (raises when the pool is short). Returns the
  // copies the caller must encode before the store (a shared tail block).
  std::vector<BlockCopy> append(uint32_t n);
  // Forgets positions n.. (the blocks past them go back, the last first, so
  // the next appends take them again in position order). A sliding table
  // raises when the window at n needs positions it has already let go.
  void truncate(uint32_t n);
  void check_truncate(uint32_t n) const;  // the checks truncate(n) makes, changing nothing
  // An eviction's compaction (KvCache, kv_evict.cpp) writes into these
  // logical blocks: each one another owner (a checkpoint) shares is replaced
  // by a fresh block (from the reservation first), returned as the copies to
  // encode first; all or nothing. shrink(n) then drops positions n.. like
  // truncate() but keeps the reservation: what it frees it may take again.
  std::vector<BlockCopy> make_writable(const std::vector<uint32_t>& logical);
  void shrink(uint32_t n);
  // Blocks make_writable(logical) would take from the pool.
  uint32_t shared_among(const std::vector<uint32_t>& logical) const;
  // An empty sliding table starts at position n: positions before n are
  // outside every window it will serve (a saved cache read back). Raises for
  // a full table or one that holds anything.
  void skip_to(uint32_t n);
  // Becomes a table over the first n positions of `other` without copying:
  // shares its blocks (the last one copy-on-write if partly filled).
  void share_prefix(const BlockTable& other, uint32_t n);
  // Becomes a table over n positions held in `ids` (per logical block; -1 for
  // none, as a sliding table needs only its window), taking an owner on each:
  // a prefix found in the prefix cache. Needs an empty table.
  void adopt(const std::vector<int64_t>& ids, uint32_t n);

  // Blocks this table may take beyond what the pool has available to others
  // (BlockPool::try_reserve); appends use them first, and a sliding table
  // reserves again what its window sets free (up to n). unreserve gives back
  // what is left (the destructor too).
  bool reserve(uint32_t n);
  void unreserve();
  uint32_t reserved() const { return reserved_; }

  // The table as plain data, and the table put back from it: releases what it
  // holds, then acquires exactly those ids (raises if one is taken).
  struct State {
    uint32_t length = 0;
    uint32_t valid_from = 0;
    std::vector<int64_t> blocks;
  };
  State state() const { return {length_, valid_from_, blocks_}; }
  void restore(const State& s);
  // restore() for a state whose blocks already carry an owner for this table
  // (a checkpoint that retained them): lets go of what it holds, takes those.
  void restore_owned(const State& s);

 private:
  void drop_blocks_before(uint32_t first);
  uint32_t freed_by_drop(uint32_t first) const;  // blocks drop_blocks_before(first) would free
  void release_all();
  uint32_t first_needed(uint32_t next) const;  // lowest position the queries from `next` on can see
  uint32_t first_kept(uint32_t next) const;    // first_needed less history: blocks before it leave
  BlockPool& pool_;
  uint32_t window_;
  uint32_t history_;
  uint32_t length_ = 0;
  uint32_t valid_from_ = 0;
  uint32_t reserved_ = 0;
  uint32_t reserve_budget_ = 0;  // what reserve() asked for; a sliding table refills up to it
  std::vector<int64_t> blocks_;
};

}  // namespace mkv::kv
