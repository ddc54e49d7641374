#include "towers/tower_ops.h"

namespace mkv::towers {

const model::Weight& need_weight(const char* tower, const model::Weights& weights, const std::string& name,
                                 const std::vector<uint64_t>& shape, bool matrix) {
  const model::Weight* w = weights.find(name);
  if (!w) ops::fail(tower, "missing tensor " + name);
  if (w->shape != shape) {
    std::string want;
    for (uint64_t d : shape) want += (want.empty() ? "" : ", ") + std::to_string(d);
    ops::fail(tower, "tensor " + name + " has the wrong shape; expected (" + want + ")");
  }
  const bool float_matrix = w->type == ops::WeightType::f32 || w->type == ops::WeightType::f16 ||
                            w->type == ops::WeightType::bf16;
  if (matrix ? !float_matrix : w->type != ops::WeightType::f32)
    ops::fail(tower, "tensor " + name + " is " + ops::weight_type_name(w->type) + "; expected " +
                         (matrix ? "f32, f16 or bf16" : "f32"));
  return *w;
}

void linear(gpu::Device& dev, gpu::ComputeEncoder& enc, const gpu::BufferPtr& x, const model::Weight& w,
            const model::Weight* bias, const gpu::BufferPtr& y, uint32_t n, bool accumulate) {
  ops::MatmulArgs a;
  a.x = {x, 0};
  a.w = w.view;
  a.y = {y, 0};
  if (bias) a.bias = bias->view;
  a.n_tokens = n;
  a.n_in = uint32_t(w.cols());
  a.n_out = uint32_t(w.rows());
  a.wtype = w.type;
  a.kernel = ops::MatmulKernel::gemm;
  a.accumulate = accumulate;
  ops::matmul(dev, enc, a);
}

void linear_qkv(gpu::Device& dev, gpu::ComputeEncoder& enc, const gpu::BufferPtr& x, const model::Weight& w,
                const model::Weight* bias, const gpu::BufferPtr& q, const gpu::BufferPtr& k, const gpu::BufferPtr& v,
                uint32_t n) {
  const uint32_t width = uint32_t(w.rows() / 3);
  ops::MatmulArgs a;
  a.x = {x, 0};
  a.w = w.view;
  a.y = {q, 0};
  a.y2 = {k, 0};
  a.y3 = {v, 0};
  if (bias) a.bias = bias->view;
  a.n_tokens = n;
  a.n_in = uint32_t(w.cols());
  a.n_out = 3 * width;
  a.split_a = width;
  a.split_b = 2 * width;
  a.wtype = w.type;
  a.kernel = ops::MatmulKernel::gemm;
  ops::matmul(dev, enc, a);
}

}  // namespace mkv::towers
