#include <algorithm>
#include <cstring>

#include "engine/scheduler_running.h"
#include "kv/prefix_cache.h"
#include "metal/sample_params.h"

namespace mkv::engine {

// ---- admission ------------------------------------------------------------------
Scheduler::Admission Scheduler::try_admit(Running& r) {
  kv::KvCache& c = r.cache();
  const GenerateOptions& o = r.job.options;
  r.keep = o.keep.value_or(c.length(0));
  const uint64_t extra = !r.job.logits && o.max_tokens > 0 ? uint64_t(o.max_tokens - 1) : 0;
  r.n_store = r.n() + extra;  // (max_tokens < 2^63: no overflow)
  std::lock_guard<std::recursive_mutex> pool_lock(c.pool().mutex());

  // 1. room: a shared pool reserves every block the call may take past the
  // prefix the prefix cache hands it, or (optimistic) its prompt's and the ids it
  // has generated, with a watermark left for the running calls to grow into; or
  // the job waits
  kv::prefix::Match match;
  const bool fresh = r.keep == 0 || c.length(0) == 0;
  if (!c.owns_pool() && fresh && !r.job.logits && o.prefix_cache && c.shares_prefixes() &&
      r.n() >= 2 + kv::kBlockTokens)
    match = kv::prefix::find(c.pool(), r.job.prompt.data(), r.n(), r.n() - 2, c.spec().residual);
  const uint32_t from = std::max(r.keep, match.tokens);  // (a match is whole blocks: no tail to copy)
  const auto stored_after = [&](uint64_t n) { return c.blocks_to_store(from, r.keep + n - from); };
  std::vector<uint32_t> need = stored_after(r.n_store);
  r.optimistic = false;
  if (options_.optimistic && !c.owns_pool() && o.ephemeral && !r.job.logits && o.max_tokens > 0 &&
      o.speculate != Speculate::draft && c.spec().policy.kind == kv::PolicyKind::none) {
    r.optimistic = true;  // unless the whole call could not fit the pool alone: then it reserves all, as before
    for (uint32_t g = 0; g < c.pool().n_groups(); ++g) r.optimistic &= need[g] <= c.pool().blocks(g).capacity();
  }
  std::vector<uint32_t> watermark(c.pool().n_groups(), 0);
  if (r.optimistic) {
    const std::vector<uint32_t> now = stored_after(uint64_t(r.n()) + r.out.size());
    for (uint32_t g = 0; g < c.pool().n_groups(); ++g) {  // (a sliding group's: as far as its window)
      need[g] = now[g];
      watermark[g] = n_running_ > 0 ? std::max(1u, c.pool().blocks(g).capacity() / 32) : 0;
    }
  }
  if (!c.owns_pool()) {
    for (uint32_t g = 0; g < c.pool().n_groups(); ++g) {
      const kv::BlockPool& blocks = c.pool().blocks(g);
      const uint32_t want = need[g] + (match.tokens ? match.evictable[g] : 0);
      if (want + watermark[g] <= blocks.available()) continue;
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

  // 1b. room in kv_memory for its own buffers (the ring, table mirrors, a ring copy)
  if (const kv::KvBudgetPtr budget = c.owns_pool() ? nullptr : c.pool().budget()) {
    const size_t own = c.own_bytes_to_run(r.keep, r.n_store);
    if (!budget->fits(own)) {
      if (n_running_ > 0) return Admission::wait;  // running calls will give theirs back
      finish(r, "aborted",
             std::make_exception_ptr(kv::KvMemoryError(
                 "engine", "kv_memory",
                 "the engine's kv_memory (" + str(budget->total()) + " bytes) has " + str(budget->available()) +
                     " free and this call's own buffers (residual ring, block tables) need " + str(own) +
                     "; the rest is held by other caches. Free those caches (del cache, cache.reset()), or load "
                     "the engine with a larger kv_memory")));
      return Admission::failed;
    }
    c.make_own_buffers();  // charged now: the next call admitted sees them
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
    c.adopt_prefix(match.blocks, r.job.prompt.data(), match.tokens, match.hashes, match.rows);
    r.fed = match.tokens;
    if (!r.resumed()) r.stats.prompt_tokens_cached = match.tokens;
  }
  c.open_prompt(uint32_t(r.n() - r.fed));  // (a policy that holds prompts whole compresses after it)
  if (!c.owns_pool() && !c.reserve(need)) {  // cannot happen: checked above under the same lock
    restore(r);
    return Admission::wait;
  }
  if (r.resumed()) {  // what it feeds again: the prompt past the cached prefix, then its ids but the last
    r.stats.recomputed_tokens += r.n() - r.fed + uint32_t(std::max<size_t>(r.out.size(), 1)) - 1;
    r.phase = Running::Phase::prefill;
    return Admission::admitted;  // its sampling state is as it left it
  }

  // 3. sampling state: the draws, the ids the penalties look at, pacing (its
  // buffers are the engine's, not kv_memory's: docs/KV_CACHE.md "Every byte counted")
  r.rng.seed(o.seed);
  if (r.penalty_on()) {
    std::vector<uint32_t> pen(c.record().tokens().begin(), c.record().tokens().end());
    pen.insert(pen.end(), r.job.prompt.begin() + r.fed, r.job.prompt.end());
    r.n_penalty = uint32_t(pen.size());
    r.penalty = device_->new_buffer(std::max<size_t>(pen.size() + 64, 1) * sizeof(uint32_t));
    r.penalty->write(0, pen.data(), pen.size() * sizeof(uint32_t));
  }
  if (o.sampling.counts_on()) r.counted = device_->new_buffer(16 * 2 * sizeof(uint32_t));  // 16 ids, then doubled
  if (o.sampling.counts_on() && r.speculates())
    r.proposed = device_->new_buffer(mkv_params::kSampleMaxExtra * sizeof(uint32_t));
  if (!o.logit_bias.empty()) {
    std::vector<uint32_t> pairs;
    for (const auto& [id, b] : o.logit_bias) {
      uint32_t bits;
      std::memcpy(&bits, &b, sizeof bits);
      pairs.insert(pairs.end(), {uint32_t(id), bits});
    }
    r.bias = device_->new_buffer(pairs.size() * sizeof(uint32_t));
    r.bias->write(0, pairs.data(), pairs.size() * sizeof(uint32_t));
  }
  if (o.constraint) {  // a row for each id a step may sample: a verified segment's too
    const size_t rows = 1 + (r.speculates() ? o.draft_tokens : 0);
    r.mask = device_->new_buffer(rows * mask_words() * sizeof(uint32_t));
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
      admitting_ = 1;
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
    admitting_ = 0;
    if (a == Admission::admitted) {
      ++n_running_;
      running_.push_back(std::move(r));
    } else if (a == Admission::wait) {
      queue_.push_front(std::move(r));  // first come, first served: nothing overtakes it
      return;
    }
  }
}

// ---- optimistic admission: room for the next rows, or a preemption --------------
void Scheduler::make_room() {
  std::vector<Running*> preempted;  // newest first
  for (auto& rp : running_) {       // in admission order: the oldest is served first
    Running& r = *rp;
    if (!r.optimistic || r.phase == Running::Phase::done || r.phase == Running::Phase::queued) continue;
    const uint32_t rows = r.next_rows();
    std::lock_guard<std::recursive_mutex> pool_lock(r.cache().pool().mutex());
    while (rows && !r.cache().top_up(rows)) {
      Running* victim = nullptr;  // the newest optimistic job still running (perhaps r)
      for (auto it = running_.rbegin(); it != running_.rend() && !victim; ++it)
        if ((*it)->optimistic && (*it)->phase != Running::Phase::done && (*it)->phase != Running::Phase::queued)
          victim = it->get();
      if (victim == &r && std::none_of(running_.begin(), running_.end(), [&](const auto& o) {
            return o.get() != &r && o->phase != Running::Phase::done && o->phase != Running::Phase::queued;
          })) {  // alone, and still short: blocks other caches hold (not calls) fill the pool
        finish(r, "aborted",
               std::make_exception_ptr(gpu::GpuError(
                   "[engine] the KV pool is full: this call holds " + str(r.cache().length(0)) +
                   " tokens and no other call runs; the rest of the pool is held by other caches. Free those "
                   "caches (del cache, cache.reset()), or load the engine with a larger kv_memory")));
        break;
      }
      preempt(*victim);
      preempted.push_back(victim);
      if (victim == &r) break;
    }
  }
  if (preempted.empty()) return;
  // Out of the batch, to the queue's front, the oldest first.
  std::vector<std::unique_ptr<Running>> moved;
  for (auto& rp : running_)
    if (rp && rp->phase == Running::Phase::queued) moved.push_back(std::move(rp));
  running_.erase(std::remove(running_.begin(), running_.end(), nullptr), running_.end());
  std::lock_guard<std::mutex> lock(mutex_);
  n_running_ -= uint32_t(moved.size());
  for (auto it = moved.rbegin(); it != moved.rend(); ++it) queue_.push_front(std::move(*it));
}

// The job gives back every block the call took (its cache as before the call)
// and waits to resume; what it generated, its draws and its penalties stay.
void Scheduler::preempt(Running& r) {
  r.cache().unreserve();
  restore(r);
  r.phase = Running::Phase::queued;
  r.fed = 0;
  r.replayed = 0;
  r.drafts.clear();
  ++r.stats.preemptions;
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

}  // namespace mkv::engine
