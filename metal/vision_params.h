// Argument structs of the vision towers' kernels (vision.metal), shared by the
// kernels (MSL) and the C++ ops that bind them (cpp/ops/vision.cpp).
#pragma once

#include "shared_params.h"

namespace mkv_params {

// layer_norm_f32: out[r, :] = (x[r, :] - mean) / sqrt(var + eps) * w + b, the
// mean and the (biased) variance of row r; one threadgroup per row.
struct LayerNorm {
  uint32_t n_rows;
  uint32_t dim;
  float eps;
};

// avg_pool_f32: images of (side, side, channels) floats, channels last, to
// (side / k, side / k, channels): each output the mean of its k x k inputs.
// One thread per output element.
struct AvgPool {
  uint32_t n_images;
  uint32_t side;
  uint32_t k;
  uint32_t channels;
};

}  // namespace mkv_params
