#include "kv/block_pool.h"

#include <algorithm>
#include <string>

#include "gpu/errors.h"

namespace mkv::kv {
namespace {

[[noreturn]] void fail(const char* who, const std::string& message) {
  throw gpu::GpuError(std::string("[") + who + "] " + message);
}
std::string str(uint64_t v) { return std::to_string(v); }
uint32_t blocks_for(uint64_t tokens) { return uint32_t((tokens + kBlockTokens - 1) / kBlockTokens); }

}  // namespace

// ---- BlockPool ------------------------------------------------------------------
BlockPool::BlockPool(uint32_t n_blocks) : refs_(n_blocks, 0) {
  if (n_blocks == 0) fail("block_pool", "a pool needs at least one block");
  free_.reserve(n_blocks);
  for (uint32_t i = n_blocks; i-- > 0;) free_.push_back(i);  // block 0 on top: handed out first
}

void BlockPool::check_id(const char* what, uint32_t id) const {
  if (id >= capacity()) fail("block_pool", std::string(what) + " block " + str(id) + ": the pool has " + str(capacity()));
  if (refs_[id] == 0) fail("block_pool", std::string(what) + " block " + str(id) + ", which is free");
}

void BlockPool::evict_one() {
  const uint32_t id = lru_.front();
  lru_.pop_front();
  lru_pos_.erase(id);
  by_hash_.erase(key_of_.at(id).hash);
  key_of_.erase(id);
  free_.push_back(id);
}

std::vector<uint32_t> BlockPool::allocate(uint32_t n, uint32_t reserved) {
  if (reserved > reserved_ || reserved > n)
    fail("block_pool", "allocating " + str(n) + " blocks, " + str(reserved) + " of them reserved, but " +
                           str(reserved_) + " are reserved");
  if (n - reserved > available())
    fail("block_pool", "asked for " + str(n) + " blocks, " + str(available()) + " of " + str(capacity()) +
                           " are available (" + str(reserved_) + " reserved; each holds " + str(kBlockTokens) +
                           " tokens of every layer)");
  while (free_.size() < n) evict_one();
  std::vector<uint32_t> ids(free_.end() - n, free_.end());
  std::reverse(ids.begin(), ids.end());  // top of the stack first
  free_.resize(free_.size() - n);
  for (uint32_t id : ids) refs_[id] = 1;
  reserved_ -= reserved;
  return ids;
}

void BlockPool::acquire(const std::vector<uint32_t>& ids) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= capacity()) fail("block_pool", "acquiring block " + str(ids[i]) + ": the pool has " + str(capacity()));
    if (refs_[ids[i]] != 0 || std::find(ids.begin(), ids.begin() + i, ids[i]) != ids.begin() + i)
      fail("block_pool", "acquiring block " + str(ids[i]) + ", which is not free");
  }
  for (uint32_t id : ids) {
    if (lru_pos_.count(id)) {
      retain(id);
      continue;
    }
    refs_[id] = 1;
    free_.erase(std::find(free_.begin(), free_.end(), id));
  }
}

void BlockPool::retain(uint32_t id) {
  if (id < capacity() && refs_[id] == 0 && lru_pos_.count(id)) {  // evictable: back in use
    lru_.erase(lru_pos_.at(id));
    lru_pos_.erase(id);
  } else {
    check_id("retaining", id);
  }
  ++refs_[id];
}

void BlockPool::release(uint32_t id) {
  check_id("releasing", id);
  if (--refs_[id] != 0) return;
  if (key_of_.count(id)) {
    lru_pos_[id] = lru_.insert(lru_.end(), id);
  } else {
    free_.push_back(id);
  }
}

uint32_t BlockPool::owners(uint32_t id) const {
  if (id >= capacity()) fail("block_pool", "block " + str(id) + " is outside the pool of " + str(capacity()));
  return refs_[id];
}

bool BlockPool::try_reserve(uint32_t n) {
  if (n > available()) return false;
  reserved_ += n;
  return true;
}

void BlockPool::unreserve(uint32_t n) {
  if (n > reserved_) fail("block_pool", "unreserving " + str(n) + " blocks, " + str(reserved_) + " are reserved");
  reserved_ -= n;
}

bool BlockPool::register_block(uint32_t id, const BlockKey& key) {
  check_id("caching", id);
  if (key.tokens.size() != kBlockTokens)
    fail("block_pool", "a cached block's key holds " + str(kBlockTokens) + " tokens, got " + str(key.tokens.size()));
  if (key_of_.count(id) || by_hash_.count(key.hash)) return false;
  by_hash_[key.hash] = id;
  key_of_[id] = key;
  return true;
}

int64_t BlockPool::find(const BlockKey& key) const {
  const auto it = by_hash_.find(key.hash);
  if (it == by_hash_.end()) return -1;
  const BlockKey& k = key_of_.at(it->second);
  return k.parent == key.parent && k.tokens == key.tokens ? int64_t(it->second) : -1;
}

bool BlockPool::cached(uint32_t id) const { return key_of_.count(id) != 0; }

// ---- BlockTable -----------------------------------------------------------------
BlockTable::BlockTable(BlockPool& pool, uint32_t window, uint32_t history)
    : pool_(pool), window_(window), history_(window ? history : 0) {}

BlockTable::~BlockTable() {
  release_all();
  unreserve();
}

bool BlockTable::reserve(uint32_t n) {
  if (!pool_.try_reserve(n)) return false;
  reserved_ += n;
  reserve_budget_ = reserved_;
  return true;
}

void BlockTable::unreserve() {
  pool_.unreserve(reserved_);
  reserved_ = 0;
  reserve_budget_ = 0;
}

void BlockTable::release_all() {
  for (size_t i = blocks_.size(); i-- > 0;)  // the last first: see truncate
    if (blocks_[i] >= 0) pool_.release(uint32_t(blocks_[i]));
  blocks_.clear();
  length_ = 0;
  valid_from_ = 0;
}

void BlockTable::restore(const State& s) {
  std::vector<uint32_t> ids;
  for (int64_t b : s.blocks)
    if (b >= 0) ids.push_back(uint32_t(b));
  release_all();
  pool_.acquire(ids);
  blocks_ = s.blocks;
  length_ = s.length;
  valid_from_ = s.valid_from;
}

void BlockTable::restore_owned(const State& s) {
  release_all();
  blocks_ = s.blocks;
  length_ = s.length;
  valid_from_ = s.valid_from;
}

bool BlockTable::holds(uint32_t pos) const {
  return pos < length_ && pos >= valid_from_ && blocks_[pos / kBlockTokens] >= 0;
}

uint32_t BlockTable::held_blocks() const {
  return uint32_t(std::count_if(blocks_.begin(), blocks_.end(), [](int64_t b) { return b >= 0; }));
}

uint32_t BlockTable::slot(uint32_t pos) const {
  if (pos >= length_) fail("block_table", "position " + str(pos) + " is not stored (length " + str(length_) + ")");
  const int64_t b = blocks_[pos / kBlockTokens];
  if (b < 0)
    fail("block_table", "position " + str(pos) + " left the sliding window of " + str(window_) + " (length " +
                            str(length_) + "); its block went back to the pool");
  return uint32_t(b) * kBlockTokens + pos % kBlockTokens;
}

uint32_t BlockTable::first_needed(uint32_t next) const {
  return window_ == 0 || next < window_ ? 0 : next - window_ + 1;
}

uint32_t BlockTable::first_kept(uint32_t next) const {
  const uint32_t first = first_needed(next);
  return first > history_ ? first - history_ : 0;
}

void BlockTable::drop_blocks_before(uint32_t first) {
  for (uint32_t i = 0; i < blocks_.size() && uint64_t(i + 1) * kBlockTokens <= first; ++i)
    if (blocks_[i] >= 0) {
      const uint32_t id = uint32_t(blocks_[i]);
      pool_.release(id);
      blocks_[i] = -1;
      // A sliding table that reserved keeps its reservation as its window moves:
      // what it sets free it may take again, whatever others allocate meanwhile.
      if (pool_.owners(id) == 0 && reserved_ < reserve_budget_ && pool_.try_reserve(1)) ++reserved_;
    }
}

// What the tail block needs before a store writes into it (length() inside it):
// a fresh block where a window of 1 let it go, a copy where another table (or
// a checkpoint) shares it or the prefix cache holds its rows.
enum class Tail { ready, missing, shared };
static Tail tail_state(const BlockPool& pool, const std::vector<int64_t>& blocks, uint32_t length) {
  if (length % kBlockTokens == 0) return Tail::ready;
  const int64_t b = blocks[length / kBlockTokens];
  if (b < 0) return Tail::missing;
  return pool.owners(uint32_t(b)) > 1 || pool.cached(uint32_t(b)) ? Tail::shared : Tail::ready;
}

uint32_t BlockTable::freed_by_drop(uint32_t first) const {
  uint32_t freed = 0;
  for (uint32_t i = 0; i < blocks_.size() && uint64_t(i + 1) * kBlockTokens <= first; ++i)
    freed += blocks_[i] >= 0 && pool_.owners(uint32_t(blocks_[i])) == 1;
  return freed;
}

bool BlockTable::can_append(uint32_t n) const {
  return blocks_needed(n) <= pool_.available() + reserved_ + freed_by_drop(first_kept(length_));
}

uint32_t BlockTable::blocks_needed(uint32_t n) const {
  if (n == 0) return 0;
  const uint32_t fresh = std::max<int64_t>(0, int64_t(blocks_for(uint64_t(length_) + n)) - int64_t(blocks_.size()));
  return fresh + (tail_state(pool_, blocks_, length_) != Tail::ready ? 1 : 0);
}

std::vector<BlockCopy> BlockTable::append(uint32_t n) {
  if (uint64_t(length_) + n >= (uint64_t(1) << 32)) fail("block_table", "positions past 2^32 - 1");
  if (n == 0) return {};
  // A sliding table first lets go of what even the chunk's first query cannot see,
  // once it is sure the pool (with what that frees) has the blocks: all or nothing.
  const uint32_t need = blocks_needed(n), first = first_kept(length_);
  if (!can_append(n)) pool_.allocate(need);  // raises with the pool's message
  drop_blocks_before(first);
  const uint32_t from_reserved = std::min(need, reserved_);
  std::vector<uint32_t> ids = pool_.allocate(need, from_reserved);
  reserved_ -= from_reserved;
  std::vector<BlockCopy> copies;
  size_t next = 0;
  const Tail tail_needs = tail_state(pool_, blocks_, length_);
  if (tail_needs != Tail::ready) {
    int64_t& tail = blocks_[length_ / kBlockTokens];
    if (tail_needs == Tail::shared) {
      copies.push_back({uint32_t(tail), ids[next]});
      pool_.release(uint32_t(tail));  // the other owners keep it
    } else {
      valid_from_ = length_;  // a fresh block: the rows before length_ in it were never stored
    }
    tail = ids[next++];
  }
  while (next < ids.size()) blocks_.push_back(ids[next++]);
  length_ += n;
  return copies;
}

void BlockTable::check_truncate(uint32_t n) const {
  if (n > length_) fail("block_table", "cannot truncate to " + str(n) + " tokens: the table holds " + str(length_));
  const uint32_t first = first_needed(n);
  if (first < n && blocks_[first / kBlockTokens] < 0)  // (W = 1 needs no stored position)
    fail("block_table", "cannot truncate a sliding table (window " + str(window_) + ") from " + str(length_) +
                            " to " + str(n) + " tokens: position " + str(first) + ", which the window at " + str(n) +
                            " needs, has left the pool (it keeps " + str(history_) +
                            " positions more than the window)");
}

void BlockTable::truncate(uint32_t n) {
  check_truncate(n);
  const uint32_t keep = blocks_for(n);
  for (size_t i = blocks_.size(); i-- > keep;)  // the last first: the free stack hands them back in order
    if (blocks_[i] >= 0) pool_.release(uint32_t(blocks_[i]));
  blocks_.resize(keep);
  length_ = n;
  valid_from_ = std::min(valid_from_, n);
}

uint32_t BlockTable::shared_among(const std::vector<uint32_t>& logical) const {
  uint32_t n = 0;
  for (uint32_t i : logical) {
    const int64_t b = i < blocks_.size() ? blocks_[i] : -1;
    if (b < 0) fail("block_table", "logical block " + str(i) + " is not held");
    n += pool_.owners(uint32_t(b)) > 1 || pool_.cached(uint32_t(b));
  }
  return n;
}

std::vector<BlockCopy> BlockTable::make_writable(const std::vector<uint32_t>& logical) {
  const uint32_t need = shared_among(logical);
  if (need == 0) return {};
  const uint32_t from_reserved = std::min(need, reserved_);
  std::vector<uint32_t> ids = pool_.allocate(need, from_reserved);  // raises with the pool's message
  reserved_ -= from_reserved;
  std::vector<BlockCopy> copies;
  for (uint32_t i : logical) {
    int64_t& b = blocks_[i];
    if (pool_.owners(uint32_t(b)) <= 1 && !pool_.cached(uint32_t(b))) continue;
    copies.push_back({uint32_t(b), ids[copies.size()]});
    pool_.release(uint32_t(b));  // the other owners keep it
    b = copies.back().dst;
  }
  return copies;
}

void BlockTable::shrink(uint32_t n) {
  const uint32_t keep = blocks_for(n);
  for (size_t i = blocks_.size(); i-- > keep;)
    if (blocks_[i] >= 0) {
      const uint32_t id = uint32_t(blocks_[i]);
      pool_.release(id);
      if (pool_.owners(id) == 0 && reserved_ < reserve_budget_ && pool_.try_reserve(1)) ++reserved_;
    }
  blocks_.resize(std::min<size_t>(blocks_.size(), keep));
  length_ = std::min(length_, n);
  valid_from_ = std::min(valid_from_, n);
}

void BlockTable::skip_to(uint32_t n) {
  if (length_ != 0 || !blocks_.empty()) fail("block_table", "skip_to needs an empty table");
  if (n != 0 && window_ == 0) fail("block_table", "a full table cannot start at position " + str(n));
  blocks_.assign(blocks_for(n), -1);
  length_ = n;
  valid_from_ = n;
}

void BlockTable::share_prefix(const BlockTable& other, uint32_t n) {
  if (&other.pool_ != &pool_ || other.window_ != window_ || other.history_ != history_)
    fail("block_table", "sharing a prefix needs tables of one pool and one window");
  if (length_ != 0 || !blocks_.empty()) fail("block_table", "share_prefix needs an empty table");
  if (n > other.length_)
    fail("block_table", "cannot share " + str(n) + " tokens of a table holding " + str(other.length_));
  const uint32_t first = first_needed(n);
  if (first < n && other.blocks_[first / kBlockTokens] < 0)
    fail("block_table", "cannot share " + str(n) + " tokens: position " + str(first) + " has left the window");
  blocks_.assign(blocks_for(n), -1);
  for (uint32_t i = std::min(first, n) / kBlockTokens; i < blocks_.size(); ++i) {
    if (other.blocks_[i] < 0) continue;  // a window of 1 needs none of the stored positions
    blocks_[i] = other.blocks_[i];
    pool_.retain(uint32_t(blocks_[i]));
  }
  length_ = n;
  valid_from_ = std::min(other.valid_from_, n);
}

void BlockTable::adopt(const std::vector<int64_t>& ids, uint32_t n) {
  if (length_ != 0 || !blocks_.empty()) fail("block_table", "adopt needs an empty table");
  if (ids.size() != blocks_for(n))
    fail("block_table", "adopting " + str(n) + " positions needs " + str(blocks_for(n)) + " block entries, got " +
                            str(ids.size()));
  const uint32_t first = first_needed(n);
  for (uint32_t i = std::min(first, n) / kBlockTokens; i < ids.size(); ++i)
    if (ids[i] < 0) fail("block_table", "adopting " + str(n) + " positions: block " + str(i) + " is missing");
  for (int64_t b : ids)
    if (b >= 0) pool_.retain(uint32_t(b));
  blocks_ = ids;
  length_ = n;
  valid_from_ = 0;
}

}  // namespace mkv::kv
