// Gemma 3n's per-row ops (metal/altup.metal): AltUp's predict and correct
// steps over the hidden state's streams, the streams' magnitude matching and
// mean, the FFN gate's Gaussian top-k, the per-layer input gate. Activations
// float32; every function validates, then encodes one dispatch, and raises
// GpuError "[op] ..." on bad input.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/linear.h"

namespace mkv::ops {

// The streams: n_inputs views of (n_rows, dim) floats, stream k at k * stride
// floats from the first. The router's weights (f32): norm (dim), router
// (n_inputs, dim); the routing of a row is m = tanh(router (rms_norm(x) norm) / dim).
struct AltupArgs {
  uint32_t n_rows = 0, dim = 0, n_inputs = 0, active = 0, stride = 0;
  float eps = 1e-6f;
  BufferView norm, router;
};

// pred_k = X_k + Σ_j C[k, j] X_j with C = coefs (n_inputs², n_inputs) applied to
// the routing of X_active; act = pred_active.
void altup_predict(gpu::Device& device, gpu::ComputeEncoder& enc, const AltupArgs& a, const BufferView& X,
                   const BufferView& coefs, const BufferView& pred, const BufferView& act);

// X_k = pred_k + (coefs m + 1)_k (act - pred_active), m the routing of act
// (coefs (n_inputs, n_inputs)); first = X_active * scale (dim).
void altup_correct(gpu::Device& device, gpu::ComputeEncoder& enc, const AltupArgs& a, const BufferView& pred,
                   const BufferView& act, const BufferView& coefs, const BufferView& scale, const BufferView& X,
                   const BufferView& first);

// For each of y's count streams (stride floats apart) and each row:
// y *= sqrt(mean(ref²)) / sqrt(max(mean(y²), floor)).
void altup_magnitude(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& ref, const BufferView& y,
                     uint32_t n_rows, uint32_t dim, uint32_t count, uint32_t stride, float floor = 1e-5f);

// out = (first + Σ_k others_k) / (1 + count) over n elements; others' streams
// stride floats apart.
void altup_mean(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& first, const BufferView& others,
                const BufferView& out, uint32_t n, uint32_t count, uint32_t stride);

// x = max(x - (mean + std * std_mul), 0) per row, std the population one.
void gaussian_topk(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& x, uint32_t n_rows,
                   uint32_t dim, float std_mul);

// g = gelu_tanh(g) * inputs, g (n_rows, dim), inputs' row r at r * in_stride floats.
void per_layer_gate(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& g, const BufferView& inputs,
                    uint32_t n_rows, uint32_t dim, uint32_t in_stride);

std::vector<std::string> altup_kernel_names();

}  // namespace mkv::ops
