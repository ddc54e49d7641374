// Scheduler, the plan phase: which jobs run this step and which rows each
// feeds (scheduler.h; admission and the caller's controls: scheduler_admit.cpp).
#include <algorithm>

#include "engine/lookup.h"
#include "engine/media.h"
#include "engine/scheduler_running.h"

namespace mkv::engine {

uint32_t chunk_cap(const kv::KvCache& cache, uint32_t prefill_chunk) {
  uint32_t cap = prefill_chunk;
  for (uint32_t w : cache.spec().windows)
    if (w) cap = std::min(cap, cache.spec().max_chunk);
  if (cache.spec().policy.kind != kv::PolicyKind::none) cap = std::min(cap, cache.spec().max_chunk);
  return cap;
}

namespace {

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

// Tokens a store may still put into every full layer of the cache.
uint32_t room(const kv::KvCache& cache) {
  uint32_t n = cache.spec().max_chunk;
  for (uint32_t l = 0; l < cache.n_layers(); ++l)
    if (!cache.wraps(l)) n = std::min(n, cache.spec().capacity - std::min(cache.spec().capacity, cache.length(l)));
  return n;
}

}  // namespace

// A decoding job's proposals for this step (into r.drafts), at most `spare`:
// no more than it may still emit less one (the verified row's own id comes
// too), than a paced caller may be ahead, than leaves the cache a free slot
// after the step (a full cache ends the call at the same id as without
// speculation), and than an eviction policy stores before its next eviction
// (decoding alone would evict between the rows; a step that evicts verifies
// nothing), so every stored row is one decoding without it would store.
uint32_t Scheduler::propose(Running& r, uint32_t spare, uint64_t unread) {
  r.drafts.clear();
  if (!r.speculates() || spare == 0) return 0;
  if (r.draft_k == 0) r.draft_k = r.job.options.draft_tokens;
  const int64_t left = r.job.options.max_tokens - int64_t(r.out.size());
  uint64_t cap = std::min<uint64_t>({r.draft_k, spare, uint64_t(std::max<int64_t>(left - 1, 0))});
  if (!r.job.request->unpaced()) cap = std::min<uint64_t>(cap, r.ahead > unread + 1 ? r.ahead - unread - 1 : 0);
  const uint32_t free = room(r.cache());
  cap = std::min<uint64_t>(cap, free >= 3 ? free - 2 : 0);  // 1 + drafts rows, and one slot left
  const uint32_t room = r.cache().room_before_eviction();
  cap = std::min<uint64_t>(cap, room >= 1 ? room - 1 : 0);
  if (cap == 0) return 0;
  // What the cache holds (earlier turns of a conversation too), then the id this step feeds.
  std::vector<int32_t> history = r.cache().record().tokens();
  history.push_back(r.out.back());
  r.drafts = r.job.options.speculate == Speculate::draft
                 ? drafter_->propose(r.draft, history, uint32_t(cap), r.cache().spec().capacity)
                 : lookup_drafts(history, uint32_t(cap));
  if (Constraint* c = r.constraint())  // the grammar takes these, or the rest could never be kept
    r.drafts.resize(c->valid_prefix(r.drafts.data(), uint32_t(r.drafts.size())));
  return uint32_t(r.drafts.size());
}

// Each constrained job's mask rows for this step, written to its mask buffer:
// one for a sampled row; a verified segment's row i after advancing its
// proposals 1..i (propose() kept only those the constraint takes), taken back
// after. A row that allows nothing ends the call (apply_step).
void Scheduler::fill_masks(const StepPlan& plan) {
  const uint32_t words = mask_words();
  for (const StepPlan::Part& p : plan.parts) {
    Running& r = *p.r;
    Constraint* c = r.constraint();
    if (!c || p.replay || (p.logits != model::Logits::last && p.logits != model::Logits::each)) continue;
    const uint32_t rows = p.logits == model::Logits::each ? p.n : 1;
    r.mask_rows.assign(size_t(rows) * words, 0u);
    uint32_t advanced = 0;
    for (uint32_t i = 0; i < rows && r.constraint_error.empty(); ++i) {
      uint32_t* row = r.mask_rows.data() + size_t(i) * words;
      c->allowed(row, words);
      if (std::all_of(row, row + words, [](uint32_t w) { return w == 0; }))
        r.constraint_error = "it allows no token here: " + c->error();
      else if (i + 1 < rows && !c->advance(r.drafts[i]))
        r.constraint_error = "a proposal it had taken failed: " + c->error();
      else
        advanced += i + 1 < rows;
    }
    if (advanced) c->rollback(advanced);
    r.mask->write(0, r.mask_rows.data(), r.mask_rows.size() * sizeof(uint32_t));
  }
}

Scheduler::StepPlan Scheduler::plan_step() {
  control();
  retire();
  make_room();  // the running jobs' next rows first (preempting the newest if short), then admissions
  admit();
  StepPlan plan;
  choose_rows(plan);
  return plan;
}

void Scheduler::choose_rows(StepPlan& plan) {
  // A logits call (every row's logits) runs its chunks in steps of its own.
  for (auto& rp : running_) {
    Running& r = *rp;
    if (r.phase != Running::Phase::prefill || !r.job.logits || r.holding()) continue;
    const uint32_t cap = chunk_cap(r.cache(), options_.prefill_chunk),
                   budget = std::min(runner_.step_rows(), runner_.logit_rows());
    const uint32_t take = media_chunk(r, prompt_chunk(r.n() - r.fed, cap, budget), std::min(cap, budget));
    if (take == 0) continue;
    add_part(plan, r, take, model::Logits::all);
    return;
  }

  // One row for each decoding job, then prompt chunks in admission order; the
  // model takes multi-token segments first, one-token ones after.
  struct Choice {
    Running* r;
    uint32_t n;
    bool sample;
  };
  std::vector<Choice> multi, single;
  uint32_t budget = runner_.step_rows(), logit_rows = runner_.logit_rows();
  std::vector<std::pair<Running*, uint64_t>> decoding;  // (job, ids its caller has not read)
  for (auto& rp : running_) {
    Running& r = *rp;
    if (r.phase != Running::Phase::decode || r.holding()) continue;
    const uint64_t unread = r.out.size() - std::min<uint64_t>(r.job.request->taken(), r.out.size());
    if (unread >= r.ahead && !r.job.request->unpaced()) continue;  // paced: wait for the caller to read
    decoding.push_back({&r, unread});
  }
  // A row for each, then proposals to verify from the rows left after those
  // (a speculating job's segment: its id and its drafts, each a decode row).
  const size_t rows_free = std::min(budget, logit_rows);
  uint32_t spare = uint32_t(rows_free - std::min(decoding.size(), rows_free));
  for (auto [rp, unread] : decoding) {
    if (budget == 0 || logit_rows == 0) break;
    const uint32_t m = propose(*rp, spare, unread);
    spare -= m;
    single.push_back({rp, 1 + m, true});
    budget -= 1 + m;
    logit_rows -= 1 + m;
  }
  for (auto& rp : running_) {  // resumed jobs: their generated ids again, a segment of decode rows each
    Running& r = *rp;
    if (r.phase != Running::Phase::replay || r.holding()) continue;
    const uint32_t take = std::min({r.next_rows(), budget, logit_rows});
    if (take == 0) continue;
    single.push_back({&r, take, false});
    budget -= take;
    logit_rows -= take;
  }
  for (auto& rp : running_) {
    Running& r = *rp;
    if (r.phase != Running::Phase::prefill || r.job.logits || r.holding()) continue;
    const uint32_t cap = chunk_cap(r.cache(), options_.prefill_chunk);
    const uint32_t take = media_chunk(r, prompt_chunk(r.n() - r.fed, cap, budget), std::min(cap, budget));
    if (take == 0) continue;
    // (a resumed job's first id after its prompt is known: nothing to sample)
    const bool sample = r.fed + take == r.n() && r.job.options.max_tokens > 0 && r.out.empty();
    if (sample && logit_rows == 0) continue;
    (take >= 2 ? multi : single).push_back({&r, take, sample});
    budget -= take;
    logit_rows -= sample;
  }
  for (const std::vector<Choice>* list : {&multi, &single})
    for (const Choice& c : *list) {
      // (a replay segment's rows are decode rows: Logits::each, its samples unused)
      const bool verify = (c.r->phase == Running::Phase::decode && c.n > 1) || c.r->phase == Running::Phase::replay;
      add_part(plan, *c.r, c.n, verify ? model::Logits::each : c.sample ? model::Logits::last : model::Logits::none);
    }
}

// A prompt chunk of `take` tokens (of at most `limit`), another size where it
// would cut an image whose tokens see each other (Media::uncut).
uint32_t Scheduler::media_chunk(const Running& r, uint32_t take, uint32_t limit) const {
  const Media* m = r.job.options.media.get();
  return m && limit ? m->uncut(r.fed, take, limit) : take;
}

void Scheduler::add_part(StepPlan& plan, Running& r, uint32_t n, model::Logits logits) {
  // The step's one store check (every layer): a segment that cannot go in
  // (cannot happen after admission, but a cache changed behind the engine's
  // back) fails alone, before anything is encoded or drawn.
  try {
    model_->check_segment({&r.cache(), n, logits});
  } catch (...) {
    restore(r);
    finish(r, "aborted", std::current_exception());
    ++plan.dropped;
    return;
  }
  if (r.phase == Running::Phase::replay) {  // plain greedy samplers: no draw, no penalty, no mask
    static const ops::SamplingParams greedy;
    plan.parts.push_back({&r, n, logits, 0, true, plan.ids.size()});
    plan.segments.push_back({&r.cache(), n, logits});
    plan.ids.insert(plan.ids.end(), r.out.begin() + r.replayed, r.out.begin() + r.replayed + n);
    Sampler s;
    s.params = &greedy;
    plan.samplers.insert(plan.samplers.end(), n, s);
    return;
  }
  const uint32_t tentative = logits == model::Logits::each ? n - 1 : 0;
  plan.parts.push_back({&r, n, logits, tentative, false, plan.ids.size()});
  plan.segments.push_back({&r.cache(), n, logits});
  if (r.phase == Running::Phase::decode) {
    plan.ids.push_back(r.out.back());
    plan.ids.insert(plan.ids.end(), r.drafts.begin(), r.drafts.begin() + tentative);
  } else {
    plan.ids.insert(plan.ids.end(), r.job.prompt.begin() + r.fed, r.job.prompt.begin() + r.fed + n);
    if (const Media* m = r.job.options.media.get())
      m->chunk(r.fed, n, r.cache().length(0), plan.segments.back().soft, plan.segments.back().blocks);
  }
  // A draw wherever a token is sampled: the same seed, the same draws, whatever
  // the chunks. A verified segment: a sampler a row, its penalties counting the
  // proposals before it; sampled, row i < n - 1
  // verifies proposal i + 1 (its acceptance draw, then the draw used if it is
  // rejected), the last row draws the next id (docs/SPECULATIVE.md).
  const bool greedy = r.job.options.sampling.greedy();
  Sampler base;
  base.params = &r.job.options.sampling;
  base.penalty_ids = {r.penalty, 0};
  base.n_penalty = r.n_penalty;
  base.counted.pairs = {r.counted, 0};
  base.counted.n = r.n_counted();
  base.edits = r.edits(0, mask_words());
  if (logits == model::Logits::last) {
    base.uniform = r.draw();
    plan.samplers.push_back(base);
  }
  if (logits == model::Logits::each) r.stage_proposals(*device_, tentative);
  for (uint32_t i = 0; logits == model::Logits::each && i < n; ++i) {
    // Row i's context holds the proposals before it: its penalties count them.
    Sampler s = base;
    s.n_penalty = r.n_penalty + i;
    s.counted.extra = {r.proposed, 0};
    s.counted.n_extra = r.proposed ? i : 0;
    s.edits = r.edits(i, mask_words());
    if (!greedy && i + 1 < n) s.draft = {r.drafts[i], r.draw()};
    if (!greedy) s.uniform = r.draw();
    plan.samplers.push_back(s);
  }
}

}  // namespace mkv::engine
