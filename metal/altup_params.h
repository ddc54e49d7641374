// Argument structs of Gemma 3n's per-row kernels (altup.metal), shared by the
// kernels (MSL) and the C++ ops that bind them (cpp/ops/altup.cpp).
#pragma once

#include "shared_params.h"

namespace mkv_params {

MKV_CONSTANT uint32_t kAltupMaxInputs = 8;  // streams a predict / correct row holds in registers

// altup_predict_f32, altup_correct_f32: one threadgroup (kRowSimds SIMD-groups) per row.
// Streams are (n_inputs, stride) floats apart: stream k's row r at k * stride + r * dim.
struct Altup {
  uint32_t n_rows;
  uint32_t dim;
  uint32_t n_inputs;
  uint32_t active;  // the stream the layer computes on (altup_active_idx)
  uint32_t stride;  // floats from one stream to the next
  float eps;        // the router norm's
};

// altup_magnitude_f32: grid (n_rows, count).
struct AltupMagnitude {
  uint32_t n_rows;
  uint32_t dim;
  uint32_t stride;  // floats from one of y's streams to the next
  float floor;      // the mean square's floor before its square root (transformers: 1e-5)
};

// altup_mean_f32: out = (first + Σ_k others_k) / (1 + count), elementwise.
struct AltupMean {
  uint32_t n;       // elements of a stream's rows
  uint32_t count;   // others
  uint32_t stride;  // floats from one of the others to the next
};

// gaussian_topk_f32: one threadgroup per row, in place.
struct GaussianTopk {
  uint32_t n_rows;
  uint32_t dim;
  float std_mul;  // cutoff = mean + std * std_mul
};

// per_layer_gate_f32: g[r, j] = gelu_tanh(g[r, j]) * inputs[r * in_stride + j], elementwise.
struct PerLayerGate {
  uint32_t n_rows;
  uint32_t dim;
  uint32_t in_stride;  // floats from one row of inputs to the next
};

}  // namespace mkv_params
