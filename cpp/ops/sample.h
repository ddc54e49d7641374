// Token sampling on the device (metal/sample.metal).
#pragma once

#include <string>
#include <vector>

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
  // OpenAI's, over the ids this call generated (not the prompt), c[j] times id j:
  // logit[j] -= frequency_penalty * c[j] + presence_penalty * (c[j] > 0).
  double presence_penalty = 0.0;    // 0 = off
  double frequency_penalty = 0.0;   // 0 = off

  bool counts_on() const { return presence_penalty != 0.0 || frequency_penalty != 0.0; }
  // A plain argmax of the logits (no penalty changes them).
  bool greedy() const { return temperature == 0.0 && repetition_penalty == 1.0 && !counts_on(); }
};

// The one check of the sampling arguments, wherever they come from (Python's
// Engine, the CLI before it loads a model, C++ callers): raises
// ArgumentError("[sampling] top_p=1.5: expected a number in (0, 1] (1 = off)").
void validate_sampling(const SamplingParams& s);

// The ids the presence and frequency penalties look at: n unique (id, count)
// pairs, uint32 each, (n, 2) on the device (may be empty).
struct GeneratedCounts {
  BufferView pairs;
  uint32_t n = 0;
  // n_extra uint32 ids (at most kSampleMaxExtra) counted once more each: a
  // verified row's proposals before it (metal/sample_params.h).
  BufferView extra;
  uint32_t n_extra = 0;
};

// token[0] = a token drawn from logits (vocab floats) with the filters of s;
// uniform in [0, 1) is the draw (ignored when greedy). work: vocab floats of
// scratch. penalty_ids: n_penalty_ids uint32 token ids (may be empty), read
// when repetition_penalty != 1; counted: read when presence or frequency is on.
// Speculative verification (docs/SPECULATIVE.md): a proposed id and its
// acceptance draw; draft < 0: none.
struct DraftDraw {
  int32_t draft = -1;
  float accept = 0.0f;  // in [0, 1)
};

// Constrained decoding's edits of a row, after the penalties: bias (n_bias
// (uint32 id, float bias) pairs, distinct ids, at most kSampleMaxBias) added,
// then the ids whose bit is clear in mask (ceil(vocab / 32) uint32 words, bit
// id % 32 of word id / 32; no buffer: none masked) made -inf. At least one id
// must stay allowed (the caller's check).
struct LogitEdits {
  BufferView mask;
  BufferView bias;
  uint32_t n_bias = 0;
  bool on() const { return mask.buffer || n_bias; }
};

// The kernel's shape: the device's (its lanes_are_fibers: one SIMD-group,
// else 1024 threads), or either one by name (tests run both on the host).
enum class SampleShape { device, gpu, simd };
SampleShape sample_shape_from_name(const std::string& name);  // "", "gpu", "simd"; else ArgumentError

// With a draft: token[0] = the draft with probability p(draft) under the
// filtered distribution (accept < p(draft)), else a draw with `uniform` from
// that distribution without the draft. Greedy ignores it (the caller compares).
void sample(gpu::Device& dev, gpu::ComputeEncoder& enc, const BufferView& logits,
            const BufferView& penalty_ids, uint32_t n_penalty_ids, const GeneratedCounts& counted,
            const BufferView& work, const BufferView& token, uint32_t vocab, const SamplingParams& s,
            float uniform, DraftDraw draft = {}, const LogitEdits& edits = {},
            SampleShape shape = SampleShape::device);

// Every kernel name sample builds (sample_f32, sample_f32_simd; tests/gpu/test_kernel_names.py).
std::vector<std::string> sample_kernel_names();

}  // namespace mkv::ops
