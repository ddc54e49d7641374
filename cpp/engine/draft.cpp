#include "engine/draft.h"

#include <algorithm>

#include "ops/elementwise.h"

namespace mkv::engine {
namespace {

const ops::SamplingParams kGreedy{};

Sampler greedy() {
  Sampler s;
  s.params = &kGreedy;
  return s;
}

}  // namespace

Drafter::Drafter(gpu::DevicePtr device, std::shared_ptr<const model::Model> draft, uint32_t max_chunk)
    : device_(device),
      draft_(draft),
      max_chunk_(std::max(max_chunk, kCatchUpRows)),
      runner_(device, draft, max_chunk_, kCatchUpRows) {}

int32_t Drafter::feed(kv::KvCache& cache, const int32_t* ids, uint32_t n) {
  if (n >= 2 && n <= kCatchUpRows) {  // decode rows (the gemv), each row its logits; the last one's id
    const model::Segment seg{&cache, n, model::Logits::each};
    draft_->check_segment(seg);
    std::vector<int32_t> step_ids(ids, ids + n), sampled;
    const std::vector<Sampler> samplers(n, greedy());
    runner_.run({seg}, step_ids, samplers, sampled);
    cache.commit(step_ids.data(), n, false, /*decode_rows=*/true);
    return sampled.back();
  }
  int32_t next = -1;
  for (uint32_t done = 0; done < n;) {
    uint32_t take = std::min(n - done, max_chunk_);
    const bool last = done + take == n;
    const model::Segment seg{&cache, take, last ? model::Logits::last : model::Logits::none};
    draft_->check_segment(seg);
    std::vector<int32_t> step_ids(ids + done, ids + done + take), sampled;
    std::vector<Sampler> samplers;
    if (last) samplers.push_back(greedy());
    runner_.run({seg}, step_ids, samplers, sampled);
    cache.commit(step_ids.data(), take, false);
    if (last) next = sampled[0];
    done += take;
  }
  return next;
}

std::vector<int32_t> Drafter::propose(DraftCache& state, const std::vector<int32_t>& history, uint32_t k,
                                      uint32_t capacity) {
  if (history.empty() || k == 0) return {};
  if (!state.cache)
    state.cache = std::make_unique<kv::KvCache>(
        device_, draft_->cache_spec(capacity, max_chunk_, kv::StorePath::compute));
  kv::KvCache& cache = *state.cache;
  // Where the draft cache and the target's ids part (a rollback, a chat turn
  // rolled back, ids the draft has not seen): keep what agrees, feed the rest.
  const std::vector<int32_t>& held = cache.record().tokens();
  size_t common = 0;
  while (common < held.size() && common + 1 < history.size() && held[common] == history[common]) ++common;
  if (common < cache.length(0)) {
    try {
      cache.truncate(uint32_t(common));
    } catch (const gpu::GpuError&) {  // a sliding layer too far past it: start over
      cache.reset();
      common = 0;
    }
  }
  const uint32_t room = capacity - std::min<uint32_t>(capacity, uint32_t(history.size()));
  k = std::min(k, room);
  std::vector<int32_t> drafts;
  if (k == 0) return drafts;
  drafts.push_back(feed(cache, history.data() + common, uint32_t(history.size() - common)));
  while (drafts.size() < k) drafts.push_back(feed(cache, &drafts.back(), 1));
  return drafts;
}

void Drafter::rollback(DraftCache& state, uint32_t kept) {
  if (!state.cache || state.cache->length(0) <= kept) return;
  try {
    state.cache->truncate(kept);
  } catch (const gpu::GpuError&) {
    state.cache->reset();  // the next proposal catches up from the start
  }
}

}  // namespace mkv::engine
