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

// image_patches_f32 (SigLIP's stride-patch convolution as a gemm's rows):
// images (n_images, channels, grid patch, grid patch) to (n_images, grid²,
// patch_dim): row gy grid + gx holds its patch's (channel, y, x) values, then
// zeros up to patch_dim. One thread per output element.
struct ImagePatches {
  uint32_t n_images;
  uint32_t channels;
  uint32_t grid;
  uint32_t patch;
  uint32_t patch_dim;
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

// depthwise_conv2d_f32 (Gemma 3n's MobileNet-V5): a (h_in, w_in, channels)
// image, channels last, through a k x k depthwise convolution of `stride`,
// zeros before the first row and column (pad_top, pad_left) and after the last
// as far as the output reads: out (h_out, w_out, channels), w (k k, channels),
// tap ky k + kx. One thread per output element.
struct DepthwiseConv2d {
  uint32_t h_in, w_in, channels;
  uint32_t k, stride;
  uint32_t pad_top, pad_left;
  uint32_t h_out, w_out;
};

// layer_scale_f32: y[r, c] = g[c] x[r, c], plus y[r, c] when accumulate (a
// residual block's layer scale and skip); n = rows x channels elements.
struct LayerScale {
  uint32_t n;
  uint32_t channels;
  uint32_t accumulate;
};

}  // namespace mkv_params
