// Argument struct of the token sampler (metal/sample.metal, cpp/ops/sample.cpp).
#pragma once

#include "shared_params.h"

namespace mkv_params {

// One threadgroup samples one row of logits. Filters follow transformers'
// order: repetition penalty, temperature, top-k, top-p, min-p.
struct Sample {
  uint32_t vocab;
  uint32_t n_penalty_ids;      // ids whose logits the repetition penalty scales
  uint32_t top_k;              // 0 = off
  float temperature;           // 0 = greedy (argmax after the penalty)
  float top_p;                 // 1 = off
  float min_p;                 // 0 = off
  float repetition_penalty;    // 1 = off
  float uniform;               // the draw, in [0, 1)
};

}  // namespace mkv_params

#ifndef __METAL_VERSION__
static_assert(sizeof(mkv_params::Sample) == 32, "Sample params layout");
#endif
