// SequenceRecord: what a KvCache knows of its sequence besides the rows — the
// token ids an engine fed, the chat they render, the model they belong to, and
// how far they are canonical and published to the prefix cache — with its
// share of truncate, reset, a checkpoint and a saved cache.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "metal/kv_params.h"

namespace mkv::kv {

// One turn of the conversation whose rendering a cache holds (set by the
// Python Engine after a chat turn; the cache only keeps it consistent).
struct ChatMessage {
  std::string role;
  std::string content;
};

class SequenceRecord {
 public:
  // The token ids an engine fed, in order (what repetition penalty and chat
  // continuation look at). Stores alone (tests, tools) record none.
  const std::vector<int32_t>& tokens() const { return tokens_; }
  void record(const int32_t* ids, uint32_t n) { tokens_.insert(tokens_.end(), ids, ids + n); }

  // The chat whose rendering the tokens are; a truncate that drops tokens
  // clears it (they no longer render those messages).
  const std::vector<ChatMessage>& messages() const { return messages_; }
  void set_messages(std::vector<ChatMessage> m) { messages_ = std::move(m); }

  // The model the rows belong to (set by the engine that made the cache; ""
  // for one made by hand), written into saved caches.
  const std::string& fingerprint() const { return fingerprint_; }
  void set_fingerprint(std::string f) { fingerprint_ = std::move(f); }

  // The prefix cache (kv/prefix_cache.h). Positions [0, canonical()) were
  // stored by steps of two or more tokens (or adopted from the prefix cache):
  // their rows are what a prefill of those tokens gives, whatever its chunks
  // (decode steps compute rows with other kernels, bits apart). Full blocks of
  // them are published under the chain hash of their tokens (block_hashes).
  uint32_t canonical() const { return canonical_; }
  const std::vector<uint64_t>& block_hashes() const { return block_hashes_; }
  void stored(uint32_t first, uint32_t n) {  // n >= 2 extends the canonical prefix
    if (n >= 2 && first == canonical_) canonical_ = first + n;
  }
  void add_block_hash(uint64_t h) { block_hashes_.push_back(h); }

  void truncate(uint32_t n) {
    canonical_ = std::min(canonical_, n);
    if (block_hashes_.size() > n / mkv_params::kKvBlockTokens) block_hashes_.resize(n / mkv_params::kKvBlockTokens);
    if (tokens_.size() > n) {
      tokens_.resize(n);
      messages_.clear();
    }
  }
  void reset() {  // (the fingerprint stays: the rows still belong to that model)
    tokens_.clear();
    messages_.clear();
    canonical_ = 0;
    block_hashes_.clear();
  }
  // A prefix of n tokens `ids` adopted from the prefix cache, its blocks published as `hashes`.
  void adopt(const int32_t* ids, uint32_t n, std::vector<uint64_t> hashes) {
    tokens_.assign(ids, ids + n);
    messages_.clear();
    canonical_ = n;
    block_hashes_ = std::move(hashes);
  }

  // Its share of a checkpoint: all of it but the fingerprint, which no call changes.
  struct Saved {
    std::vector<int32_t> tokens;
    std::vector<ChatMessage> messages;
    uint32_t canonical = 0;
    std::vector<uint64_t> block_hashes;
  };
  Saved save() const { return {tokens_, messages_, canonical_, block_hashes_}; }
  void restore(Saved s) {
    tokens_ = std::move(s.tokens);
    messages_ = std::move(s.messages);
    canonical_ = s.canonical;
    block_hashes_ = std::move(s.block_hashes);
  }

 private:
  std::vector<int32_t> tokens_;
  std::vector<ChatMessage> messages_;
  std::string fingerprint_;
  uint32_t canonical_ = 0;
  std::vector<uint64_t> block_hashes_;
};

}  // namespace mkv::kv
