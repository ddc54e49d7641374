// Engine: runs a Model over KV caches. Prefill feeds prompt tokens in chunks;
// generate then decodes one token per step, sampling on the device. Every
// step is one command buffer and one CPU wait: the host writes the step's
// token ids into the workspace, encodes, commits, waits, and reads back the
// sampled id (or the logits rows asked for).
//
// A call is all or nothing for the cache: if it throws part-way (a device
// error, an exception from a callback), the cache is restored to what it held
// before the call (KVCache::checkpoint). A cancelled call keeps what it
// generated, or nothing when cancelled before its first token.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gpu/device.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "ops/sample.h"

namespace mkv::engine {

struct EngineOptions {
  uint32_t prefill_chunk = 128;  // most tokens one prefill step feeds
  // One KV pool shared by every cache of the engine, of at most kv_memory
  // bytes, sized for sequences of kv_context tokens (kv::KvPool::for_budget);
  // 0: each cache gets its own pool, sized for its capacity.
  size_t kv_memory = 0;
  uint32_t kv_context = 0;
};

struct GenerateOptions {
  int64_t max_tokens = 256;          // >= 0
  ops::SamplingParams sampling;
  uint64_t seed = 0;                 // the uniform draws of sampling
  std::vector<int32_t> stop_ids;     // a sampled id in here ends generation (not emitted)
  std::optional<uint32_t> keep;      // first roll the cache back to this many tokens (a chat turn)
};

// The one check of a generate call's options (sampling included): raises
// ArgumentError naming the argument.
void check_generate_options(const GenerateOptions& o);

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

// Counts of the last call, for benchmarks and the per-token accounting.
struct Stats {
  uint32_t prompt_tokens = 0;
  uint32_t generated_tokens = 0;
  uint32_t prefill_steps = 0;
  uint32_t decode_steps = 0;
  double prefill_seconds = 0;  // prompt in, first token out
  double decode_seconds = 0;   // the decode steps after it
  gpu::Counters prefill_counters;
  gpu::Counters decode_counters;
  // "stop" (a stop id), "length" (max_tokens), "context_full" (a full layer
  // has no slot left), "cancelled" (the poll or the token callback said stop)
  std::string finish_reason;
};

// Called with each generated id, before the next step is encoded; return
// false to stop (stop strings are matched by the caller on the text).
using TokenCallback = std::function<bool(int32_t)>;
// Called before every step (each prefill chunk and each decode step): return
// false to cancel; an exception from it fails the call (the cache is restored).
using StepPoll = std::function<bool()>;

class Engine {
 public:
  Engine(gpu::DevicePtr device, std::shared_ptr<const model::Model> model, EngineOptions options = {});

  const model::Model& model() const { return *model_; }
  const EngineOptions& options() const { return options_; }
  gpu::Device& device() const { return *device_; }

  // A cache for this model holding `capacity` tokens in its full layers: over
  // the engine's shared pool if it has one, else with a pool of its own.
  std::unique_ptr<kv::KVCache> new_cache(uint32_t capacity, kv::StorePath store = kv::StorePath::compute) const;
  const kv::KvPool* kv_pool() const { return kv_pool_.get(); }  // nullptr without kv_memory

  // Feeds ids[0..n) into the cache after what it holds. logits_out: (n, vocab)
  // floats, row i the logits after ids[i]; nullptr to skip them. A cancelled
  // prefill restores the cache and leaves logits_out incomplete.
  void prefill(kv::KVCache& cache, const int32_t* ids, uint32_t n, float* logits_out, const StepPoll& poll = {});

  // Rolls the cache back to options.keep tokens (if set), feeds the prompt
  // (n >= 1 ids), then samples up to max_tokens ids, feeding each back.
  // Repetition penalty looks at every id the cache holds. Returns the
  // generated ids, a stop id excluded. The last generated id is not fed (the
  // next call's prompt starts with whatever follows it).
  std::vector<int32_t> generate(kv::KVCache& cache, const int32_t* prompt, uint32_t n, const GenerateOptions& options,
                                const TokenCallback& on_token = {}, const StepPoll& poll = {});

  const Stats& last_stats() const { return stats_; }

 private:
  uint32_t chunk_for(const kv::KVCache& cache) const;
  void check_room(const kv::KVCache& cache, uint32_t keep, uint32_t n) const;
  // One command buffer: n ids from ids; logits of the last n_logits rows, or
  // (sample != nullptr) a sampled id of the last row into token_. Records the
  // ids in the cache.
  gpu::Counters run_step(kv::KVCache& cache, const int32_t* ids, uint32_t n, uint32_t n_logits,
                         const ops::SamplingParams* sample, float uniform, uint32_t n_penalty);
  // The decode loop after the prompt: returns the generated ids.
  std::vector<int32_t> decode(kv::KVCache& cache, const GenerateOptions& o, const TokenCallback& on_token,
                              const StepPoll& poll, const std::function<float()>& draw, uint32_t n_pen);
  // Writes ids at [at, at + n) of the penalty id buffer, growing it (keeping [0, at)).
  void write_penalty_ids(size_t at, const uint32_t* ids, size_t n);

  gpu::DevicePtr device_;
  gpu::CommandQueuePtr queue_;
  std::shared_ptr<const model::Model> model_;
  EngineOptions options_;
  std::shared_ptr<kv::KvPool> kv_pool_;  // with options.kv_memory
  model::Workspace ws_;
  gpu::BufferPtr token_;        // (1) int32: the sampled id
  gpu::BufferPtr sample_work_;  // (vocab) float scratch of the sampler
  gpu::BufferPtr penalty_ids_;  // (grows) uint32: the ids repetition penalty looks at
  Stats stats_;
};

}  // namespace mkv::engine
