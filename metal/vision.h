// The bodies of the vision towers' kernels (vision.metal instantiates them):
// LayerNorm with a bias (SigLIP's), the non-gated tanh GELU, an image's
// patches as gemm rows, and average pooling of a patch grid. Activations are float.
// (Templates over T = float only because MKV_KERNEL instantiates templates.)
#pragma once

#include "mkv_kernel.h"
#include "activation.h"
#include "elementwise.h"  // MKV_FOR_EACH_ELEMENT
#include "group_sum.h"
#include "linear_params.h"
#include "vision_params.h"

// Two passes over the row, the mean first: the variance of (x - mean), as
// torch's LayerNorm, without the cancellation of E[x²] - E[x]².
template <typename T>
MKV_MAX_THREADS(mkv_params::kRowSimds * 32) kernel void layer_norm(
    constant mkv_params::LayerNorm& p [[buffer(0)]],
    const device T* x [[buffer(1)]],  // (n_rows, dim)
    const device T* w [[buffer(2)]],  // (dim)
    const device T* b [[buffer(3)]],  // (dim)
    device T* out [[buffer(4)]],      // (n_rows, dim); may be x
    uint r [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
    uint nt [[threads_per_threadgroup]], uint simd [[simdgroup_index_in_threadgroup]],
    uint simds [[simdgroups_per_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
  threadgroup float partial[mkv_params::kRowSimds];
  const device T* xr = x + ulong(r) * p.dim;
  device T* o = out + ulong(r) * p.dim;
  float s = 0.0f;
  for (uint j = tid; j < p.dim; j += nt) s += xr[j];
  const float mean = group_sum(s, partial, simd, lane, simds) / float(p.dim);
  float ss = 0.0f;
  for (uint j = tid; j < p.dim; j += nt) ss += (xr[j] - mean) * (xr[j] - mean);
  const float inv = 1.0f / sqrt(group_sum(ss, partial, simd, lane, simds) / float(p.dim) + p.eps);
  for (uint j = tid; j < p.dim; j += nt) o[j] = (xr[j] - mean) * inv * w[j] + b[j];
}

// y[i] = gelu_pytorch_tanh(y[i]) (activation.h), in place.
template <typename T>
MKV_MAX_THREADS(mkv_params::kElementThreads) kernel void gelu(constant mkv_params::Elementwise& p [[buffer(0)]],
                                                              device T* y [[buffer(1)]],  // (n)
                                                              uint tg [[threadgroup_position_in_grid]],
                                                              uint tid [[thread_index_in_threadgroup]],
                                                              uint nt [[threads_per_threadgroup]]) {
  MKV_FOR_EACH_ELEMENT(i) y[i] = ActGeluTanh::apply(y[i]);
}

// A copy: each output element reads its pixel (or is a padding zero).
template <typename T>
MKV_MAX_THREADS(mkv_params::kElementThreads) kernel void image_patches(
    constant mkv_params::ImagePatches& p [[buffer(0)]],
    const device T* x [[buffer(1)]],  // (n_images, channels, grid patch, grid patch)
    device T* out [[buffer(2)]],      // (n_images, grid², patch_dim)
    uint tg [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
    uint nt [[threads_per_threadgroup]]) {
  const uint i = tg * nt + tid;
  const uint cells = p.grid * p.grid;
  if (i >= p.n_images * cells * p.patch_dim) return;
  const uint col = i % p.patch_dim, row = i / p.patch_dim;
  const uint image = row / cells, cell = row % cells, area = p.patch * p.patch;
  if (col >= p.channels * area) {
    out[i] = T(0);
    return;
  }
  const uint c = col / area, py = col % area / p.patch, px = col % p.patch, side = p.grid * p.patch;
  const uint y = cell / p.grid * p.patch + py, xx = cell % p.grid * p.patch + px;
  out[i] = x[(ulong(image * p.channels + c) * side + y) * side + xx];
}

// Summed in row-major order over the window, then divided by k², as torch's AvgPool2d.
template <typename T>
MKV_MAX_THREADS(mkv_params::kElementThreads) kernel void avg_pool(constant mkv_params::AvgPool& p [[buffer(0)]],
                                                                  const device T* x [[buffer(1)]],
                                                                  device T* out [[buffer(2)]],
                                                                  uint tg [[threadgroup_position_in_grid]],
                                                                  uint tid [[thread_index_in_threadgroup]],
                                                                  uint nt [[threads_per_threadgroup]]) {
  const uint out_side = p.side / p.k;
  const uint per_image = out_side * out_side * p.channels;
  const uint i = tg * nt + tid;
  if (i >= p.n_images * per_image) return;
  const uint image = i / per_image, c = i % p.channels, cell = (i % per_image) / p.channels;
  const uint oy = cell / out_side, ox = cell % out_side;
  const device T* base = x + ulong(image) * p.side * p.side * p.channels;
  float s = 0.0f;
  for (uint ky = 0; ky < p.k; ++ky)
    for (uint kx = 0; kx < p.k; ++kx) s += base[(ulong(oy * p.k + ky) * p.side + ox * p.k + kx) * p.channels + c];
  out[i] = s / float(p.k * p.k);
}

// Summed over the window in row-major tap order.
template <typename T>
MKV_MAX_THREADS(mkv_params::kElementThreads) kernel void depthwise_conv2d(
    constant mkv_params::DepthwiseConv2d& p [[buffer(0)]],
    const device T* x [[buffer(1)]],  // (h_in, w_in, channels)
    const device T* w [[buffer(2)]],  // (k k, channels)
    device T* out [[buffer(3)]],      // (h_out, w_out, channels)
    uint tg [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
    uint nt [[threads_per_threadgroup]]) {
  const ulong i = ulong(tg) * nt + tid;
  if (i >= ulong(p.h_out) * p.w_out * p.channels) return;
  const uint c = uint(i % p.channels), cell = uint(i / p.channels);
  const int y0 = int(cell / p.w_out * p.stride) - int(p.pad_top);
  const int x0 = int(cell % p.w_out * p.stride) - int(p.pad_left);
  float s = 0.0f;
  for (uint ky = 0; ky < p.k; ++ky) {
    const int y = y0 + int(ky);
    if (y < 0 || y >= int(p.h_in)) continue;
    for (uint kx = 0; kx < p.k; ++kx) {
      const int xx = x0 + int(kx);
      if (xx >= 0 && xx < int(p.w_in))
        s += w[ulong(ky * p.k + kx) * p.channels + c] * x[(ulong(y) * p.w_in + uint(xx)) * p.channels + c];
    }
  }
  out[i] = s;
}

template <typename T>
MKV_MAX_THREADS(mkv_params::kElementThreads) kernel void layer_scale(
    constant mkv_params::LayerScale& p [[buffer(0)]],
    const device T* x [[buffer(1)]],  // (n / channels, channels)
    const device T* g [[buffer(2)]],  // (channels)
    device T* y [[buffer(3)]],        // (n / channels, channels)
    uint tg [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
    uint nt [[threads_per_threadgroup]]) {
  const uint i = tg * nt + tid;
  if (i >= p.n) return;
  const float v = g[i % p.channels] * x[i];
  y[i] = p.accumulate ? y[i] + v : v;
}
