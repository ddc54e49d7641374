// Blocks of the paged KV cache (issue 13; ../shared/DESIGN.md, "The KV cache,
// next: blocks"): the host-side bookkeeping, no device memory.
//
// A layer's pool is its region (2, n_blocks * kBlockTokens, n_kv_heads,
// head_dim) half — today's layout, so a slot is still a row index — cut into
// blocks of kBlockTokens consecutive slots. BlockPool hands out block ids with
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
#include <vector>

#include "metal/kv_params.h"

namespace mkv::kv {

constexpr uint32_t kBlockTokens = mkv_params::kKvBlockTokens;  // one definition, kernels and C++

class BlockPool {
 public:
  explicit BlockPool(uint32_t n_blocks);  // raises GpuError "[block_pool] ..." for 0

  uint32_t capacity() const { return uint32_t(refs_.size()); }
  uint32_t free_count() const { return uint32_t(free_.size()); }
  uint32_t used_count() const { return capacity() - free_count(); }

  // n free blocks, each with one owner; all or nothing: raises (taking none)
  // when fewer than n are free. The most recently freed come first.
  std::vector<uint32_t> allocate(uint32_t n);
  // Takes these free ids, one owner each (a table put back as it was); all or
  // nothing: raises when one is not free.
  void acquire(const std::vector<uint32_t>& ids);
  void retain(uint32_t id);   // one more owner (a shared prefix)
  void release(uint32_t id);  // one owner fewer; free again at none
  uint32_t owners(uint32_t id) const;

 private:
  void check_id(const char* what, uint32_t id) const;
  std::vector<uint32_t> refs_;  // owners per block id
  std::vector<uint32_t> free_;  // a stack of free ids
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
  // what a sliding window lets go, and counting a tail block to copy or replace).
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
  // An empty sliding table starts at position n: positions before n are
  // outside every window it will serve (a saved cache read back). Raises for
  // a full table or one that holds anything.
  void skip_to(uint32_t n);
  // Becomes a table over the first n positions of `other` without copying:
  // shares its blocks (the last one copy-on-write if partly filled).
  void share_prefix(const BlockTable& other, uint32_t n);

  // The table as plain data, and the table put back from it: releases what it
  // holds, then acquires exactly those ids (raises if one is taken).
  struct State {
    uint32_t length = 0;
    uint32_t valid_from = 0;
    std::vector<int64_t> blocks;
  };
  State state() const { return {length_, valid_from_, blocks_}; }
  void restore(const State& s);

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
  std::vector<int64_t> blocks_;
};

}  // namespace mkv::kv
