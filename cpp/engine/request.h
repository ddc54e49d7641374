// Request: one generate (or logits) call in flight, shared by the thread that
// submitted it and the engine's scheduler thread.
//
// The scheduler appends each sampled id and, at the end, the stats and the
// finish reason (or the error), and wakes the request's Channel. The caller
// reads new ids as they come (take), and may steer the call between steps:
//   stop_after(k)  keep ids 0..k and stop, the cache exactly as if id k had
//                  been the last one sampled (ids fed after it are rolled
//                  back): what a stop string found in id k's text needs;
//   cancel()       stop before the next step, keeping what was generated
//                  (nothing yet: the cache as before the call);
//   abort()        stop and put the cache back as before the call.
// A caller that reads ids as they come (paced) keeps the scheduler at most a
// few ids ahead of it, so stop_after can always roll back (sliding layers keep
// only max_chunk positions of history).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/constraint.h"
#include "gpu/device.h"
#include "ops/sample.h"

namespace mkv::engine {

struct Media;  // engine/media.h

// Wakes whoever waits on a group of requests (one generate call of a list).
class Channel {
 public:
  void notify();
  // Waits until notify() was called since the last wait, or `seconds` pass.
  // Returns whether it was notified.
  bool wait(double seconds);

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool signalled_ = false;
};

// Speculative decoding (docs/SPECULATIVE.md): none; prompt lookup, whose
// proposals are the ids that followed an earlier occurrence of the latest ids;
// or the engine's draft model's greedy ids.
enum class Speculate { none, lookup, draft };

struct GenerateOptions {
  int64_t max_tokens = 256;          // >= 0
  ops::SamplingParams sampling;
  uint64_t seed = 0;                 // the uniform draws of sampling
  std::vector<int32_t> stop_ids;     // a sampled id in here ends generation (not emitted)
  std::optional<uint32_t> keep;      // first roll the cache back to this many tokens (a chat turn)
  bool paced = false;                // the caller reads ids as they come (see Request)
  bool prefix_cache = true;          // a new sequence may start from cached prefix blocks
  bool keep_logits = false;          // the request keeps each sampled row's logits (logits())
  // -1: off; 0..20: each emitted id's log-probability under the raw logits it
  // was sampled from (before penalties and temperature), and the top `logprobs`
  // ids with theirs (Request::logprobs).
  int32_t logprobs = -1;
  // lookup: each decode step also verifies up to draft_tokens proposed ids in
  // the same step. Greedy: ids and logits are those of decoding without it;
  // sampled: each id follows the same distribution (no penalties, for now).
  Speculate speculate = Speculate::none;
  uint32_t draft_tokens = 4;
  // Constrained decoding (docs/CONSTRAINED.md): added to the logits after the
  // penalties, (id, bias) with distinct ids (OpenAI's logit_bias); and the
  // ids the constraint allows (none: every id).
  std::vector<std::pair<int32_t, float>> logit_bias;
  std::shared_ptr<Constraint> constraint;
  bool ephemeral = false;            // the cache is the call's alone: emptied when it ends (its
                                     // blocks go back at once, for the calls waiting for them)
  // Soft tokens of the prompt (engine/media.h): its images' or clips' rows. Null: none.
  std::shared_ptr<const Media> media;
  // Tests: the scheduler holds the call before its k-th step (1 = the first)
  // until the caller resumes, cancels or aborts it, so a test can act at a
  // chosen point of a call that otherwise runs on its own thread. 0: never.
  uint32_t hold_at_step = 0;
};

// Counts of one call, for benchmarks and the per-token accounting.
struct Stats {
  uint32_t prompt_tokens = 0;
  uint32_t prompt_tokens_cached = 0;  // taken from the prefix cache, not computed
  uint32_t generated_tokens = 0;
  uint32_t prefill_steps = 0;
  uint32_t decode_steps = 0;
  double queue_seconds = 0;    // submitted, not yet admitted (the pool had no room, or max_seqs ran)
  double prefill_seconds = 0;  // admitted, first token out
  double decode_seconds = 0;   // the decode steps after it
  uint64_t batch_sequences = 0;  // summed over its decode steps: sequences in each step
  uint32_t max_batch = 0;        // most sequences in one of its steps
  uint32_t draft_proposed = 0;   // speculative decoding: ids proposed and verified,
  uint32_t draft_accepted = 0;   // and those of them the model's own choice confirmed
  // Optimistic admission (scheduler.h): times the call gave its blocks back for
  // others and waited, and the tokens it fed again to resume (the prompt's not
  // in the prefix cache, then its generated ids as decode rows).
  uint32_t preemptions = 0;
  uint32_t recomputed_tokens = 0;
  gpu::Counters prefill_counters;  // of the whole steps it took part in
  gpu::Counters decode_counters;
  // "stop" (a stop id), "length" (max_tokens), "context_full" (a full layer
  // has no slot left), "cancelled" (cancel or stop_after), "aborted"
  std::string finish_reason;
};

// One emitted id's log-probability (log-softmax of the raw logits row it was
// sampled from), and the `logprobs` most likely ids of that row with theirs,
// highest first (ties: lower id first).
struct TokenLogprob {
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;
};

class Request {
 public:
  // ---- the caller's side (any thread) ----
  // Ids generated since the last take (appended to `out`); true once the call
  // is over and every id has been taken.
  bool take(std::vector<int32_t>& out);
  bool done() const;
  void stop_after(uint64_t k);
  void cancel();
  void abort();
  bool held() const { return held_; }  // waiting at GenerateOptions::hold_at_step
  void resume();
  // The caller stops reading ids as they come (it waits for the end): a paced
  // call runs on without waiting for it.
  void unpace();
  // After done(): rethrows the call's error, if any.
  void rethrow() const;
  Stats stats() const;
  std::vector<int32_t> ids() const;
  // With GenerateOptions::logprobs >= 0: the entries of ids start.. (one per
  // id, in order); otherwise empty.
  std::vector<TokenLogprob> logprobs(size_t start = 0) const;
  // A logits call's rows (n, vocab), or with keep_logits the logits each
  // token was sampled from (one row per sampling step, a stop id's included).
  std::vector<float> take_logits();
  const std::shared_ptr<Channel>& channel() const { return channel_; }
  // The prompt tokens the cache holds so far (a cached prefix included) and
  // the prompt's, for a long prompt's progress; (0, 0) before the first step.
  std::pair<uint32_t, uint32_t> prompt_progress() const { return {fed_.load(), prompt_.load()}; }

  // channel: what the caller waits on; scheduler: what wakes the scheduler
  // when the caller reads ids or steers the call.
  Request(std::shared_ptr<Channel> channel, std::shared_ptr<Channel> scheduler)
      : channel_(std::move(channel)), scheduler_(std::move(scheduler)) {}

  // ---- the scheduler's side ----
  bool cancelled() const { return cancel_; }
  bool resumed() const { return resumed_; }
  bool unpaced() const { return unpaced_; }
  void set_held() {
    held_ = true;
    channel_->notify();
  }
  bool aborted() const { return abort_; }
  int64_t stop_index() const { return stop_after_; }  // -1: none
  uint64_t taken() const { return taken_; }           // ids the caller has read
  // An emitted id, with its entry when the call records log-probabilities.
  void push(int32_t id, std::optional<TokenLogprob> logprob = std::nullopt);
  void drop_after(uint64_t n_keep);                   // ids (and entries) past n_keep go (stop_after's rollback)
  void finish(Stats stats, std::exception_ptr error = nullptr);
  void set_prompt_progress(uint32_t fed, uint32_t prompt) {
    fed_ = fed, prompt_ = prompt;
    channel_->notify();
  }
  void set_logits(std::vector<float> rows) {
    std::lock_guard<std::mutex> lock(mutex_);
    logits_ = std::move(rows);
  }

 private:
  std::shared_ptr<Channel> channel_;
  std::shared_ptr<Channel> scheduler_;
  mutable std::mutex mutex_;
  std::vector<int32_t> ids_;
  std::vector<TokenLogprob> logprobs_;  // parallel to ids_ when the call records them, else empty
  std::atomic<uint64_t> taken_{0};
  bool done_ = false;
  Stats stats_;
  std::exception_ptr error_;
  std::vector<float> logits_;
  std::atomic<bool> cancel_{false}, abort_{false}, held_{false}, resumed_{false}, unpaced_{false};
  std::atomic<int64_t> stop_after_{-1};
  std::atomic<uint32_t> fed_{0}, prompt_{0};
};

}  // namespace mkv::engine
