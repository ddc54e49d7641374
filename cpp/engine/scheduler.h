// Scheduler: continuous batching. One thread runs every model step of an
// engine; calls from any number of threads are jobs it admits, steps and
// retires (docs/BATCHING.md).
//
// Each step is three phases, a StepPlan passed from one to the next:
//   plan   (scheduler_plan.cpp, plan_step) admit queued jobs, first come first
//          served, while fewer than max_seqs run and (over a shared pool) the
//          pool has room: a job waits in the queue until running ones give
//          blocks back (one that could never fit fails at once). Admission is
//          optimistic for a call whose cache is its own (ephemeral: the server's,
//          generate without cache=): it reserves its prompt's blocks (and the ids
//          it has generated, when it resumes), not max_tokens'; other calls
//          reserve every block they may take, and never find the pool full.
//          Before each step an optimistic job's reservation is topped up to what
//          its next rows store (make_room); when the pool is short, the newest
//          optimistic job is preempted: its cache goes back to the pool as
//          before the call, and it waits at the queue's front. Resumed, it feeds
//          its prompt again (the prefix cache holds most of it) and then its
//          generated ids as decode rows (replay), computed as they were the
//          first time, so its reply is the same, bit for bit. The oldest call is
//          never preempted for a newer one: every call ends.
//          Admission takes the cache's checkpoint, rolls it back to
//          `keep`, and for an empty cache adopts the longest cached prefix of
//          the prompt (kv/prefix_cache.h). Then apply what callers asked between
//          steps (abort, cancel, stop_after) and choose the rows under the
//          step's row budget (step_rows): a logits call's chunk alone, or one
//          row for every decoding job, then prompt chunks of prefilling jobs in
//          admission order, each chunk >= 2 tokens unless the whole prompt is
//          one (so a prompt always runs the prefill kernels, whatever the
//          budget left). Each chosen job's stores are checked here, once per
//          layer (Model::check_segment): one that cannot go in fails alone;
//   run    (run_step) encode, commit and wait for the step (StepRunner: one
//          command buffer, one wait; if the device fails, every job of the
//          step fails, its cache put back);
//   apply  (apply_step) each job, in step order, commits its rows into its
//          cache (one KvCache::commit: record, note, publish), takes its
//          sampled id (logits, logprobs, penalties) and finishes on a stop id,
//          max_tokens or a full cache. Rows a plan marks tentative (none today;
//          speculative decoding's drafts) are where apply would roll back the
//          rejected ones before the commit.
// A job's result does not depend on what else runs in its steps: each row's
// arithmetic is batch-invariant (model.h), so the same call alone and in a
// batch gives the same ids, bit for bit.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "engine/draft.h"
#include "engine/request.h"
#include "engine/step.h"
#include "kv/kv_cache.h"

namespace mkv::engine {

struct SchedulerOptions {
  uint32_t prefill_chunk = 128;  // most prompt tokens of one job in one step
  uint32_t max_seqs = 64;        // jobs running at once (decoding or prefilling)
  uint32_t step_tokens = 192;    // rows one step may feed (the token budget)
  uint32_t gemm_decode_rows = 0;  // Model::encode_step's: 0 keeps batch invariance
  bool optimistic = true;         // optimistic admission with preemption (above); false: every call reserves all
};

// One call: what it feeds and how it samples. The cache must stay alive, and
// be used by no other call, until the request is done.
struct Job {
  std::shared_ptr<Request> request;
  kv::KvCache* cache = nullptr;
  std::vector<int32_t> prompt;
  GenerateOptions options;
  bool logits = false;  // a logits call: every row's logits, no sampling
};

// Most prompt tokens one step may store in this cache: prefill_chunk, or a
// sliding layer's or an eviction policy's max_chunk (the one rule; Engine's
// checks of a prompt's images read it too).
uint32_t chunk_cap(const kv::KvCache& cache, uint32_t prefill_chunk);

class Scheduler {
 public:
  // draft: a draft model for Speculate::draft calls (nullptr: none).
  Scheduler(gpu::DevicePtr device, std::shared_ptr<const model::Model> model, SchedulerOptions options,
            std::shared_ptr<const model::Model> draft = nullptr);
  bool has_draft() const { return drafter_ != nullptr; }
  ~Scheduler();  // stop()
  // Aborts what is still queued or running (their caches as before), then joins the
  // thread; later submits fail. Idempotent; not to be called from two threads at once.
  void stop();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  const SchedulerOptions& options() const { return options_; }
  // Queues a checked job (Engine::submit checks it); raises ArgumentError when
  // its cache is already in a call.
  void submit(Job job);
  // What a Request wakes the scheduler with (Engine::submit gives it to each).
  const std::shared_ptr<Channel>& wakeup() const { return wakeup_; }
  // Jobs waiting for admission and running now.
  uint32_t queued() const;
  uint32_t running() const;

 private:
  struct Running;
  // One step: the rows plan_step chose, what run_step feeds and apply_step takes.
  struct StepPlan {
    struct Part {  // one job's rows, in step order (multi-token segments first)
      Running* r = nullptr;
      uint32_t n = 0;  // rows (tokens) it feeds
      model::Logits logits = model::Logits::none;  // last: it samples; all: a logits call, alone
      // Speculative decoding (Logits::each): of the n rows, the last `tentative`
      // are proposed ids; apply_step truncates the rejected ones before its commit.
      uint32_t tentative = 0;
      bool replay = false;  // a resumed job's generated ids fed again (decode rows), nothing sampled
      size_t at = 0;  // its first row in ids
    };
    std::vector<Part> parts;
    std::vector<model::Segment> segments;  // one per part
    std::vector<int32_t> ids;              // (rows) the tokens the step feeds
    std::vector<Sampler> samplers;         // one per Logits::last part, one per row of a Logits::each one
    uint32_t dropped = 0;                  // jobs chosen whose store check failed (finished)
  };
  struct StepOutput {
    gpu::Counters counters;
    std::vector<int32_t> sampled;  // one id per sampler
  };
  enum class Admission { admitted, wait, failed };
  void loop();
  bool step();  // plan, run, apply; false when there was nothing to run
  // plan (scheduler_plan.cpp)
  StepPlan plan_step();
  void admit();
  Admission try_admit(Running& r);
  void control();
  // Optimistic admission (scheduler_admit.cpp): tops up each optimistic job's
  // reservation for its next rows, preempting the newest while the pool is short.
  void make_room();
  void preempt(Running& r);
  void choose_rows(StepPlan& plan);
  void add_part(StepPlan& plan, Running& r, uint32_t n, model::Logits logits);
  uint32_t media_chunk(const Running& r, uint32_t take, uint32_t limit) const;
  uint32_t propose(Running& r, uint32_t spare, uint64_t unread);
  // Constrained decoding (scheduler_plan.cpp): the words of one mask row, and
  // the step's masks, computed while its forward pass runs (StepRunner's hook).
  uint32_t mask_words() const { return (model_->spec().vocab + 31) / 32; }
  void fill_masks(const StepPlan& plan);
  // run
  bool run_step(const StepPlan& plan, StepOutput& out);
  // apply
  void apply_step(const StepPlan& plan, const StepOutput& out);
  void take_id(Running& r, int32_t id, uint32_t logit_row);
  void take_verified(Running& r, const StepPlan::Part& p, const int32_t* ids, const int32_t* sampled,
                     uint32_t logit_row);
  void finish(Running& r, const std::string& reason, std::exception_ptr error = nullptr);
  void restore(Running& r);
  void retire();
  void abort_all(std::exception_ptr error);

  gpu::DevicePtr device_;
  std::shared_ptr<const model::Model> model_;
  SchedulerOptions options_;
  StepRunner runner_;
  std::unique_ptr<Drafter> drafter_;  // with a draft model
  std::shared_ptr<Channel> wakeup_ = std::make_shared<Channel>();
  mutable std::mutex mutex_;  // guards queue_, in_flight_, stop_, n_running_, admitting_
  bool stop_ = false;
  uint32_t n_running_ = 0;
  uint32_t admitting_ = 0;  // a job out of the queue while admit() tries it: still queued()
  std::deque<std::unique_ptr<Running>> queue_;
  std::vector<std::unique_ptr<Running>> running_;  // the scheduler thread's alone
  std::vector<const kv::KvCache*> in_flight_;      // caches of queued and running jobs
  std::thread thread_;
};

}  // namespace mkv::engine
