#include "ops/sample.h"

#include <algorithm>
#include <cmath>

#include "metal/sample_params.h"

namespace mkv::ops {

void validate_sampling(const SamplingParams& s) {
  auto bad = [](const char* name, double v, const char* expected) {
    throw gpu::ArgumentError("sampling", name, gpu::format_number(v), expected);
  };
  if (!(s.temperature >= 0.0) || !std::isfinite(s.temperature))
    bad("temperature", s.temperature, "a finite number >= 0 (0 = greedy)");
  if (s.top_k < 0)
    throw gpu::ArgumentError("sampling", "top_k", std::to_string(s.top_k), "an int >= 0 (0 = off)");
  if (!(s.top_p > 0.0 && s.top_p <= 1.0)) bad("top_p", s.top_p, "a number in (0, 1] (1 = off)");
  if (!(s.min_p >= 0.0 && s.min_p <= 1.0)) bad("min_p", s.min_p, "a number in [0, 1] (0 = off)");
  if (!(s.repetition_penalty > 0.0) || !std::isfinite(s.repetition_penalty))
    bad("repetition_penalty", s.repetition_penalty, "a finite number > 0 (1 = off)");
}

void sample(gpu::Device& dev, gpu::ComputeEncoder& enc, const BufferView& logits,
            const BufferView& penalty_ids, uint32_t n_penalty_ids, const BufferView& work,
            const BufferView& token, uint32_t vocab, const SamplingParams& s, float uniform) {
  validate_sampling(s);
  if (vocab == 0) fail("sample", "vocab must be > 0");
  if (!(uniform >= 0.0f && uniform < 1.0f))
    fail("sample", "uniform draw must be in [0, 1), got " + std::to_string(uniform));
  // top_k beyond the vocabulary keeps everything, as top_k = 0 does
  const uint32_t top_k = uint32_t(std::min<int64_t>(s.top_k, vocab));
  const mkv_params::Sample p{vocab,        n_penalty_ids,        top_k, float(s.temperature), float(s.top_p),
                             float(s.min_p), float(s.repetition_penalty), uniform};
  enc.set_pipeline(dev.pipeline("sample_f32"));
  bind_params(enc, p, 0);
  bind(enc, logits, 1);
  bind(enc, penalty_ids.buffer ? penalty_ids : logits, 2);  // unused when n_penalty_ids == 0
  bind(enc, work, 3);
  bind(enc, token, 4);
  enc.dispatch_threadgroups({1, 1, 1}, {1024, 1, 1});
}

}  // namespace mkv::ops
