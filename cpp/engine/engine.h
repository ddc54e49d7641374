// Engine: runs a Model over KV caches. Prefill feeds prompt tokens in chunks;
// generate then decodes one token per step, sampling on the device. Every
// step is one command buffer and one CPU wait: the host writes the step's
// token ids into the workspace, encodes, commits, waits, and reads back the
// sampled id (or the logits rows asked for).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
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
};

struct GenerateOptions {
  uint32_t max_tokens = 256;
  ops::SamplingParams sampling;
  uint64_t seed = 0;               // the uniform draws of sampling
  std::vector<int32_t> stop_ids;   // a sampled id in here ends generation (not emitted)
};

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
  std::string finish_reason;   // "stop" (stop id), "length" (max_tokens), "cache_full", "callback"
};

// Called with each generated id, before the next step is encoded; return
// false to stop (stop strings are matched by the caller on the text).
using TokenCallback = std::function<bool(int32_t)>;

class Engine {
 public:
  Engine(gpu::DevicePtr device, std::shared_ptr<const model::Model> model, EngineOptions options = {});

  const model::Model& model() const { return *model_; }
  const EngineOptions& options() const { return options_; }
  gpu::Device& device() const { return *device_; }

  // A cache for this model holding `capacity` tokens in its full layers.
  std::unique_ptr<kv::KVCache> new_cache(uint32_t capacity, kv::StorePath store = kv::StorePath::compute) const;

  // Feeds ids[0..n) into the cache after what it holds. logits_out: (n, vocab)
  // floats, row i the logits after ids[i]; nullptr to skip them.
  void prefill(kv::KVCache& cache, const int32_t* ids, uint32_t n, float* logits_out);

  // Feeds the prompt (n >= 1 ids), then samples up to max_tokens ids, feeding
  // each back. `history` holds the ids the cache already holds (repetition
  // penalty looks at all of them); fed ids are appended to it. Returns the
  // generated ids, a stop id excluded. The last generated id is not fed (the
  // next call's prompt starts with whatever follows it).
  std::vector<int32_t> generate(kv::KVCache& cache, std::vector<int32_t>& history, const int32_t* prompt,
                                uint32_t n, const GenerateOptions& options, const TokenCallback& on_token);

  const Stats& last_stats() const { return stats_; }

 private:
  uint32_t chunk_for(const kv::KVCache& cache) const;
  void check_ids(const int32_t* ids, uint32_t n) const;
  void check_room(const kv::KVCache& cache, uint32_t n) const;
  // One command buffer: n ids from ids; logits of the last n_logits rows, or
  // (sample != nullptr) a sampled id of the last row into token_.
  gpu::Counters run_step(kv::KVCache& cache, const int32_t* ids, uint32_t n, uint32_t n_logits,
                         const ops::SamplingParams* sample, float uniform, uint32_t n_penalty);

  gpu::DevicePtr device_;
  gpu::CommandQueuePtr queue_;
  std::shared_ptr<const model::Model> model_;
  EngineOptions options_;
  model::Workspace ws_;
  gpu::BufferPtr token_;        // (1) int32: the sampled id
  gpu::BufferPtr sample_work_;  // (vocab) float scratch of the sampler
  gpu::BufferPtr penalty_ids_;  // (grows) uint32: the ids repetition penalty looks at
  Stats stats_;
};

}  // namespace mkv::engine
