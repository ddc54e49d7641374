// Host side of metal/altup.metal: validate, bind, dispatch.
#include "ops/altup.h"

#include <cmath>

#include "metal/altup_params.h"
#include "metal/linear_params.h"
#include "ops/launch.h"

namespace mkv::ops {
namespace {

constexpr const char* kKernels[] = {"altup_predict_f32", "altup_correct_f32", "altup_magnitude_f32",
                                    "altup_mean_f32",    "gaussian_topk_f32", "per_layer_gate_f32"};

// The streams' layout: n_inputs (or count) views of (n_rows, dim), stride floats apart.
void check_streams(const char* op, const char* what, const BufferView& v, uint32_t count, uint32_t stride,
                   uint32_t n_rows, uint32_t dim) {
  if (count > 1 && uint64_t(stride) < uint64_t(n_rows) * dim)
    fail(op, std::string(what) + ": a stride of " + std::to_string(stride) + " floats overlaps the streams' " +
                 std::to_string(uint64_t(n_rows) * dim));
  check_view(op, what, v, (uint64_t(count - 1) * stride + uint64_t(n_rows) * dim) * 4, 4);
}

mkv_params::Altup check_altup(const char* op, const AltupArgs& a) {
  check_positive(op, "n_rows", a.n_rows);
  check_positive(op, "dim", a.dim);
  if (a.n_inputs < 2 || a.n_inputs > mkv_params::kAltupMaxInputs)
    fail(op, "n_inputs must be 2.." + std::to_string(mkv_params::kAltupMaxInputs) + ", got " +
                 std::to_string(a.n_inputs));
  if (a.active >= a.n_inputs) fail(op, "active stream " + std::to_string(a.active) + " of " + std::to_string(a.n_inputs));
  if (!(a.eps >= 0.0f)) fail(op, "eps must be >= 0");
  check_view(op, "norm (dim) f32", a.norm, size_t(a.dim) * 4, 4);
  check_view(op, "router (n_inputs, dim) f32", a.router, size_t(a.n_inputs) * a.dim * 4, 4);
  return {a.n_rows, a.dim, a.n_inputs, a.active, a.stride, a.eps};
}

}  // namespace

void altup_predict(gpu::Device& device, gpu::ComputeEncoder& enc, const AltupArgs& a, const BufferView& X,
                   const BufferView& coefs, const BufferView& pred, const BufferView& act) {
  const char* op = "altup_predict";
  const mkv_params::Altup p = check_altup(op, a);
  check_streams(op, "X (n_inputs, n_rows, dim) float32", X, a.n_inputs, a.stride, a.n_rows, a.dim);
  check_streams(op, "pred (n_inputs, n_rows, dim) float32", pred, a.n_inputs, a.stride, a.n_rows, a.dim);
  check_view(op, "coefs (n_inputs², n_inputs) f32", coefs, size_t(a.n_inputs) * a.n_inputs * a.n_inputs * 4, 4);
  check_view(op, "act (n_rows, dim) float32", act, size_t(a.n_rows) * a.dim * 4, 4);
  enc.set_pipeline(device.pipeline("altup_predict_f32"));
  bind_params(enc, p, 0);
  bind(enc, X, 1);
  bind(enc, a.norm, 2);
  bind(enc, a.router, 3);
  bind(enc, coefs, 4);
  bind(enc, pred, 5);
  bind(enc, act, 6);
  enc.dispatch_threadgroups({a.n_rows, 1, 1}, {row_threads(device), 1, 1});
}

void altup_correct(gpu::Device& device, gpu::ComputeEncoder& enc, const AltupArgs& a, const BufferView& pred,
                   const BufferView& act, const BufferView& coefs, const BufferView& scale, const BufferView& X,
                   const BufferView& first) {
  const char* op = "altup_correct";
  const mkv_params::Altup p = check_altup(op, a);
  check_streams(op, "pred (n_inputs, n_rows, dim) float32", pred, a.n_inputs, a.stride, a.n_rows, a.dim);
  check_streams(op, "X (n_inputs, n_rows, dim) float32", X, a.n_inputs, a.stride, a.n_rows, a.dim);
  check_view(op, "act (n_rows, dim) float32", act, size_t(a.n_rows) * a.dim * 4, 4);
  check_view(op, "coefs (n_inputs, n_inputs) f32", coefs, size_t(a.n_inputs) * a.n_inputs * 4, 4);
  check_view(op, "scale (dim) f32", scale, size_t(a.dim) * 4, 4);
  check_view(op, "first (n_rows, dim) float32", first, size_t(a.n_rows) * a.dim * 4, 4);
  enc.set_pipeline(device.pipeline("altup_correct_f32"));
  bind_params(enc, p, 0);
  bind(enc, pred, 1);
  bind(enc, act, 2);
  bind(enc, a.norm, 3);
  bind(enc, a.router, 4);
  bind(enc, coefs, 5);
  bind(enc, scale, 6);
  bind(enc, X, 7);
  bind(enc, first, 8);
  enc.dispatch_threadgroups({a.n_rows, 1, 1}, {row_threads(device), 1, 1});
}

void altup_magnitude(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& ref, const BufferView& y,
                     uint32_t n_rows, uint32_t dim, uint32_t count, uint32_t stride, float floor) {
  const char* op = "altup_magnitude";
  check_positive(op, "n_rows", n_rows);
  check_positive(op, "dim", dim);
  check_positive(op, "count", count);
  if (!(floor > 0.0f)) fail(op, "floor must be > 0");
  check_view(op, "ref (n_rows, dim) float32", ref, size_t(n_rows) * dim * 4, 4);
  check_streams(op, "y (count, n_rows, dim) float32", y, count, stride, n_rows, dim);
  enc.set_pipeline(device.pipeline("altup_magnitude_f32"));
  bind_params(enc, mkv_params::AltupMagnitude{n_rows, dim, stride, floor}, 0);
  bind(enc, ref, 1);
  bind(enc, y, 2);
  enc.dispatch_threadgroups({n_rows, count, 1}, {row_threads(device), 1, 1});
}

void altup_mean(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& first, const BufferView& others,
                const BufferView& out, uint32_t n, uint32_t count, uint32_t stride) {
  const char* op = "altup_mean";
  check_positive(op, "n", n);
  check_view(op, "first (n) float32", first, size_t(n) * 4, 4);
  check_streams(op, "others (count, n) float32", others, count ? count : 1, stride, 1, n);
  check_view(op, "out (n) float32", out, size_t(n) * 4, 4);
  enc.set_pipeline(device.pipeline("altup_mean_f32"));
  bind_params(enc, mkv_params::AltupMean{n, count, stride}, 0);
  bind(enc, first, 1);
  bind(enc, others, 2);
  bind(enc, out, 3);
  dispatch_elements(enc, n);
}

void gaussian_topk(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& x, uint32_t n_rows,
                   uint32_t dim, float std_mul) {
  const char* op = "gaussian_topk";
  check_positive(op, "n_rows", n_rows);
  check_positive(op, "dim", dim);
  if (!std::isfinite(std_mul)) fail(op, "std_mul must be finite");
  check_view(op, "x (n_rows, dim) float32", x, size_t(n_rows) * dim * 4, 4);
  enc.set_pipeline(device.pipeline("gaussian_topk_f32"));
  bind_params(enc, mkv_params::GaussianTopk{n_rows, dim, std_mul}, 0);
  bind(enc, x, 1);
  enc.dispatch_threadgroups({n_rows, 1, 1}, {row_threads(device), 1, 1});
}

void per_layer_gate(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& g, const BufferView& inputs,
                    uint32_t n_rows, uint32_t dim, uint32_t in_stride) {
  const char* op = "per_layer_gate";
  check_positive(op, "n_rows", n_rows);
  check_positive(op, "dim", dim);
  if (in_stride < dim) fail(op, "in_stride " + std::to_string(in_stride) + " is below dim " + std::to_string(dim));
  check_view(op, "g (n_rows, dim) float32", g, size_t(n_rows) * dim * 4, 4);
  check_view(op, "inputs (n_rows rows of in_stride) float32", inputs,
             (size_t(n_rows - 1) * in_stride + dim) * 4, 4);
  enc.set_pipeline(device.pipeline("per_layer_gate_f32"));
  bind_params(enc, mkv_params::PerLayerGate{n_rows, dim, in_stride}, 0);
  bind(enc, g, 1);
  bind(enc, inputs, 2);
  dispatch_elements(enc, uint64_t(n_rows) * dim);
}

std::vector<std::string> altup_kernel_names() { return {std::begin(kKernels), std::end(kKernels)}; }

}  // namespace mkv::ops
