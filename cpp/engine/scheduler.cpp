// Scheduler: a step (plan_step, then run_step and apply_step here), retiring,
// the loop (scheduler.h has the phases).
#include "engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <limits>

#include "engine/scheduler_running.h"
#include "engine/token_logprob.h"

namespace mkv::engine {
namespace {

bool cache_full(const kv::KvCache& cache) {
  for (uint32_t l = 0; l < cache.n_layers(); ++l)
    if (!cache.wraps(l) && cache.length(l) >= cache.spec().capacity) return true;
  return false;
}

}  // namespace

Scheduler::Scheduler(gpu::DevicePtr device, std::shared_ptr<const model::Model> model, SchedulerOptions options,
                     std::shared_ptr<const model::Model> draft)
    : device_(device),
      model_(model),
      options_(options),
      runner_(device, model, options.step_tokens, std::max(options.prefill_chunk, options.max_seqs),
              options.gemm_decode_rows) {
  if (options_.prefill_chunk == 0 || options_.max_seqs == 0)
    ops::fail("engine", "prefill_chunk and max_seqs must be at least 1");
  if (options_.step_tokens < options_.max_seqs + std::min(options_.prefill_chunk, 2u))
    ops::fail("engine", "step_tokens " + str(options_.step_tokens) + " leaves no room for a prompt chunk beside " +
                            str(options_.max_seqs) + " decoding sequences (max_seqs); it must be at least max_seqs + 2");
  if (draft) drafter_ = std::make_unique<Drafter>(device, std::move(draft), options_.prefill_chunk);
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { stop(); }

void Scheduler::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wakeup_->notify();
  if (thread_.joinable()) thread_.join();
}

void Scheduler::submit(Job job) {
  auto r = std::make_unique<Running>();
  r->submitted = Clock::now();
  r->job = std::move(job);
  std::lock_guard<std::mutex> lock(mutex_);
  if (stop_) ops::fail("engine", "the engine is shutting down");
  if (std::find(in_flight_.begin(), in_flight_.end(), r->job.cache) != in_flight_.end())
    throw gpu::ArgumentError("generate", "cache",
                             "this cache is in another call that has not finished; a cache serves one call at a time "
                             "(use engine.new_cache() for each concurrent conversation)");
  in_flight_.push_back(r->job.cache);
  queue_.push_back(std::move(r));
  wakeup_->notify();
}

uint32_t Scheduler::queued() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return uint32_t(queue_.size()) + admitting_;
}

uint32_t Scheduler::running() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return n_running_;
}

// ---- a step: plan, run, apply ----------------------------------------------------
bool Scheduler::step() {
  const StepPlan plan = plan_step();
  if (plan.parts.empty()) return plan.dropped > 0;
  StepOutput out;
  if (run_step(plan, out)) apply_step(plan, out);
  return true;
}

bool Scheduler::run_step(const StepPlan& plan, StepOutput& out) {
  try {
    const bool masks = std::any_of(plan.parts.begin(), plan.parts.end(),
                                   [](const StepPlan::Part& p) { return p.r->constraint() != nullptr; });
    out.counters = runner_.run(plan.segments, plan.ids, plan.samplers, out.sampled,
                               masks ? std::function<void()>([&] { fill_masks(plan); }) : std::function<void()>());
    const StepPlan::Part& p = plan.parts[0];
    if (p.logits == model::Logits::all) {  // a logits call, alone in its step: its rows, read back now
      const uint32_t vocab = model_->spec().vocab;
      p.r->logits.resize(size_t(p.r->n()) * vocab);
      runner_.read_logits(p.r->logits.data() + size_t(p.r->fed) * vocab, p.n);
    }
  } catch (...) {  // the device failed: every call of the step fails, its cache put back
    for (const StepPlan::Part& part : plan.parts) {
      restore(*part.r);
      finish(*part.r, "aborted", std::current_exception());
    }
    return false;
  }
  return true;
}

void Scheduler::apply_step(const StepPlan& plan, const StepOutput& out) {
  const Clock::time_point now = Clock::now();
  const uint32_t n_parts = uint32_t(plan.parts.size());
  uint32_t next_sample = 0;
  for (const StepPlan::Part& p : plan.parts) {
    Running& r = *p.r;
    if (p.replay) {  // a resumed job's ids again: every row kept, nothing taken
      r.cache().commit(plan.ids.data() + p.at, p.n, r.job.options.prefix_cache, /*decode_rows=*/true);
      r.replayed += p.n;
      r.stats.max_batch = std::max(r.stats.max_batch, n_parts);
      if (r.replayed + 1 == r.out.size()) r.phase = Running::Phase::decode;
      next_sample += p.n;
      continue;
    }
    if (p.logits == model::Logits::each) {  // a speculating job: its id and proposals, verified
      r.stats.decode_steps++;
      r.stats.decode_counters += out.counters;
      r.stats.batch_sequences += n_parts;
      r.stats.max_batch = std::max(r.stats.max_batch, n_parts);
      take_verified(r, p, plan.ids.data() + p.at, out.sampled.data() + next_sample, next_sample);
      next_sample += p.n;
      continue;
    }
    r.cache().commit(plan.ids.data() + p.at, p.n, r.job.options.prefix_cache);
    const bool decoding = r.phase == Running::Phase::decode;
    if (decoding) {
      r.stats.decode_steps++;
      r.stats.decode_counters += out.counters;
      r.stats.batch_sequences += n_parts;
    } else {
      r.fed += p.n;
      r.job.request->set_prompt_progress(r.fed, r.n());
      r.stats.prefill_steps++;
      r.stats.prefill_counters += out.counters;
    }
    if (p.logits == model::Logits::all) {  // a logits call (its rows were read back by run_step)
      if (r.fed == r.n()) {
        r.stats.prefill_seconds = seconds_between(r.admitted, now);
        finish(r, "length");
      }
      continue;
    }
    r.stats.max_batch = std::max(r.stats.max_batch, n_parts);
    if (p.logits == model::Logits::none) {
      if (r.fed == r.n() && !decoding && !r.out.empty()) {  // resumed, its prompt again: its ids, or decode
        r.prompt_end = r.cache().length(0);
        r.phase = r.out.size() > 1 ? Running::Phase::replay : Running::Phase::decode;
      } else if (r.fed == r.n() && !decoding) {  // max_tokens 0: the prompt only
        r.stats.prefill_seconds = seconds_between(r.admitted, now);
        finish(r, "length");
      }
      continue;
    }
    if (!decoding) {
      r.first_token = now;
      r.prompt_end = r.cache().length(0);
      r.stats.prefill_seconds = seconds_between(r.admitted, now);
      r.phase = Running::Phase::decode;
    }
    const uint32_t logit_row = next_sample++;
    take_id(r, out.sampled[logit_row], logit_row);
  }
}

// A job's sampled id: its logits and logprobs, the stop ids, its penalties, its end.
void Scheduler::take_id(Running& r, int32_t id, uint32_t logit_row) {
  const uint32_t vocab = model_->spec().vocab;
  if (!r.constraint_error.empty())
    return finish(r, "aborted", std::make_exception_ptr(gpu::GpuError("[constraint] " + r.constraint_error)));
  if (r.job.options.keep_logits) {
    const size_t at = r.logits.size();
    r.logits.resize(at + vocab);
    runner_.read_logits(r.logits.data() + at, 1, logit_row);
  }
  if (r.stops_at(id)) return finish(r, "stop");
  std::optional<TokenLogprob> logprob;
  if (r.job.options.logprobs >= 0) {  // of the raw row: before penalties and temperature
    r.row.resize(vocab);
    runner_.read_logits(r.row.data(), 1, logit_row);
    logprob = token_logprob(r.row.data(), vocab, id, uint32_t(r.job.options.logprobs));
  }
  r.out.push_back(id);
  r.job.request->push(id, std::move(logprob));
  if (r.job.options.sampling.counts_on()) r.count(*device_, id);
  if (r.penalty_on()) r.penalize(*device_, id);  // the penalty looks at what was generated too
  ++r.n_penalty;
  if (Constraint* c = r.constraint()) {
    if (!c->advance(id)) {
      r.constraint_error = "it refused the id " + str(uint32_t(id)) + " it allowed: " + c->error();
      return finish(r, "aborted", std::make_exception_ptr(gpu::GpuError("[constraint] " + r.constraint_error)));
    }
    if (c->done()) return finish(r, "stop");  // complete: nothing more may come
  }
  if (int64_t(r.out.size()) >= r.job.options.max_tokens)
    finish(r, "length");
  else if (cache_full(r.cache()))
    finish(r, "context_full");
}

// A verified segment: fed ids[0] (the last id) and proposals ids[1..n), row i
// sampled sampled[i], the model's own choice after ids[0..i]. Proposal i is
// accepted while it equals sampled[i - 1]; the ids decoding alone would have
// emitted are sampled[0..a] (a accepted), up to the first that ends the call.
// The cache keeps the rows of the ids decoding alone would have fed (the
// last emitted id is fed by the next step), the rest are truncated before the
// commit, and each emitted id goes through take_id with its own logits row.
void Scheduler::take_verified(Running& r, const StepPlan::Part& p, const int32_t* ids, const int32_t* sampled,
                              uint32_t logit_row) {
  const uint32_t m = p.n - 1;
  uint32_t a = 0;
  while (a < m && sampled[a] == ids[a + 1]) ++a;
  r.stats.draft_proposed += m;
  r.stats.draft_accepted += a;
  r.draft_k = a == m ? std::min(r.draft_k + 1, r.job.options.draft_tokens) : a + 1;
  // Ids emitted: up to a stop id (not emitted) or max_tokens.
  uint32_t rows = 0;  // rows whose sampled id is taken (a stop id included)
  uint32_t advanced = 0;  // a constraint: up to the id that completes it, taken back below (take_id takes them)
  Constraint* c = r.constraint_error.empty() ? r.constraint() : nullptr;
  while (rows <= a) {
    const int32_t id = sampled[rows++];
    if (r.stops_at(id)) break;
    if (int64_t(r.out.size()) + rows >= r.job.options.max_tokens) break;
    if (c && (!c->advance(id) || (++advanced, c->done()))) break;
  }
  if (advanced) c->rollback(advanced);
  kv::KvCache& cache = r.cache();
  cache.truncate(cache.length(0) - (p.n - rows));  // within the last store: always possible
  if (cache.spec().policy.traits().scores_attention) {  // the kept rows' shares of the scores, in row order
    kv::EncoderSession enc(runner_.queue());
    cache.apply_verified_shares(enc, rows);
    enc.finish();
  }
  cache.commit(ids, rows, r.job.options.prefix_cache, /*decode_rows=*/true);
  if (r.job.options.speculate == Speculate::draft) drafter_->rollback(r.draft, cache.length(0));
  for (uint32_t i = 0; i < rows && r.phase != Running::Phase::done; ++i) take_id(r, sampled[i], logit_row + i);
}

// ---- retiring -------------------------------------------------------------------
void Scheduler::finish(Running& r, const std::string& reason, std::exception_ptr error) {
  if (r.phase == Running::Phase::done) return;
  const Clock::time_point now = Clock::now();
  if (r.phase == Running::Phase::decode) r.stats.decode_seconds = seconds_between(r.first_token, now);
  if (r.phase == Running::Phase::queued) r.stats.queue_seconds = seconds_between(r.submitted, now);
  r.stats.generated_tokens = uint32_t(r.out.size());
  r.stats.finish_reason = reason;
  if (r.phase != Running::Phase::queued) {
    r.cache().unreserve();
    if (r.job.options.ephemeral) {
      r.cp.reset();
      r.cache().reset();  // published blocks stay in the prefix cache
    }
  }
  r.cp.reset();  // a shared pool's retained blocks go back
  if ((r.job.logits && !error && reason == "length") || r.job.options.keep_logits)
    r.job.request->set_logits(std::move(r.logits));
  r.phase = Running::Phase::done;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    in_flight_.erase(std::find(in_flight_.begin(), in_flight_.end(), r.job.cache));
  }
  r.job.request->finish(r.stats, error);
}

void Scheduler::retire() {
  const auto done = [](const std::unique_ptr<Running>& r) { return r->phase == Running::Phase::done; };
  const size_t before = running_.size();
  running_.erase(std::remove_if(running_.begin(), running_.end(), done), running_.end());
  std::lock_guard<std::mutex> lock(mutex_);
  n_running_ -= uint32_t(before - running_.size());
}

void Scheduler::abort_all(std::exception_ptr error) {
  for (auto& r : running_) {
    try {
      restore(*r);
    } catch (...) {
    }
    finish(*r, "aborted", error);
  }
  retire();
  std::deque<std::unique_ptr<Running>> queued;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queued.swap(queue_);
  }
  for (auto& r : queued) finish(*r, "aborted", error);
}

void Scheduler::loop() {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stop_) break;
    }
    bool worked = false;
    try {
      worked = step();
      retire();
    } catch (...) {  // a bug: fail every call rather than hang them
      abort_all(std::current_exception());
    }
    if (!worked) wakeup_->wait(0.05);
  }
  abort_all(std::make_exception_ptr(gpu::GpuError("[engine] the engine was closed while this call ran")));
}

}  // namespace mkv::engine
