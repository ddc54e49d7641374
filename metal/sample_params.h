// Argument struct of the token sampler (metal/sample.metal, cpp/ops/sample.cpp).
#pragma once

#include "shared_params.h"

namespace mkv_params {

// One threadgroup samples one row of logits. Filters follow transformers'
// order: repetition penalty, presence/frequency penalties (OpenAI's), then
// temperature, top-k, top-p, min-p.
struct Sample {
  uint32_t vocab;
  uint32_t n_penalty_ids;      // ids whose logits the repetition penalty scales
  uint32_t top_k;              // 0 = off
  float temperature;           // 0 = greedy (argmax after the penalties)
  float top_p;                 // 1 = off
  float min_p;                 // 0 = off
  float repetition_penalty;    // 1 = off
  float uniform;               // the draw, in [0, 1)
  // logit[id] -= count * frequency_penalty + presence_penalty over the
  // n_counted (id, count) pairs of buffer 5: the ids this call generated, each once.
  uint32_t n_counted;          // 0 = off (both penalties 0, or nothing generated yet)
  float presence_penalty;      // 0 = off
  float frequency_penalty;     // 0 = off
  // Speculative verification (docs/SPECULATIVE.md): a proposed id, taken with
  // probability p(draft) under the filtered distribution (when accept <
  // p(draft)); otherwise the token is drawn with `uniform` from that
  // distribution without the draft. kNoDraft: an ordinary draw.
  uint32_t draft;
  float accept;                // the acceptance draw, in [0, 1)
  // Ids this row's context holds beyond `counted`, in order (buffer 6): a
  // verified row's proposals before it. Each occurrence counts once more for
  // the presence/frequency penalties, as if `counted` held them: an id's
  // penalty is one subtraction of its whole count, the same bits as without.
  uint32_t n_extra;            // at most kSampleMaxExtra
  // Constrained decoding (docs/CONSTRAINED.md), after the penalties: logit[id]
  // += bias over the n_bias (id, bias bits) pairs of buffer 8 (distinct ids),
  // then every id whose bit is clear in the bitmask of buffer 7 (bit id % 32
  // of word id / 32) becomes -inf: it is never drawn, nor the argmax.
  uint32_t n_bias;             // 0 = off
  uint32_t masked;             // 0 = no mask
};
// Threads of sample_f32's threadgroup (GPUs; sample_f32_simd, where lanes are fibers: 32).
MKV_CONSTANT uint32_t kSampleThreads = 1024;
MKV_CONSTANT uint32_t kNoDraft = 0xffffffffu;
MKV_CONSTANT uint32_t kSampleMaxExtra = 16;  // the engine's most proposals a step (kMaxDraftTokens)
MKV_CONSTANT uint32_t kSampleMaxBias = 1024;  // logit_bias entries (OpenAI takes up to 300)

}  // namespace mkv_params

#ifndef __METAL_VERSION__
#include <cstddef>
static_assert(sizeof(mkv_params::Sample) == 64, "Sample params layout");
static_assert(offsetof(mkv_params::Sample, draft) == 44, "Sample params layout");
static_assert(offsetof(mkv_params::Sample, n_counted) == 32, "Sample params layout");
static_assert(offsetof(mkv_params::Sample, n_extra) == 52, "Sample params layout");
static_assert(offsetof(mkv_params::Sample, masked) == 60, "Sample params layout");
#endif
