// ops.sample: the device sampler, for tests.
#include <nanobind/nanobind.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>

#include "bindings.h"
#include "ops/sample.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace mkv::bindings {
namespace {

void bind_sample(nb::module_&, nb::module_& ops) {
  ops.def(
      "sample",
      [](PyDevice& dev, const gpu::BufferPtr& logits, uint32_t vocab, float uniform,
         double temperature, int64_t top_k, double top_p, double min_p, double repetition_penalty,
         const gpu::BufferPtr& penalty_ids, uint32_t n_penalty_ids, double presence_penalty,
         double frequency_penalty, const gpu::BufferPtr& counted, uint32_t n_counted, int32_t draft, float accept,
         const gpu::BufferPtr& extra, uint32_t n_extra, const gpu::BufferPtr& mask, const gpu::BufferPtr& bias,
         uint32_t n_bias, const std::string& shape) {
        if (!logits || logits->length() < size_t(vocab) * 4)
          throw gpu::GpuError("[sample] logits buffer holds fewer than vocab floats");
        if (n_penalty_ids && (!penalty_ids || penalty_ids->length() < size_t(n_penalty_ids) * 4))
          throw gpu::GpuError("[sample] penalty_ids buffer holds fewer than n_penalty_ids ids");
        if (n_counted && (!counted || counted->length() < size_t(n_counted) * 8))
          throw gpu::GpuError("[sample] counted buffer holds fewer than n_counted (id, count) uint32 pairs");
        if (n_extra && (!extra || extra->length() < size_t(n_extra) * 4))
          throw gpu::GpuError("[sample] extra buffer holds fewer than n_extra ids");
        auto work = dev.device->new_buffer(size_t(vocab) * 4);
        auto token = dev.device->new_buffer(4);
        const ops::SamplingParams s{temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty,
                                    frequency_penalty};
        run_compute(dev, [&](gpu::ComputeEncoder& enc) {
          ops::sample(*dev.device, enc, {logits, 0}, {penalty_ids, 0}, n_penalty_ids,
                      {{counted, 0}, n_counted, {extra, 0}, n_extra}, {work, 0}, {token, 0}, vocab, s, uniform,
                      {draft, accept}, {{mask, 0}, {bias, 0}, n_bias}, ops::sample_shape_from_name(shape));
        });
        uint32_t id = 0;
        token->read(0, &id, sizeof id);
        return id;
      },
      "device"_a, "logits"_a, "vocab"_a, "uniform"_a = 0.0f, "temperature"_a = 0.0,
      "top_k"_a = 0, "top_p"_a = 1.0, "min_p"_a = 0.0, "repetition_penalty"_a = 1.0,
      "penalty_ids"_a.none() = nb::none(), "n_penalty_ids"_a = 0, "presence_penalty"_a = 0.0,
      "frequency_penalty"_a = 0.0, "counted"_a.none() = nb::none(), "n_counted"_a = 0, "draft"_a = -1,
      "accept"_a = 0.0f, "extra"_a.none() = nb::none(), "n_extra"_a = 0, "mask"_a.none() = nb::none(),
      "bias"_a.none() = nb::none(), "n_bias"_a = 0, "shape"_a = "",
      "Draws one token id from a row of logits on the device. penalty_ids: uint32 ids the repetition penalty\n"
      "scales; counted: n_counted (id, count) uint32 pairs, each id once, that presence_penalty and\n"
      "frequency_penalty subtract count * frequency + presence from. draft >= 0: speculative verification, the\n"
      "draft kept when accept < its probability, else a draw with `uniform` from the rest. extra: n_extra\n"
      "uint32 ids counted once more each for presence/frequency (a verified row's proposals before it).\n"
      "mask: ceil(vocab / 32) uint32 words, an id drawn only where its bit is set; bias: n_bias (uint32 id,\n"
      "float32 bias) pairs added to the logits (constrained decoding, after the penalties). shape: '' the\n"
      "device's kernel, 'gpu' (1024 threads) or 'simd' (one SIMD-group, the host executor's).");
}

}  // namespace

MKV_BINDING(sample, bind_sample);

}  // namespace mkv::bindings
