// The vision towers' small kernels (metal/vision.metal): LayerNorm with a bias,
// the non-gated tanh GELU and average pooling of a patch grid. Activations are
// float32; every function validates, then encodes one dispatch, and raises
// GpuError "[op] ..." on bad input.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/linear.h"

namespace mkv::ops {

// out[r, :] = (x[r, :] - mean) / sqrt(var + eps) * w + b for r < n_rows, the
// row's mean and biased variance (torch's LayerNorm). x, out (n_rows, dim)
// float32 (out may be x); w, b (dim) float32.
void layer_norm(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& x, const BufferView& w,
                const BufferView& b, const BufferView& out, uint32_t n_rows, uint32_t dim, float eps);

// y[i] = gelu_pytorch_tanh(y[i]) for i < n, in place (the MLP of SigLIP).
void gelu(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& y, uint64_t n);

// out = average pooling of n_images grids (side, side, channels), channels
// last, over k x k windows with stride k: (n_images, side / k, side / k,
// channels), rows in the pooled grid's row-major order. k divides side.
void avg_pool(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& x, const BufferView& out,
              uint32_t n_images, uint32_t side, uint32_t k, uint32_t channels);

std::vector<std::string> vision_kernel_names();

}  // namespace mkv::ops
