#include "engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "kv/prefix_cache.h"

namespace mkv::engine {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
std::string str(uint64_t v) { return std::to_string(v); }

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

// ---- admission ------------------------------------------------------------------
Scheduler::Admission Scheduler::try_admit(Running& r) {
  kv::KVCache& c = r.cache();
  const GenerateOptions& o = r.job.options;
  r.keep = o.keep.value_or(c.length(0));
  const uint64_t extra = !r.job.logits && o.max_tokens > 0 ? uint64_t(o.max_tokens - 1) : 0;
  r.n_store = r.n() + extra;  // (max_tokens < 2^63: no overflow)
  std::lock_guard<std::recursive_mutex> pool_lock(c.pool().mutex());

  // 1. room: a shared pool reserves every block the call may take, or the job waits
  kv::prefix::Match match;
  const std::vector<uint32_t> need = c.blocks_to_store(r.keep, r.n_store);
  if (!c.owns_pool()) {
    const bool fresh = r.keep == 0 || c.length(0) == 0;
    if (fresh && !r.job.logits && o.prefix_cache && r.n() >= 2 + kv::kBlockTokens)
      match = kv::prefix::find(c.pool(), r.job.prompt.data(), r.n(), r.n() - 2);
    for (uint32_t g = 0; g < c.pool().n_groups(); ++g) {
      const kv::BlockPool& blocks = c.pool().blocks(g);
      const uint32_t want = need[g] + (match.tokens ? match.evictable[g] : 0);
      if (want <= blocks.available()) continue;
      if (n_running_ > 0) return Admission::wait;  // running calls will give blocks back
      finish(r, "aborted",
             std::make_exception_ptr(gpu::GpuError(
                 "[engine] the KV pool is full: this call may store " + str(r.n_store) + " tokens after " +
                 str(r.keep) + " and needs " + str(want) + " blocks of " + str(kv::kBlockTokens) +
                 " tokens in the layers of window " + str(c.pool().group_window(g)) + "; " + str(blocks.available()) +
                 " of " + str(blocks.capacity()) + " are free, the rest held by other caches. Free those caches "
                 "(del cache, cache.reset()), ask for fewer tokens (max_tokens), or load the engine with a larger "
                 "kv_memory")));
      return Admission::failed;
    }
  }

  // 2. the checkpoint, the roll back to keep, the cached prefix, the reservation
  r.cp.emplace(c.checkpoint(runner_.queue(), r.keep, r.n_store));
  if (r.keep < c.length(0)) {
    try {
      c.truncate(r.keep);
    } catch (const gpu::GpuError& e) {
      restore(r);
      finish(r, "aborted",
             std::make_exception_ptr(gpu::ArgumentError(
                 "generate", "cache",
                 std::string("the cache holds a conversation this prompt does not continue and cannot roll it back (") +
                     e.what() + "); pass a new cache")));
      return Admission::failed;
    }
  }
  if (match.tokens) {
    c.adopt_prefix(match.blocks, r.job.prompt.data(), match.tokens, match.hashes);
    r.fed = match.tokens;
    r.stats.prompt_tokens_cached = match.tokens;
  }
  if (!c.owns_pool() && !c.reserve(need)) {  // cannot happen: checked above under the same lock
    restore(r);
    return Admission::wait;
  }

  // 3. sampling state: the draws, the ids repetition penalty looks at, pacing
  r.rng.seed(o.seed);
  if (r.penalty_on()) {
    std::vector<uint32_t> pen(c.tokens().begin(), c.tokens().end());
    pen.insert(pen.end(), r.job.prompt.begin() + r.fed, r.job.prompt.end());
    r.n_penalty = uint32_t(pen.size());
    r.penalty = device_->new_buffer(std::max<size_t>(pen.size() + 64, 1) * sizeof(uint32_t));
    r.penalty->write(0, pen.data(), pen.size() * sizeof(uint32_t));
  }
  if (o.paced) {
    r.ahead = 8;  // a sliding layer rolls back at most max_chunk + 1 one-token steps
    for (uint32_t w : c.spec().windows)
      if (w) r.ahead = std::min(r.ahead, c.spec().max_chunk + 1);
  }
  r.admitted = Clock::now();
  r.stats.queue_seconds = seconds_between(r.submitted, r.admitted);
  r.stats.prompt_tokens = r.n();
  r.phase = Running::Phase::prefill;
  return Admission::admitted;
}

void Scheduler::admit() {
  for (;;) {
    std::unique_ptr<Running> r;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (queue_.empty() || n_running_ >= options_.max_seqs) return;
      r = std::move(queue_.front());
      queue_.pop_front();
    }
    Admission a = Admission::failed;
    if (r->job.request->aborted() || r->job.request->cancelled()) {
      finish(*r, r->job.request->aborted() ? "aborted" : "cancelled");  // never started: the cache is untouched
    } else {
      try {
        a = try_admit(*r);
      } catch (...) {
        if (r->cp) restore(*r);
        finish(*r, "aborted", std::current_exception());
      }
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (a == Admission::admitted) {
      ++n_running_;
      running_.push_back(std::move(r));
    } else if (a == Admission::wait) {
      queue_.push_front(std::move(r));  // first come, first served: nothing overtakes it
      return;
    }
  }
}

// ---- the caller's controls, between steps ------------------------------------
void Scheduler::restore(Running& r) {
  if (r.cp) r.cache().restore(runner_.queue(), *r.cp);
  r.cp.reset();
}

void Scheduler::control() {
  // Queued calls their callers gave up on leave the queue now (their caches untouched).
  std::vector<std::unique_ptr<Running>> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = queue_.begin(); it != queue_.end();)
      if ((*it)->job.request->aborted() || (*it)->job.request->cancelled()) {
        dropped.push_back(std::move(*it));
        it = queue_.erase(it);
      } else {
        ++it;
      }
  }
  for (auto& r : dropped) finish(*r, r->job.request->aborted() ? "aborted" : "cancelled");
  for (auto& rp : running_) {
    Running& r = *rp;
    if (r.phase == Running::Phase::done) continue;
    Request& q = *r.job.request;
    if (q.aborted()) {
      restore(r);
      finish(r, "aborted");
    } else if (q.stop_index() >= 0 && uint64_t(q.stop_index()) < r.out.size()) {
      // Keep ids 0..k: the cache as right after id k was sampled (k not fed).
      const uint64_t k = uint64_t(q.stop_index());
      const uint32_t length = r.prompt_end + uint32_t(k);
      if (r.cache().length(0) > length) {
        try {
          r.cache().truncate(length);
        } catch (const gpu::GpuError&) {
          // cannot happen while pacing holds the scheduler within the history:
          // the cache then keeps the ids fed after k
        }
      }
      r.out.resize(k + 1);
      q.drop_after(k + 1);
      if (r.job.options.keep_logits) r.logits.resize((k + 1) * size_t(model_->spec().vocab));
      finish(r, "cancelled");
    } else if (q.cancelled()) {
      if (r.out.empty()) restore(r);  // nothing generated (or a logits call): the call did not happen
      finish(r, "cancelled");
    }
  }
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
      samplers.push_back({&r.job.options.sampling, {r.penalty, 0}, r.n_penalty, r.draw()});
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
    r.out.push_back(id);
    r.job.request->push(id);
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
