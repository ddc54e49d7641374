// Host side of metal/elementwise.metal: validate, bind, dispatch.
#include "ops/elementwise.h"

#include <algorithm>
#include <cmath>

#include "metal/linear_params.h"
#include "ops/launch.h"

namespace mkv::ops {
namespace {

// Kernel names: the one builder of each (elementwise_kernel_names lists them).
std::string embedding_kernel(WeightType t) { return std::string("embedding_") + weight_type_name(t); }
// host: the host executor's shape (metal/elementwise_host.metal), a lane a row.
std::string rms_norm_kernel(WeightType t, bool host = false) {
  return std::string("rms_norm_") + weight_type_name(t) + (host ? "_h" : "");
}
std::string f32_kernel(const char* op) { return std::string(op) + "_f32"; }  // add_f32, swiglu_f32, ...
constexpr const char* kF32Ops[] = {"add", "scale", "softcap", "swiglu", "geglu", "argmax", "softmax"};


void gated(const char* op, gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& gate,
           const BufferView& up, const BufferView& out, uint32_t n) {
  check_positive(op, "n", n);
  check_view(op, "gate (n) float32", gate, size_t(n) * 4, 4);
  check_view(op, "up (n) float32", up, size_t(n) * 4, 4);
  check_view(op, "out (n) float32", out, size_t(n) * 4, 4);
  enc.set_pipeline(device.pipeline(f32_kernel(op)));
  bind_params(enc, mkv_params::Elementwise{n, 1.0f}, 0);
  bind(enc, gate, 1);
  bind(enc, up, 2);
  bind(enc, out, 3);
  dispatch_elements(enc, n);
}

}  // namespace

void embedding(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& table,
               WeightType ttype, const BufferView& ids, const BufferView& out, uint32_t n_tokens,
               uint32_t dim, uint32_t vocab, float scale) {
  const char* op = "embedding";
  check_positive(op, "n_tokens", n_tokens);
  check_positive(op, "vocab", vocab);
  const size_t table_bytes = weight_bytes(ttype, vocab, dim, op);
  check_view(op, ("table (vocab, dim) " + std::string(weight_type_name(ttype))).c_str(), table,
             table_bytes, weight_align(ttype));
  check_view(op, "ids (n_tokens) int32", ids, size_t(n_tokens) * 4, 4);
  check_view(op, "out (n_tokens, dim) float32", out, size_t(n_tokens) * dim * 4, 16);
  enc.set_pipeline(device.pipeline(embedding_kernel(ttype)));
  bind_params(enc, mkv_params::Embedding{n_tokens, dim, vocab, scale}, 0);
  bind(enc, table, 1);
  bind(enc, ids, 2);
  bind(enc, out, 3);
  enc.dispatch_threadgroups({n_tokens, 1, 1}, {mkv_params::kEmbeddingThreads, 1, 1});
}

void rms_norm(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& x,
              const BufferView& w, WeightType wtype, const BufferView& out, uint32_t n_rows,
              uint32_t dim, float eps, float w_offset) {
  const char* op = "rms_norm";
  check_positive(op, "n_rows", n_rows);
  check_positive(op, "dim", dim);
  if (wtype != WeightType::f32 && wtype != WeightType::f16)
    fail(op, std::string("weight type must be 'f32' or 'f16', got '") + weight_type_name(wtype) + "'");
  if (!(eps >= 0.0f)) fail(op, "eps must be >= 0, got " + std::to_string(eps));
  const size_t w_size = wtype == WeightType::f32 ? 4 : 2;
  check_view(op, "x (n_rows, dim) float32", x, size_t(n_rows) * dim * 4, 4);
  check_view(op, "w (dim)", w, size_t(dim) * w_size, w_size);
  check_view(op, "out (n_rows, dim) float32", out, size_t(n_rows) * dim * 4, 4);
  // One threadgroup a row. GPUs: enough SIMD-groups that each lane has about
  // kRmsNormLaneElems elements (a row is latency-bound otherwise); fiber lanes
  // (the host executor), where each collective is a rendezvous: one, and where
  // the device has its shapes, that one SIMD-group's arithmetic a lane a row
  // (the same bits, no rendezvous).
  const bool host = picks_host_shapes(device.properties());
  const uint32_t simds = device.properties().lanes_are_fibers
                             ? 1u
                             : std::clamp(dim / (32 * mkv_params::kRmsNormLaneElems), 1u, mkv_params::kRmsNormSimds);
  // The register path: whole float4s, 16-byte aligned rows and weights, and a
  // row that fits the threads' registers (else the strided scalar loops).
  const bool vec = dim % 4 == 0 && x.offset % 16 == 0 && out.offset % 16 == 0 && w.offset % (4 * w_size) == 0 &&
                   dim <= 4 * mkv_params::kRmsNormVec * 32 * simds;
  enc.set_pipeline(device.pipeline(rms_norm_kernel(wtype, host)));
  bind_params(enc, mkv_params::RmsNorm{n_rows, dim, eps, w_offset, vec ? mkv_params::kRmsNormVec4 : 0u}, 0);
  bind(enc, x, 1);
  bind(enc, w, 2);
  bind(enc, out, 3);
  if (host)
    enc.dispatch_threadgroups({ceil_div(n_rows, 32), 1, 1}, {32, 1, 1});
  else
    enc.dispatch_threadgroups({n_rows, 1, 1}, {32 * simds, 1, 1});
}

void add(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& y, const BufferView& x,
         uint32_t n) {
  const char* op = "add";
  check_positive(op, "n", n);
  check_view(op, "y (n) float32", y, size_t(n) * 4, 4);
  check_view(op, "x (n) float32", x, size_t(n) * 4, 4);
  enc.set_pipeline(device.pipeline(f32_kernel(op)));
  bind_params(enc, mkv_params::Elementwise{n, 1.0f}, 0);
  bind(enc, y, 1);
  bind(enc, x, 2);
  dispatch_elements(enc, n);
}

void scale(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& y, uint32_t n,
           float s) {
  const char* op = "scale";
  check_positive(op, "n", n);
  check_view(op, "y (n) float32", y, size_t(n) * 4, 4);
  enc.set_pipeline(device.pipeline(f32_kernel(op)));
  bind_params(enc, mkv_params::Elementwise{n, s}, 0);
  bind(enc, y, 1);
  dispatch_elements(enc, n);
}

void softcap(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& y, uint32_t n,
             float cap) {
  const char* op = "softcap";
  check_positive(op, "n", n);
  check_view(op, "y (n) float32", y, size_t(n) * 4, 4);
  if (!(cap > 0.0f) || !std::isfinite(cap)) fail(op, "cap must be a positive finite number, got " + std::to_string(cap));
  enc.set_pipeline(device.pipeline(f32_kernel(op)));
  bind_params(enc, mkv_params::Elementwise{n, cap}, 0);
  bind(enc, y, 1);
  dispatch_elements(enc, n);
}

void swiglu(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& gate,
            const BufferView& up, const BufferView& out, uint32_t n) {
  gated("swiglu", device, enc, gate, up, out, n);
}

void geglu(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& gate,
           const BufferView& up, const BufferView& out, uint32_t n) {
  gated("geglu", device, enc, gate, up, out, n);
}

void argmax(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& x,
            const BufferView& out, uint32_t n_rows, uint32_t n, const BufferView& mask) {
  const char* op = "argmax";
  check_positive(op, "n_rows", n_rows);
  check_positive(op, "n", n);
  if (n > uint32_t(INT32_MAX)) fail(op, "n must fit an int32 index");
  check_view(op, "x (n_rows, n) float32", x, size_t(n_rows) * n * 4, 4);
  check_view(op, "out (n_rows) int32", out, size_t(n_rows) * 4, 4);
  const gpu::PipelinePtr pipeline = device.pipeline(f32_kernel(op));
  enc.set_pipeline(pipeline);
  if (mask.buffer && n_rows != 1) fail(op, "a mask is for one row");
  if (mask.buffer) check_view(op, "mask (ceil(n / 32)) uint32", mask, size_t(n + 31) / 32 * 4, 4);
  bind_params(enc, mkv_params::Argmax{n_rows, n, mask.buffer ? 1u : 0u}, 0);
  bind(enc, x, 1);
  bind(enc, out, 2);
  bind(enc, mask.buffer ? mask : x, 3);  // unused without a mask
  // A long row is latency-bound: GPUs run as many SIMD-groups as the pipeline
  // holds (up to kArgmaxSimds); fiber lanes (the host executor) kRowSimds.
  const uint32_t simds =
      device.properties().lanes_are_fibers
          ? mkv_params::kRowSimds
          : std::clamp(uint32_t(pipeline->max_total_threads_per_threadgroup() / 32), 1u, mkv_params::kArgmaxSimds);
  enc.dispatch_threadgroups({n_rows, 1, 1}, {32 * simds, 1, 1});
}

void softmax(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& x,
             const BufferView& out, uint32_t n_rows, uint32_t n, float scale) {
  const char* op = "softmax";
  check_positive(op, "n_rows", n_rows);
  check_positive(op, "n", n);
  if (!(scale > 0.0f)) fail(op, "scale must be > 0, got " + std::to_string(scale));
  check_view(op, "x (n_rows, n) float32", x, size_t(n_rows) * n * 4, 4);
  check_view(op, "out (n_rows, n) float32", out, size_t(n_rows) * n * 4, 4);
  enc.set_pipeline(device.pipeline(f32_kernel(op)));
  bind_params(enc, mkv_params::Softmax{n_rows, n, scale}, 0);
  bind(enc, x, 1);
  bind(enc, out, 2);
  enc.dispatch_threadgroups({n_rows, 1, 1}, {32 * mkv_params::kRowSimds, 1, 1});
}

std::vector<std::string> elementwise_kernel_names(gpu::Device& device) {
  std::vector<std::string> names;
  for (const std::string& type : weight_type_names()) names.push_back(embedding_kernel(parse_weight_type(type, "embedding")));
  for (WeightType t : {WeightType::f32, WeightType::f16}) {
    names.push_back(rms_norm_kernel(t));
    if (device.properties().has_host_shapes) names.push_back(rms_norm_kernel(t, true));
  }
  for (const char* op : kF32Ops) names.push_back(f32_kernel(op));
  return names;
}

}  // namespace mkv::ops
