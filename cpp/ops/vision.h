// The vision towers' small kernels (metal/vision.metal): LayerNorm with a bias,
// the non-gated tanh GELU, an image's patches as gemm rows, average pooling of
// a patch grid, and MobileNet-V5's depthwise 2-D convolution and layer scale.
// Activations are float32; every function validates, then encodes one dispatch, and raises
// GpuError "[op] ..." on bad input.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "metal/vision_params.h"
#include "ops/linear.h"

namespace mkv::ops {

// out[r, :] = (x[r, :] - mean) / sqrt(var + eps) * w + b for r < n_rows, the
// row's mean and biased variance (torch's LayerNorm). x, out (n_rows, dim)
// float32 (out may be x); w, b (dim) float32.
void layer_norm(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& x, const BufferView& w,
                const BufferView& b, const BufferView& out, uint32_t n_rows, uint32_t dim, float eps);

// y[i] = gelu_pytorch_tanh(y[i]) for i < n, in place (the MLP of SigLIP).
void gelu(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& y, uint64_t n);

// out = the patches of n_images images (channels, grid patch, grid patch)
// as gemm rows (metal/vision_params.h ImagePatches): (n_images, grid²,
// patch_dim) float32, each row its patch's (channel, y, x) values, then zeros.
// out must not overlap x.
void image_patches(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& x, const BufferView& out,
                   const mkv_params::ImagePatches& p);

// out = average pooling of n_images grids (side, side, channels), channels
// last, over k x k windows with stride k: (n_images, side / k, side / k,
// channels), rows in the pooled grid's row-major order. k divides side.
void avg_pool(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& x, const BufferView& out,
              uint32_t n_images, uint32_t side, uint32_t k, uint32_t channels);

// out = x (h_in, w_in, channels) through a k x k depthwise convolution (metal/
// vision_params.h DepthwiseConv2d): w (k k, channels) float32, out (h_out,
// w_out, channels). out must not overlap x.
void depthwise_conv2d(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& x, const BufferView& w,
                      const BufferView& out, const mkv_params::DepthwiseConv2d& p);

// y[r, c] = g[c] x[r, c] (+ y[r, c] when accumulate) for r < n_rows: x, y
// (n_rows, channels), g (channels) float32; y must not overlap x.
void layer_scale(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& x, const BufferView& g,
                 const BufferView& y, uint32_t n_rows, uint32_t channels, bool accumulate);

std::vector<std::string> vision_kernel_names();

}  // namespace mkv::ops
