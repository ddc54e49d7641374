// Token sampling on the device (metal/sample.metal).
#pragma once

#include "ops/ops.h"

namespace mkv::ops {

// As the caller gave them (doubles, a signed top_k), so that validate_sampling
// sees the values themselves; the kernel's float arguments are made in sample().
struct SamplingParams {
  double temperature = 0.0;         // 0 = greedy
  int64_t top_k = 0;                // 0 = off
  double top_p = 1.0;               // 1 = off
  double min_p = 0.0;               // 0 = off
  double repetition_penalty = 1.0;  // 1 = off

  bool greedy() const { return temperature == 0.0 && repetition_penalty == 1.0; }
};

// The one check of the sampling arguments, wherever they come from (Python's
// Engine, the CLI before it loads a model, C++ callers): raises
// ArgumentError("[sampling] top_p=1.5: expected a number in (0, 1] (1 = off)").
void validate_sampling(const SamplingParams& s);

// token[0] = a token drawn from logits (vocab floats) with the filters of s;
// uniform in [0, 1) is the draw (ignored when greedy). work: vocab floats of
// scratch. penalty_ids: n_penalty_ids uint32 token ids (may be empty).
void sample(gpu::Device& dev, gpu::ComputeEncoder& enc, const BufferView& logits,
            const BufferView& penalty_ids, uint32_t n_penalty_ids, const BufferView& work,
            const BufferView& token, uint32_t vocab, const SamplingParams& s, float uniform);

}  // namespace mkv::ops
