// Scheduler's private parts, shared by its three files: scheduler_plan.cpp
// (the plan: rows), scheduler_admit.cpp (admission, the caller's controls
// between steps) and scheduler.cpp (run, apply, retiring, the loop). Not
// included by anything else.
#pragma once

#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
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
  // replay: a resumed job (preempted, then admitted again) feeding its generated ids again
  enum class Phase { queued, prefill, replay, decode, done } phase = Phase::queued;
  Clock::time_point submitted, admitted, first_token;
  uint32_t keep = 0;
  uint64_t n_store = 0;
  uint32_t fed = 0;         // prompt tokens in the cache (a cached prefix included)
  uint32_t prompt_end = 0;  // the cache's length once the prompt is in: position of out[0]
  bool optimistic = false;  // admitted on its prompt's blocks (scheduler.h); may be preempted
  uint32_t replayed = 0;    // resumed: of out[0 .. size - 1), the ids fed again so far
  std::optional<kv::KvCache::Checkpoint> cp;
  std::mt19937_64 rng;
  std::vector<int32_t> out;   // generated ids
  gpu::BufferPtr penalty;     // uint32 ids repetition penalty looks at (when it is on)
  uint32_t n_penalty = 0;
  // Presence/frequency penalties (when on): the generated ids' unique (id,
  // count) pairs, (capacity, 2) uint32 on the device for the sampler; the host
  // keeps their counts and each id's pair index, so a repeat rewrites one count.
  gpu::BufferPtr counted;
  std::vector<uint32_t> pairs;  // (n_counted, 2): the host's copy of what `counted` holds
  std::unordered_map<int32_t, uint32_t> counted_at;
  std::vector<float> row;     // one logits row, for logprobs
  uint32_t ahead = std::numeric_limits<uint32_t>::max();  // ids it may run ahead of a paced caller
  Stats stats;
  std::vector<float> logits;  // a logits call's rows
  // Speculative decoding: this step's proposed ids (verified after out.back()),
  // and how many the next step may propose (adapts to what was accepted).
  std::vector<int32_t> drafts;
  uint32_t draft_k = 0;
  DraftCache draft;  // Speculate::draft: the draft model's cache
  // The proposals as uint32 on the device for the penalties of the rows that
  // verify them (presence/frequency: kSampleMaxExtra ids; repetition: written
  // past the n_penalty ids of `penalty`, which the accepted ids then overwrite).
  gpu::BufferPtr proposed;
  // Constrained decoding: the sampler's mask rows (one per row it samples this
  // step, ceil(vocab / 32) uint32 words each) and logit_bias pairs on the device,
  // the mask's host rows, and what went wrong in the constraint (the call ends).
  gpu::BufferPtr mask, bias;
  std::vector<uint32_t> mask_rows;
  std::string constraint_error;

  kv::KvCache& cache() { return *job.cache; }
  // Whether a test holds the call before this step (GenerateOptions::hold_at_step).
  bool holding() {
    if (job.options.hold_at_step != stats.prefill_steps + stats.decode_steps + 1 || job.request->resumed())
      return false;
    job.request->set_held();
    return true;
  }
  uint32_t n() const { return uint32_t(job.prompt.size()); }
  bool resumed() const { return stats.preemptions > 0; }
  // Tokens the next step may store: decode, its id and proposals; replay, a segment.
  uint32_t next_rows() const {
    if (phase == Phase::replay) return std::min<uint32_t>(kReplayRows, uint32_t(out.size()) - 1 - replayed);
    return phase == Phase::decode ? 1 + (speculates() ? job.options.draft_tokens : 0) : 0;
  }
  static constexpr uint32_t kReplayRows = 8;  // most generated ids one replay step feeds again
  Constraint* constraint() const { return job.options.constraint.get(); }
  // The sampler's edits for row `row` of what this job samples in a step.
  ops::LogitEdits edits(uint32_t row, uint32_t words) const {
    ops::LogitEdits e;
    if (mask) e.mask = {mask, size_t(row) * words * sizeof(uint32_t)};
    if (bias) e.bias = {bias, 0};
    e.n_bias = uint32_t(job.options.logit_bias.size());
    return e;
  }
  bool speculates() const { return job.options.speculate != Speculate::none; }
  bool stops_at(int32_t id) const {  // a stop id: it ends the call, not emitted
    const std::vector<int32_t>& s = job.options.stop_ids;
    return std::find(s.begin(), s.end(), id) != s.end();
  }
  float draw() { return float(rng() >> 40) * 0x1.0p-24f; }  // uniform in [0, 1), 24 bits
  bool penalty_on() const { return job.options.sampling.repetition_penalty != 1.0; }
  uint32_t n_counted() const { return uint32_t(pairs.size() / 2); }
  // One more `id` generated, for repetition penalty: appended to the ids it
  // looks at (between steps, like count).
  void penalize(gpu::Device& dev, int32_t id) {
    const uint32_t pen_id = uint32_t(id);
    append_words(dev, penalty, n_penalty, &pen_id, 1);
  }
  // One more `id` generated, for the presence/frequency penalties (between
  // steps: the device is not reading `counted` now).
  void count(gpu::Device& dev, int32_t id) {
    const auto [at, fresh] = counted_at.try_emplace(id, n_counted());
    const size_t k = at->second;
    if (!fresh) {
      ++pairs[2 * k + 1];
      counted->write((2 * k + 1) * sizeof(uint32_t), &pairs[2 * k + 1], sizeof(uint32_t));
      return;
    }
    pairs.insert(pairs.end(), {uint32_t(id), 1u});
    append_words(dev, counted, 2 * k, &pairs[2 * k], 2);
  }
  // A verified row i sees the proposals before it: the device copies the
  // penalties read (row i takes n_penalty + i ids, and i extra counted ids).
  void stage_proposals(gpu::Device& dev, uint32_t m) {
    if (m == 0 || !(penalty_on() || job.options.sampling.counts_on())) return;
    const std::vector<uint32_t> ids(drafts.begin(), drafts.begin() + m);
    if (penalty_on()) append_words(dev, penalty, n_penalty, ids.data(), m);  // n_penalty stays: not context yet
    if (job.options.sampling.counts_on()) proposed->write(0, ids.data(), m * sizeof(uint32_t));
  }
  // Writes n words after the first `used` of buf; a full buffer doubles first (its used words
  // kept), so appends stay O(1) amortized.
  static void append_words(gpu::Device& dev, gpu::BufferPtr& buf, size_t used, const uint32_t* words, size_t n) {
    const size_t bytes = (used + n) * sizeof(uint32_t);
    if (bytes > buf->length()) {
      gpu::BufferPtr grown = dev.new_buffer(std::max(2 * buf->length(), bytes));
      std::vector<uint32_t> kept(used);
      buf->read(0, kept.data(), used * sizeof(uint32_t));
      grown->write(0, kept.data(), used * sizeof(uint32_t));
      buf = grown;
    }
    buf->write(used * sizeof(uint32_t), words, n * sizeof(uint32_t));
  }
};

}  // namespace mkv::engine
