// Token sampling on the device (metal/sample.metal).
#pragma once

#include "ops/ops.h"

namespace mkv::ops {

struct SamplingParams {
  float temperature = 0.0f;         // 0 = greedy
  uint32_t top_k = 0;               // 0 = off
  float top_p = 1.0f;               // 1 = off
  float min_p = 0.0f;               // 0 = off
  float repetition_penalty = 1.0f;  // 1 = off
};

// Raises GpuError ("[sample] ...") for values outside their ranges.
void validate_sampling(const SamplingParams& s);

// token[0] = a token drawn from logits (vocab floats) with the filters of s;
// uniform in [0, 1) is the draw (ignored when greedy). work: vocab floats of
// scratch. penalty_ids: n_penalty_ids uint32 token ids (may be empty).
void sample(gpu::Device& dev, gpu::ComputeEncoder& enc, const BufferView& logits,
            const BufferView& penalty_ids, uint32_t n_penalty_ids, const BufferView& work,
            const BufferView& token, uint32_t vocab, const SamplingParams& s, float uniform);

}  // namespace mkv::ops
