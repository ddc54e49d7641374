#include "ops/sample.h"

#include <cmath>

#include "metal/sample_params.h"

namespace mkv::ops {

void validate_sampling(const SamplingParams& s) {
  if (!(s.temperature >= 0.0f) || !std::isfinite(s.temperature))
    fail("sample", "temperature must be a finite number >= 0 (0 = greedy), got " +
                       std::to_string(s.temperature));
  if (!(s.top_p > 0.0f && s.top_p <= 1.0f))
    fail("sample", "top_p must be in (0, 1], got " + std::to_string(s.top_p));
  if (!(s.min_p >= 0.0f && s.min_p < 1.0f))
    fail("sample", "min_p must be in [0, 1), got " + std::to_string(s.min_p));
  if (!(s.repetition_penalty > 0.0f) || !std::isfinite(s.repetition_penalty))
    fail("sample", "repetition_penalty must be a finite number > 0, got " +
                       std::to_string(s.repetition_penalty));
}

void sample(gpu::Device& dev, gpu::ComputeEncoder& enc, const BufferView& logits,
            const BufferView& penalty_ids, uint32_t n_penalty_ids, const BufferView& work,
            const BufferView& token, uint32_t vocab, const SamplingParams& s, float uniform) {
  validate_sampling(s);
  if (vocab == 0) fail("sample", "vocab must be > 0");
  if (!(uniform >= 0.0f && uniform < 1.0f))
    fail("sample", "uniform draw must be in [0, 1), got " + std::to_string(uniform));
  const mkv_params::Sample p{vocab,   n_penalty_ids, s.top_k, s.temperature, s.top_p,
                             s.min_p, s.repetition_penalty, uniform};
  enc.set_pipeline(dev.pipeline("sample_f32"));
  bind_params(enc, p, 0);
  bind(enc, logits, 1);
  bind(enc, penalty_ids.buffer ? penalty_ids : logits, 2);  // unused when n_penalty_ids == 0
  bind(enc, work, 3);
  bind(enc, token, 4);
  enc.dispatch_threadgroups({1, 1, 1}, {1024, 1, 1});
}

}  // namespace mkv::ops
