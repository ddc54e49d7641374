#include "ops/sample.h"

#include <algorithm>
#include <cmath>

#include "metal/sample_params.h"

namespace mkv::ops {

// One threadgroup a row: 1024 threads on GPUs; one SIMD-group where lanes are
// fibers, whose every barrier switches through all the threads (sample.metal).
static constexpr const char* kSampleKernel = "sample_f32";
static constexpr const char* kSampleKernelSimd = "sample_f32_simd";

SampleShape sample_shape_from_name(const std::string& name) {
  if (name.empty()) return SampleShape::device;
  if (name == "gpu") return SampleShape::gpu;
  if (name == "simd") return SampleShape::simd;
  throw gpu::ArgumentError("sample", "shape", "'" + name + "'", "'' (the device's), 'gpu' or 'simd'");
}

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
  if (!(s.presence_penalty >= -2.0 && s.presence_penalty <= 2.0))  // OpenAI's range; NaN fails too
    bad("presence_penalty", s.presence_penalty, "a finite number in [-2, 2] (0 = off)");
  if (!(s.frequency_penalty >= -2.0 && s.frequency_penalty <= 2.0))
    bad("frequency_penalty", s.frequency_penalty, "a finite number in [-2, 2] (0 = off)");
}

void sample(gpu::Device& dev, gpu::ComputeEncoder& enc, const BufferView& logits,
            const BufferView& penalty_ids, uint32_t n_penalty_ids, const GeneratedCounts& counted,
            const BufferView& work, const BufferView& token, uint32_t vocab, const SamplingParams& s,
            float uniform, DraftDraw draft, const LogitEdits& edits, SampleShape shape) {
  validate_sampling(s);
  if (vocab == 0) fail("sample", "vocab must be > 0");
  if (!(uniform >= 0.0f && uniform < 1.0f))
    fail("sample", "uniform draw must be in [0, 1), got " + std::to_string(uniform));
  if (s.counts_on() && counted.n && !counted.pairs.buffer) fail("sample", "counted pairs given without a buffer");
  if (counted.n_extra > mkv_params::kSampleMaxExtra || (counted.n_extra && !counted.extra.buffer))
    fail("sample", "extra counted ids: at most " + std::to_string(mkv_params::kSampleMaxExtra) + ", in a buffer");
  if (draft.draft >= 0 && (uint32_t(draft.draft) >= vocab || !(draft.accept >= 0.0f && draft.accept < 1.0f)))
    fail("sample", "a draft must be an id of the vocabulary with an acceptance draw in [0, 1)");
  if (edits.n_bias > mkv_params::kSampleMaxBias || (edits.n_bias && !edits.bias.buffer))
    fail("sample", "logit_bias: at most " + std::to_string(mkv_params::kSampleMaxBias) + " pairs, in a buffer");
  if (edits.mask.buffer) check_bytes("sample", "mask", edits.mask, uint64_t(vocab + 31) / 32 * 4);
  if (edits.n_bias) check_bytes("sample", "bias", edits.bias, uint64_t(edits.n_bias) * 8);
  mkv_params::Sample p{};
  p.vocab = vocab;
  p.n_penalty_ids = n_penalty_ids;
  p.top_k = uint32_t(std::min<int64_t>(s.top_k, vocab));  // beyond the vocabulary keeps everything, as 0 does
  p.temperature = float(s.temperature);
  p.top_p = float(s.top_p);
  p.min_p = float(s.min_p);
  p.repetition_penalty = float(s.repetition_penalty);
  p.uniform = uniform;
  p.n_counted = s.counts_on() ? counted.n : 0;
  p.n_extra = s.counts_on() ? counted.n_extra : 0;
  p.presence_penalty = float(s.presence_penalty);
  p.frequency_penalty = float(s.frequency_penalty);
  p.draft = draft.draft >= 0 ? uint32_t(draft.draft) : mkv_params::kNoDraft;
  p.accept = draft.accept;
  p.n_bias = edits.n_bias;
  p.masked = edits.mask.buffer ? 1u : 0u;

  const bool one_simd =
      shape == SampleShape::simd || (shape == SampleShape::device && dev.properties().lanes_are_fibers);
  enc.set_pipeline(dev.pipeline(one_simd ? kSampleKernelSimd : kSampleKernel));
  bind_params(enc, p, 0);
  bind(enc, logits, 1);
  bind(enc, penalty_ids.buffer ? penalty_ids : logits, 2);  // unused when n_penalty_ids == 0
  bind(enc, work, 3);
  bind(enc, token, 4);
  bind(enc, counted.pairs.buffer ? counted.pairs : logits, 5);  // unused when n_counted == 0
  bind(enc, p.n_extra ? counted.extra : logits, 6);                // unused when n_extra == 0
  bind(enc, p.masked ? edits.mask : logits, 7);                     // unused without a mask
  bind(enc, p.n_bias ? edits.bias : logits, 8);                     // unused without a bias
  enc.dispatch_threadgroups({1, 1, 1}, {one_simd ? 32u : mkv_params::kSampleThreads, 1, 1});
}

std::vector<std::string> sample_kernel_names() { return {kSampleKernel, kSampleKernelSimd}; }

}  // namespace mkv::ops
