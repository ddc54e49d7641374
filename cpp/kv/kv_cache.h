// KVCache: preallocated per-layer K/V regions on the device, per-layer
// lengths, and the two store paths.
//
// Each layer owns one device buffer holding its region (2, R, n_kv_heads,
// head_dim) half (layout: kv/kv_layout.h). Full layers hold capacity tokens
// and raise on overflow (eviction comes later); sliding layers are rings of
// window + max_chunk - 1 slots. Every buffer is allocated at construction;
// only the blit path's staging buffer may grow (see store()).
//
// store() encodes one layer's new K/V rows through an EncoderSession:
//   StorePath::compute  kv_store kernel into the open compute encoder; adds no encoder.
//   StorePath::blit     the same kernel into a staging buffer, then one blit encoder
//                       copies the rows (a wrapped range: 2 copies each for K and V);
//                       the session's next compute() opens a new compute encoder.
// Both paths produce bit-identical caches.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpu/device.h"
#include "kv/encoder_session.h"
#include "kv/kv_layout.h"
#include "ops/ops.h"
#include "ops/kv_store.h"
#include "ops/rope.h"

namespace mkv::kv {

using ops::BufferView;
using ops::RopeSpec;

enum class StorePath { compute, blit };
StorePath parse_store_path(const std::string& name);  // "compute" | "blit"
const char* store_path_name(StorePath path);

// One turn of the conversation whose rendering a cache holds (set by the
// Python Engine after a chat turn; the cache only keeps it consistent).
struct ChatMessage {
  std::string role;
  std::string content;
};

struct KVCacheSpec {
  uint32_t n_layers = 0;
  uint32_t n_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t capacity = 0;          // tokens a full layer holds
  std::vector<uint32_t> windows;  // per layer: 0 = full, W = sliding window; empty = all full
  uint32_t max_chunk = 1;         // most tokens one store() may put in a sliding layer
  StorePath store = StorePath::compute;
};

class KVCache {
 public:
  KVCache(gpu::DevicePtr device, KVCacheSpec spec);  // raises GpuError "[kv_cache] ..."

  const KVCacheSpec& spec() const { return spec_; }
  uint32_t n_layers() const { return spec_.n_layers; }

  // Layer l's region (2, slots, n_kv_heads, head_dim) half: K block, then V block.
  BufferView region(uint32_t layer) const;
  LayerLayout layout(uint32_t layer) const;
  uint32_t slots(uint32_t layer) const;   // R
  uint32_t length(uint32_t layer) const;  // n: tokens ever stored = position of the next token
  uint32_t window(uint32_t layer) const;  // 0 = full
  bool wraps(uint32_t layer) const;       // a ring (sliding, R < context) rather than linear
  int64_t position(uint32_t layer, uint32_t slot) const;  // -1: empty

  // Appends n_new tokens to `layer` at positions n .. n+n_new-1 and advances n
  // (at encode time: the rows are there once the command buffer completes).
  // k_new, v_new: (n_new, n_kv_heads, head_dim) float. rope_k: rotate K at
  // those positions (nullptr: store K as is); queries (with rope_k): the
  // step's Q rows, rotated in place by the same dispatch. Raises GpuError before encoding
  // anything when the layer is out of range, a full layer would overflow, or a
  // sliding layer gets more than max_chunk tokens.
  void store(EncoderSession& enc, uint32_t layer, const BufferView& k_new, const BufferView& v_new,
             uint32_t n_new, const RopeSpec* rope_k = nullptr, const ops::QueryRope& queries = {});
  // The checks store() makes, without encoding: call it for every layer before
  // a multi-layer step to fail before any layer's n has moved.
  void check_store(uint32_t layer, uint32_t n_new, const RopeSpec* rope_k = nullptr) const;

  // Forgets every token from position n on, in every layer, so the next
  // store continues at n (a conversation rolled back to a common prefix). A
  // ring layer keeps only its last R slots, so it can drop at most
  // R - W + 1 = max_chunk tokens and still hold the window position n needs.
  // Raises GpuError before changing anything when a layer cannot.
  void truncate(uint32_t n);

  void reset();  // every layer back to n = 0, no tokens, no messages

  // The token ids an engine fed, in order (what repetition penalty and chat
  // continuation look at). Stores through store() alone (tests, tools) record
  // none; truncate() and reset() keep them in step with the layers.
  const std::vector<int32_t>& tokens() const { return tokens_; }
  void record_tokens(const int32_t* ids, uint32_t n) { tokens_.insert(tokens_.end(), ids, ids + n); }

  // The chat whose rendering the tokens are. A truncate() that drops tokens
  // clears it: the tokens no longer render those messages.
  const std::vector<ChatMessage>& messages() const { return messages_; }
  void set_messages(std::vector<ChatMessage> messages) { messages_ = std::move(messages); }

  // Everything a call may change, so that a call that fails part-way can put
  // the cache back exactly (kv_checkpoint.cpp). Slots are copied only where the
  // call may overwrite a held position: a full layer's truncated rows, a ring
  // layer when the call truncates or stores more than max_chunk tokens.
  struct SavedRows {
    uint32_t first = 0, count = 0;  // slots [first, first + count) of K and of V
    gpu::BufferPtr copy;            // (2, count, n_kv_heads, head_dim) half
  };
  struct Checkpoint {
    std::vector<uint32_t> lengths;
    std::vector<int32_t> tokens;
    std::vector<ChatMessage> messages;
    std::vector<SavedRows> rows;  // per layer (count 0: nothing saved)
  };
  // keep: tokens the call keeps (truncates to) before it stores n_store more.
  Checkpoint checkpoint(gpu::CommandQueue& queue, uint32_t keep, uint64_t n_store) const;
  void restore(gpu::CommandQueue& queue, const Checkpoint& cp);

  // Byte accounting, exact.
  size_t layer_nbytes(uint32_t layer) const;  // 2 * R * n_kv_heads * head_dim * 2
  size_t staging_nbytes() const;              // blit path staging (0 for compute)
  size_t nbytes() const;                      // all resident: layers + staging
  size_t bytes_per_token() const;             // one more context token: K+V row in each non-wrapping layer

 private:
  void check_layer(uint32_t layer) const;
  BufferView staging_for(uint32_t n_new);

  gpu::DevicePtr device_;
  KVCacheSpec spec_;
  std::vector<gpu::BufferPtr> buffers_;  // one per layer
  std::vector<uint32_t> slots_;
  std::vector<uint32_t> lengths_;
  gpu::BufferPtr staging_;  // (2, staging_rows_, n_kv_heads, head_dim) half; blit path only
  uint32_t staging_rows_ = 0;
  std::vector<int32_t> tokens_;        // ids fed by an engine
  std::vector<ChatMessage> messages_;  // the chat they render, if any
};

}  // namespace mkv::kv
