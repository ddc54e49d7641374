// Engine: runs a Model over KV caches. Every call (generate or logits, from
// any thread) is a Request the engine's Scheduler runs in batched steps:
// prompts are fed in chunks, then one token per step is sampled on the
// device, for every running sequence at once (one command buffer and one CPU
// wait per step, whatever the batch). A sequence gets the same ids alone and
// in a batch (docs/BATCHING.md).
//
// A call is all or nothing for the cache: if it fails part-way (a device
// error, an abort from its caller), the cache is restored to what it held
// before the call (KvCache::checkpoint). A cancelled call keeps what it
// generated, or nothing when cancelled before its first token.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/request.h"
#include "engine/scheduler.h"
#include "gpu/device.h"
#include "kv/kv_cache.h"
#include "kv/kv_options.h"
#include "model/model.h"
#include "ops/sample.h"

namespace mkv::engine {

struct EngineOptions {
  uint32_t prefill_chunk = 128;  // most prompt tokens of one sequence in one step
  uint32_t kv_context = 0;       // tokens a cache holds by default (the shared pool is sized for such sequences)
  uint32_t max_seqs = 64;        // sequences running at once (1..kMaxSeqs); more wait in a queue
  uint32_t step_tokens = 0;      // rows one step may feed; 0: prefill_chunk + max_seqs
  // The caches' KV options (kv::KvOptions: formats, residual window, eviction
  // policy, and `memory`: one KV pool shared by every cache of the engine, of
  // at most that many bytes, sized for sequences of kv_context tokens
  // (kv::KvPool::for_budget); 0: each cache gets its own pool, sized for its
  // capacity; kv::kKvMemoryAuto: auto_kv_memory()). With a policy a cache keeps
  // its budget in its full layers, whatever capacity it asks for.
  kv::KvOptions kv;
  // true: a sequence's logits are bit-identical alone and in a batch
  // (docs/BATCHING.md). false: a step with at least the device's
  // gemm_decode_rows decoding sequences runs their projections as a gemm
  // (Model::encode_step), faster with many sequences, equal only to rounding.
  bool batch_invariant = true;
  // Optimistic admission with preemption (SchedulerOptions::optimistic, scheduler.h);
  // false: every call reserves every block it may take, and waits for them.
  bool preempt = true;
};

inline constexpr uint32_t kMaxSeqs = 4096;
inline constexpr uint32_t kMaxDraftTokens = 16;  // GenerateOptions::draft_tokens' most
void check_max_seqs(int64_t n);  // 1..kMaxSeqs; ArgumentError("max_seqs") (int64: a binding checks before narrowing)
// The default KV budget: a quarter of the device's memory (DeviceProperties::
// memory_bytes: on a Mac the GPU's recommended working set, shared with
// everything else the user runs), at most what kAutoKvSequences sequences of
// kv_context tokens need: a pool that batches and caches prefixes without
// taking a machine's memory for a small model.
inline constexpr uint32_t kAutoKvSequences = 16;
size_t auto_kv_memory(gpu::Device& device, const model::Model& model, uint32_t kv_context, uint32_t max_chunk,
                      const std::vector<uint32_t>& kv_k = {}, const std::vector<uint32_t>& kv_v = {});

// The one check of a generate call's options (sampling included): raises
// ArgumentError naming the argument.
void check_generate_options(const GenerateOptions& o);
// GenerateOptions::logprobs's range, -1..20 (taken as int64, so a binding checks
// a Python int before narrowing it).
void check_logprobs(int64_t n);
// logit_bias: at most kSampleMaxBias ids of the vocabulary, biases in [-100, 100].
void check_logit_bias(const std::vector<std::pair<int32_t, float>>& bias, uint32_t vocab);

// Every id must be a row of the vocabulary; raises ArgumentError("token_ids").
template <class Int>
void check_token_ids(const Int* ids, size_t n, uint32_t vocab) {
  if (n == 0) throw gpu::ArgumentError("engine", "token_ids", "no token ids");
  for (size_t i = 0; i < n; ++i)
    if (ids[i] < 0 || uint64_t(ids[i]) >= vocab)
      throw gpu::ArgumentError("engine", "token_ids",
                               "token id " + std::to_string(ids[i]) + " at index " + std::to_string(i) +
                                   " is out of range; the vocabulary has " + std::to_string(vocab) +
                                   " ids (0.." + std::to_string(vocab - 1) + ")");
}

class Engine {
 public:
  // draft: a smaller model with the same vocabulary for speculative decoding
  // (Speculate::draft); nullptr: none.
  Engine(gpu::DevicePtr device, std::shared_ptr<const model::Model> model, EngineOptions options = {},
         std::shared_ptr<const model::Model> draft = nullptr);

  const model::Model& model() const { return *model_; }
  const EngineOptions& options() const { return options_; }
  gpu::Device& device() const { return *device_; }

  // A cache for this model holding `capacity` tokens in its full layers: over
  // the engine's shared pool if it has one, else with a pool of its own.
  // own: KV options of its own, over the engine's (kv::KvOptions::over; an
  // eviction option given makes the budget's fraction one of `capacity`); a
  // shared pool holds only its own formats (ArgumentError).
  std::unique_ptr<kv::KvCache> new_cache(uint32_t capacity, kv::StorePath store = kv::StorePath::compute,
                                         const kv::KvOptions* own = nullptr) const;
  // The engine's KV options resolved for its model and kv_context (what new caches get).
  const kv::KvResolved& kv() const { return kv_; }
  const kv::KvPool* kv_pool() const { return kv_pool_.get(); }  // nullptr without kv_memory
  kv::KvPool* kv_pool_mut() { return kv_pool_.get(); }           // (the prefix store's imports)

  // Checks a generate call (options, ids, room in the cache) and queues it;
  // returns at once. It rolls the cache back to options.keep tokens (if set),
  // feeds the prompt (n >= 1 ids), then samples up to max_tokens ids, each fed
  // back but the last (the next call's prompt starts with whatever follows
  // it). Repetition penalty looks at every id the cache holds. Ids come
  // through the request, a stop id excluded. Raises ArgumentError naming the
  // first bad argument. channel: what the caller waits on (a new one if null).
  std::shared_ptr<Request> submit(kv::KvCache& cache, std::vector<int32_t> prompt, const GenerateOptions& options,
                                  std::shared_ptr<Channel> channel = nullptr);
  // Feeds ids after what the cache holds; the request's logits are then
  // (n, vocab) floats, row i the logits after ids[i].
  // Of options, only hold_at_step and ephemeral apply.
  std::shared_ptr<Request> submit_logits(kv::KvCache& cache, std::vector<int32_t> ids, const GenerateOptions& options,
                                         std::shared_ptr<Channel> channel = nullptr);

  const Scheduler& scheduler() const { return *scheduler_; }
  // Ends the scheduler thread now rather than at destruction (Scheduler::stop):
  // Python's exit does it while daemon threads still hold the engine (bindings).
  void stop() { scheduler_->stop(); }

 private:
  // The prompt's ids and its media (engine/media.h; null: none), for this cache.
  void check_media(const kv::KvCache& cache, const std::vector<int32_t>& prompt, const Media* media) const;
  void check_room(const kv::KvCache& cache, uint32_t keep, uint32_t n) const;
  std::shared_ptr<Request> queue(Job job, std::shared_ptr<Channel> channel);

  gpu::DevicePtr device_;
  std::shared_ptr<const model::Model> model_;
  EngineOptions options_;
  kv::KvResolved kv_;
  std::shared_ptr<kv::KvPool> kv_pool_;  // with options.kv.memory
  std::unique_ptr<Scheduler> scheduler_;
};

}  // namespace mkv::engine
