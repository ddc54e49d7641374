// Scheduler's private parts, shared by its two files: scheduler.cpp (steps,
// retiring, the loop) and scheduler_admit.cpp (admission, the caller's
// controls between steps). Not included by anything else.
#pragma once

#include <chrono>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "engine/scheduler.h"

namespace mkv::engine {

using Clock = std::chrono::steady_clock;
inline double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
inline std::string str(uint64_t v) { return std::to_string(v); }

struct Scheduler::Running {
  Job job;
  enum class Phase { queued, prefill, decode, done } phase = Phase::queued;
  Clock::time_point submitted, admitted, first_token;
  uint32_t keep = 0;
  uint64_t n_store = 0;
  uint32_t fed = 0;         // prompt tokens in the cache (a cached prefix included)
  uint32_t prompt_end = 0;  // the cache's length once the prompt is in: position of out[0]
  std::optional<kv::KVCache::Checkpoint> cp;
  std::mt19937_64 rng;
  std::vector<int32_t> out;   // generated ids
  gpu::BufferPtr penalty;     // uint32 ids repetition penalty looks at (when it is on)
  uint32_t n_penalty = 0;
  uint32_t ahead = std::numeric_limits<uint32_t>::max();  // ids it may run ahead of a paced caller
  Stats stats;
  std::vector<float> logits;  // a logits call's rows

  kv::KVCache& cache() { return *job.cache; }
  // Whether a test holds the call before this step (GenerateOptions::hold_at_step).
  bool holding() {
    if (job.options.hold_at_step != stats.prefill_steps + stats.decode_steps + 1 || job.request->resumed())
      return false;
    job.request->set_held();
    return true;
  }
  uint32_t n() const { return uint32_t(job.prompt.size()); }
  float draw() { return float(rng() >> 40) * 0x1.0p-24f; }  // uniform in [0, 1), 24 bits
  bool penalty_on() const { return job.options.sampling.repetition_penalty != 1.0; }
};

}  // namespace mkv::engine
