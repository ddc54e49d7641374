#include "engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "engine/scheduler_running.h"
#include "engine/token_logprob.h"
#include "kv/prefix_cache.h"

namespace mkv::engine {
namespace {

bool cache_full(const kv::KVCache& cache) {
  for (uint32_t l = 0; l < cache.n_layers(); ++l)
    if (!cache.wraps(l) && cache.length(l) >= cache.spec().capacity) return true;
  return false;
}

// Most prompt tokens one store may put in this cache (a sliding layer takes max_chunk).
uint32_t chunk_cap(const kv::KVCache& cache, uint32_t prefill_chunk) {
  uint32_t cap = prefill_chunk;
  for (uint32_t w : cache.spec().windows)
    if (w) cap = std::min(cap, cache.spec().max_chunk);
  if (cache.spec().policy.kind != kv::PolicyKind::none) cap = std::min(cap, cache.spec().max_chunk);
  return cap;
}

// The next prompt chunk of a job with `rem` tokens left, under `limit` (its
// cap and the step's budget): never a one-token chunk of a longer prompt, so
// every prompt row runs the prefill kernels (chunk-invariant) however the
// budget cut it; 0 when the budget does not allow one now. Caps below 3
// cannot always avoid it (3 tokens in chunks of 2): then chunks are as cut.
uint32_t prompt_chunk(uint32_t rem, uint32_t cap, uint32_t budget) {
  const uint32_t limit = std::min(cap, budget);
  if (limit == 0) return 0;
  if (cap < 3) return std::min(rem, limit);
  if (rem <= limit) return rem;
  uint32_t take = limit;
  if (rem - take == 1) --take;
  return take >= 2 ? take : 0;
}

}  // namespace


Scheduler::Scheduler(gpu::DevicePtr device, std::shared_ptr<const model::Model> model, SchedulerOptions options)
    : device_(device),
      model_(model),
      options_(options),
      runner_(device, model, options.step_tokens, std::max(options.prefill_chunk, options.max_seqs)) {
  if (options_.prefill_chunk == 0 || options_.max_seqs == 0)
    ops::fail("engine", "prefill_chunk and max_seqs must be at least 1");
  if (options_.step_tokens < options_.max_seqs + std::min(options_.prefill_chunk, 2u))
    ops::fail("engine", "step_tokens " + str(options_.step_tokens) + " leaves no room for a prompt chunk beside " +
                            str(options_.max_seqs) + " decoding sequences (max_seqs); it must be at least max_seqs + 2");
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wakeup_->notify();
  thread_.join();
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
  return uint32_t(queue_.size());
}

uint32_t Scheduler::running() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return n_running_;
}

// ---- a step ---------------------------------------------------------------------
bool Scheduler::logits_step(Running& r) {
  kv::KVCache& c = r.cache();
  const uint32_t take = prompt_chunk(r.n() - r.fed, chunk_cap(c, options_.prefill_chunk),
                                     std::min(runner_.max_tokens(), runner_.logit_rows()));
  const std::vector<int32_t> ids(r.job.prompt.begin() + r.fed, r.job.prompt.begin() + r.fed + take);
  std::vector<int32_t> none;
  try {
    const uint32_t first = c.length(0);
    const gpu::Counters counters = runner_.run({{&c, take, model::Logits::all}}, ids, {}, none);
    const uint32_t vocab = model_->spec().vocab;
    r.logits.resize(size_t(r.n()) * vocab);
    runner_.read_logits(r.logits.data() + size_t(r.fed) * vocab, take);
    c.record_tokens(ids.data(), take);
    c.note_stored(first, take);
    if (!c.owns_pool() && r.job.options.prefix_cache) kv::prefix::publish(c);
    r.fed += take;
    r.stats.prefill_steps++;
    r.stats.prefill_counters += counters;
  } catch (...) {
    restore(r);
    finish(r, "aborted", std::current_exception());
    return true;
  }
  if (r.fed == r.n()) {
    r.stats.prefill_seconds = seconds_between(r.admitted, Clock::now());
    finish(r, "length");
  }
  return true;
}

bool Scheduler::step() {
  // A logits call (every row's logits) runs its chunks in steps of its own.
  for (auto& rp : running_)
    if (rp->phase == Running::Phase::prefill && rp->job.logits && !rp->holding()) return logits_step(*rp);

  struct Part {
    Running* r;
    uint32_t n;
    bool sample;
  };
  std::vector<Part> multi, single;  // multi-token segments first, then one-token ones
  uint32_t budget = runner_.max_tokens(), logit_rows = runner_.logit_rows();
  for (auto& rp : running_) {
    Running& r = *rp;
    if (r.phase != Running::Phase::decode || r.holding()) continue;
    const uint64_t unread = r.out.size() - std::min<uint64_t>(r.job.request->taken(), r.out.size());
    if (unread >= r.ahead && !r.job.request->unpaced()) continue;  // paced: wait for the caller to read
    if (budget == 0 || logit_rows == 0) break;
    single.push_back({&r, 1, true});
    --budget;
    --logit_rows;
  }
  for (auto& rp : running_) {
    Running& r = *rp;
    if (r.phase != Running::Phase::prefill || r.job.logits || r.holding()) continue;
    const uint32_t take = prompt_chunk(r.n() - r.fed, chunk_cap(r.cache(), options_.prefill_chunk), budget);
    if (take == 0) continue;
    const bool sample = r.fed + take == r.n() && r.job.options.max_tokens > 0;
    if (sample && logit_rows == 0) continue;
    (take >= 2 ? multi : single).push_back({&r, take, sample});
    budget -= take;
    logit_rows -= sample;
  }
  std::vector<Part> parts = multi;
  parts.insert(parts.end(), single.begin(), single.end());
  if (parts.empty()) return false;

  // A segment whose store cannot go in (cannot happen after admission, but a
  // cache changed behind the engine's back) fails alone, before anything is encoded.
  std::vector<Part> ok;
  for (const Part& p : parts) {
    try {
      for (uint32_t l = 0; l < p.r->cache().n_layers(); ++l) p.r->cache().check_store(l, p.n);
      ok.push_back(p);
    } catch (...) {
      restore(*p.r);
      finish(*p.r, "aborted", std::current_exception());
    }
  }
  if (ok.empty()) return true;

  std::vector<model::Segment> segments;
  std::vector<int32_t> ids;
  std::vector<Sampler> samplers;
  std::vector<uint32_t> first;  // each segment's first position
  std::vector<size_t> at;       // each segment's first row in ids
  for (const Part& p : ok) {
    Running& r = *p.r;
    segments.push_back({&r.cache(), p.n, p.sample ? model::Logits::last : model::Logits::none});
    first.push_back(r.cache().length(0));
    at.push_back(ids.size());
    if (r.phase == Running::Phase::decode)
      ids.push_back(r.out.back());
    else
      ids.insert(ids.end(), r.job.prompt.begin() + r.fed, r.job.prompt.begin() + r.fed + p.n);
    if (p.sample)  // a draw wherever a token is sampled: the same seed, the same draws, whatever the chunks
      samplers.push_back({&r.job.options.sampling, {r.penalty, 0}, r.n_penalty, {{r.counted, 0}, r.n_counted()},
                          r.draw()});
  }
  std::vector<int32_t> sampled;
  gpu::Counters counters;
  try {
    counters = runner_.run(segments, ids, samplers, sampled);
  } catch (...) {  // the device failed: every call of the step fails, its cache put back
    for (const Part& p : ok) {
      restore(*p.r);
      finish(*p.r, "aborted", std::current_exception());
    }
    return true;
  }

  // Each job takes its results, in step order.
  const Clock::time_point now = Clock::now();
  size_t next_sample = 0;
  for (size_t i = 0; i < ok.size(); ++i) {
    Running& r = *ok[i].r;
    kv::KVCache& c = r.cache();
    const bool decoding = r.phase == Running::Phase::decode;
    c.record_tokens(ids.data() + at[i], ok[i].n);
    c.note_stored(first[i], ok[i].n);
    if (!c.owns_pool() && r.job.options.prefix_cache) kv::prefix::publish(c);
    if (decoding) {
      r.stats.decode_steps++;
      r.stats.decode_counters += counters;
      r.stats.batch_sequences += ok.size();
    } else {
      r.fed += ok[i].n;
      r.stats.prefill_steps++;
      r.stats.prefill_counters += counters;
    }
    r.stats.max_batch = std::max<uint32_t>(r.stats.max_batch, uint32_t(ok.size()));
    if (!ok[i].sample) {
      if (r.fed == r.n() && !decoding) finish(r, "length");  // max_tokens 0: the prompt only
      continue;
    }
    const uint32_t logit_row = uint32_t(next_sample);
    const int32_t id = sampled[next_sample++];
    if (r.job.options.keep_logits) {
      const size_t vocab = model_->spec().vocab, at = r.logits.size();
      r.logits.resize(at + vocab);
      runner_.read_logits(r.logits.data() + at, 1, logit_row);
    }
    if (!decoding) {
      r.first_token = now;
      r.prompt_end = c.length(0);
      r.stats.prefill_seconds = seconds_between(r.admitted, now);
      r.phase = Running::Phase::decode;
    }
    const std::vector<int32_t>& stops = r.job.options.stop_ids;
    if (std::find(stops.begin(), stops.end(), id) != stops.end()) {
      finish(r, "stop");
      continue;
    }
    std::optional<TokenLogprob> logprob;
    if (r.job.options.logprobs >= 0) {  // of the raw row: before penalties and temperature
      const uint32_t vocab = model_->spec().vocab;
      r.row.resize(vocab);
      runner_.read_logits(r.row.data(), 1, logit_row);
      logprob = token_logprob(r.row.data(), vocab, id, uint32_t(r.job.options.logprobs));
    }
    r.out.push_back(id);
    r.job.request->push(id, std::move(logprob));
    if (r.job.options.sampling.counts_on()) r.count(*device_, id);
    if (r.penalty_on()) {  // the penalty looks at what was generated too
      const size_t have = r.penalty->length() / sizeof(uint32_t);
      if (r.n_penalty + 1 > have) {
        gpu::BufferPtr grown = device_->new_buffer(2 * have * sizeof(uint32_t));
        std::vector<uint32_t> kept(r.n_penalty);
        r.penalty->read(0, kept.data(), kept.size() * sizeof(uint32_t));
        grown->write(0, kept.data(), kept.size() * sizeof(uint32_t));
        r.penalty = grown;
      }
      const uint32_t pen_id = uint32_t(id);
      r.penalty->write(size_t(r.n_penalty) * sizeof(uint32_t), &pen_id, sizeof pen_id);
    }
    ++r.n_penalty;
    if (int64_t(r.out.size()) >= r.job.options.max_tokens)
      finish(r, "length");
    else if (cache_full(c))
      finish(r, "context_full");
  }
  return true;
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
      admit();
      control();
      retire();
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
