// Host side of metal/vision.metal: validate, bind, dispatch.
#include "ops/vision.h"

#include <cmath>

#include "metal/linear_params.h"
#include "metal/vision_params.h"
#include "ops/launch.h"

namespace mkv::ops {

void layer_norm(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& x, const BufferView& w,
                const BufferView& b, const BufferView& out, uint32_t n_rows, uint32_t dim, float eps) {
  const char* op = "layer_norm";
  check_positive(op, "n_rows", n_rows);
  check_positive(op, "dim", dim);
  if (!(eps >= 0.0f)) fail(op, "eps must be >= 0, got " + std::to_string(eps));
  check_view(op, "x (n_rows, dim) float32", x, size_t(n_rows) * dim * 4, 4);
  check_view(op, "w (dim) float32", w, size_t(dim) * 4, 4);
  check_view(op, "b (dim) float32", b, size_t(dim) * 4, 4);
  check_view(op, "out (n_rows, dim) float32", out, size_t(n_rows) * dim * 4, 4);
  enc.set_pipeline(device.pipeline("layer_norm_f32"));
  bind_params(enc, mkv_params::LayerNorm{n_rows, dim, eps}, 0);
  bind(enc, x, 1);
  bind(enc, w, 2);
  bind(enc, b, 3);
  bind(enc, out, 4);
  enc.dispatch_threadgroups({n_rows, 1, 1}, {row_threads(device), 1, 1});
}

void gelu(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& y, uint64_t n) {
  const char* op = "gelu";
  check_positive(op, "n", n);
  if (n >= (uint64_t(1) << 32)) fail(op, "n must be below 2^32");
  check_view(op, "y (n) float32", y, n * 4, 4);
  enc.set_pipeline(device.pipeline("gelu_f32"));
  bind_params(enc, mkv_params::Elementwise{uint32_t(n), 0.0f}, 0);
  bind(enc, y, 1);
  dispatch_elements(enc, n);
}

void image_patches(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& x, const BufferView& out,
                   const mkv_params::ImagePatches& p) {
  const char* op = "image_patches";
  for (auto [name, v] : {std::pair{"n_images", p.n_images}, {"channels", p.channels}, {"grid", p.grid},
                         {"patch", p.patch}, {"patch_dim", p.patch_dim}})
    check_positive(op, name, v);
  const uint64_t area = uint64_t(p.patch) * p.patch, side = uint64_t(p.grid) * p.patch;
  if (p.patch_dim < p.channels * area)
    fail(op, "patch_dim " + std::to_string(p.patch_dim) + " is less than channels x patch² (" +
                 std::to_string(p.channels * area) + ")");
  const uint64_t n_in = uint64_t(p.n_images) * p.channels * side * side;
  const uint64_t n_out = uint64_t(p.n_images) * p.grid * p.grid * p.patch_dim;
  gather_floats(device, enc, op, "image_patches_f32", p, x,
                "x (n_images, channels, grid patch, grid patch) float32", n_in, out,
                "out (n_images, grid², patch_dim) float32", n_out);
}

void avg_pool(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& x, const BufferView& out,
              uint32_t n_images, uint32_t side, uint32_t k, uint32_t channels) {
  const char* op = "avg_pool";
  check_positive(op, "n_images", n_images);
  check_positive(op, "side", side);
  check_positive(op, "k", k);
  check_positive(op, "channels", channels);
  if (side % k != 0) fail(op, "k " + std::to_string(k) + " does not divide the side " + std::to_string(side));
  const uint64_t n_in = uint64_t(n_images) * side * side * channels, n_out = n_in / (uint64_t(k) * k);
  if (n_in >= (uint64_t(1) << 32)) fail(op, "the images hold 2^32 floats or more");
  check_view(op, "x (n_images, side, side, channels) float32", x, n_in * 4, 4);
  check_view(op, "out (n_images, side / k, side / k, channels) float32", out, n_out * 4, 4);
  if (overlaps(x, n_in * 4, out, n_out * 4)) fail(op, "out must not overlap x");
  enc.set_pipeline(device.pipeline("avg_pool_f32"));
  bind_params(enc, mkv_params::AvgPool{n_images, side, k, channels}, 0);
  bind(enc, x, 1);
  bind(enc, out, 2);
  const uint32_t threads = mkv_params::kElementThreads;
  enc.dispatch_threadgroups({uint32_t((n_out + threads - 1) / threads), 1, 1}, {threads, 1, 1});
}

void depthwise_conv2d(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& x, const BufferView& w,
                      const BufferView& out, const mkv_params::DepthwiseConv2d& p) {
  const char* op = "depthwise_conv2d";
  for (auto [name, v] : {std::pair{"h_in", p.h_in}, {"w_in", p.w_in}, {"channels", p.channels}, {"k", p.k},
                         {"stride", p.stride}, {"h_out", p.h_out}, {"w_out", p.w_out}})
    check_positive(op, name, v);
  if (p.pad_top >= p.k || p.pad_left >= p.k) fail(op, "the padding before must be narrower than k");
  const uint64_t n_in = uint64_t(p.h_in) * p.w_in * p.channels, n_out = uint64_t(p.h_out) * p.w_out * p.channels;
  below_2_32(op, "x", n_in);
  below_2_32(op, "out", n_out);
  check_view(op, "x (h_in, w_in, channels) float32", x, n_in * 4, 4);
  check_view(op, "w (k k, channels) float32", w, uint64_t(p.k) * p.k * p.channels * 4, 4);
  check_view(op, "out (h_out, w_out, channels) float32", out, n_out * 4, 4);
  if (overlaps(x, n_in * 4, out, n_out * 4)) fail(op, "out must not overlap x");
  enc.set_pipeline(device.pipeline("depthwise_conv2d_f32"));
  bind_params(enc, p, 0);
  bind(enc, x, 1);
  bind(enc, w, 2);
  bind(enc, out, 3);
  dispatch_threads(enc, n_out);
}

void layer_scale(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& x, const BufferView& g,
                 const BufferView& y, uint32_t n_rows, uint32_t channels, bool accumulate) {
  const char* op = "layer_scale";
  check_positive(op, "n_rows", n_rows);
  check_positive(op, "channels", channels);
  const uint64_t n = uint64_t(n_rows) * channels;
  below_2_32(op, "x", n);
  check_view(op, "x (n_rows, channels) float32", x, n * 4, 4);
  check_view(op, "g (channels) float32", g, uint64_t(channels) * 4, 4);
  check_view(op, "y (n_rows, channels) float32", y, n * 4, 4);
  if (overlaps(x, n * 4, y, n * 4)) fail(op, "y must not overlap x");
  enc.set_pipeline(device.pipeline("layer_scale_f32"));
  bind_params(enc, mkv_params::LayerScale{uint32_t(n), channels, accumulate ? 1u : 0u}, 0);
  bind(enc, x, 1);
  bind(enc, g, 2);
  bind(enc, y, 3);
  dispatch_threads(enc, n);
}

std::vector<std::string> vision_kernel_names() {
  return {"layer_norm_f32", "gelu_f32", "image_patches_f32", "avg_pool_f32", "depthwise_conv2d_f32", "layer_scale_f32"};
}

}  // namespace mkv::ops
