// Drafter: a smaller model's proposals for speculative decoding
// (docs/SPECULATIVE.md, "Draft model"). Each speculating call keeps a cache of
// the draft model (DraftCache); before a step the drafter brings it to the
// target's ids (catching up on what was accepted, or going back to where the
// two part), then proposes k ids in k greedy one-token steps of its own. After
// the target's verification, rollback() drops what the target did not keep.
// The proposals only decide how fast a reply comes: every id is the target's,
// verified as with prompt lookup.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/step.h"
#include "gpu/device.h"
#include "kv/kv_cache.h"
#include "model/model.h"

namespace mkv::engine {

struct DraftCache {
  std::unique_ptr<kv::KvCache> cache;  // the draft model's, made at the first proposal
};

// The most ids a catch-up feeds as decode rows (after a verified step: the
// last proposal and the target's own id; after a rejection: one). Longer ones
// (a prompt) go through the prompt path, whose gemm pads a few rows to a whole
// tile: measured on an H100, a 2-id catch-up cost an 8B-shaped draft 66 ms as
// a prompt chunk against 6 ms for a decode step.
inline constexpr uint32_t kCatchUpRows = 4;

class Drafter {
 public:
  // max_chunk: most ids one draft step feeds (its caches' prompt chunks).
  Drafter(gpu::DevicePtr device, std::shared_ptr<const model::Model> draft, uint32_t max_chunk);

  const model::Model& model() const { return *draft_; }
  // Up to k greedy proposals after `history` (the target's ids so far, the last
  // one not yet in the target's cache); capacity: the target cache's, which the
  // draft cache takes too.
  std::vector<int32_t> propose(DraftCache& state, const std::vector<int32_t>& history, uint32_t k,
                               uint32_t capacity);
  // The target now holds `kept` positions: the draft cache keeps at most those.
  void rollback(DraftCache& state, uint32_t kept);

 private:
  // Feeds ids into the cache: up to kCatchUpRows as one step of decode rows,
  // more in prompt steps of at most max_chunk; the last row samples: the id after them.
  int32_t feed(kv::KvCache& cache, const int32_t* ids, uint32_t n);

  gpu::DevicePtr device_;
  std::shared_ptr<const model::Model> draft_;
  uint32_t max_chunk_;
  StepRunner runner_;
};

}  // namespace mkv::engine
