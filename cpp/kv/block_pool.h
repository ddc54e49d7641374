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

namespace mkv::kv {

constexpr uint32_t kBlockTokens = 32;

class BlockPool {
 public:
  explicit BlockPool(uint32_t n_blocks);  // raises GpuError "[block_pool] ..." for 0

  uint32_t capacity() const { return uint32_t(refs_.size()); }
  uint32_t free_count() const { return uint32_t(free_.size()); }
  uint32_t used_count() const { return capacity() - free_count(); }

  // n free blocks, each with one owner; all or nothing: raises (taking none)
  // when fewer than n are free. The most recently freed come first.
  std::vector<uint32_t> allocate(uint32_t n);
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
// of the next token's queries go back to the pool as positions advance.
class BlockTable {
 public:
  BlockTable(BlockPool& pool, uint32_t window = 0);
  ~BlockTable();  // releases every block it holds
  BlockTable(const BlockTable&) = delete;
  BlockTable& operator=(const BlockTable&) = delete;

  uint32_t length() const { return length_; }  // tokens stored = position of the next
  uint32_t window() const { return window_; }
  // Physical block per logical block i (positions [iB, (i+1)B)); -1 where a
  // sliding table has let the block go.
  const std::vector<int64_t>& blocks() const { return blocks_; }
  uint32_t held_blocks() const;
  uint32_t slot(uint32_t pos) const;  // raises for a position not held

  // Blocks a store of n more tokens would take from the pool (after freeing
  // what a sliding window lets go, and counting a tail block to copy or replace).
  uint32_t blocks_needed(uint32_t n) const;
  // Makes room for positions length() .. length() + n - 1 and advances
  // length(); all or nothing (raises when the pool is short). Returns the
  // copies the caller must encode before the store (a shared tail block).
  std::vector<BlockCopy> append(uint32_t n);
  // Forgets positions n.. (the blocks past them go back). A sliding table
  // raises when the window at n needs positions it has already let go.
  void truncate(uint32_t n);
  // Becomes a table over the first n positions of `other` without copying:
  // shares its blocks (the last one copy-on-write if partly filled).
  void share_prefix(const BlockTable& other, uint32_t n);

 private:
  void drop_blocks_before(uint32_t first_needed);
  uint32_t first_needed(uint32_t next) const;  // lowest position the queries from `next` on can see
  BlockPool& pool_;
  uint32_t window_;
  uint32_t length_ = 0;
  std::vector<int64_t> blocks_;
};

}  // namespace mkv::kv
