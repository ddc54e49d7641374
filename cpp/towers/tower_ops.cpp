#include "towers/tower_ops.h"

#include "kv/encoder_session.h"
#include "ops/elementwise.h"

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
            const model::Weight* bias, const gpu::BufferPtr& y, uint32_t n, bool accumulate, bool x16,
            ops::MatmulActivation act) {
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
  a.activations_16bit = x16;
  a.activation = act;
  ops::matmul(dev, enc, a);
}

void linear_qkv(gpu::Device& dev, gpu::ComputeEncoder& enc, const ops::BufferView& x, const model::Weight& w,
                const model::Weight* bias, const ops::BufferView& q, const ops::BufferView& k,
                const ops::BufferView& v, uint32_t n, bool x16, bool kv_f16) {
  const uint32_t width = uint32_t(w.rows() / 3);
  ops::MatmulArgs a;
  a.x = x;
  a.w = w.view;
  a.y = q;
  a.y2 = k;
  a.y3 = v;
  a.split_f16 = kv_f16;
  if (bias) a.bias = bias->view;
  a.n_tokens = n;
  a.n_in = uint32_t(w.cols());
  a.n_out = 3 * width;
  a.split_a = width;
  a.split_b = 2 * width;
  a.wtype = w.type;
  a.kernel = ops::MatmulKernel::gemm;
  a.activations_16bit = x16;
  ops::matmul(dev, enc, a);
}

Embedder::Embedder(const char* tower, gpu::Device& dev, const model::Weights& weights, uint32_t vocab,
                   uint32_t hidden, uint32_t text_hidden, float eps)
    : embedding_(&need_weight(tower, weights, "mm.embedding", {vocab, hidden}, true)),
      hard_norm_(&need_weight(tower, weights, "mm.hard_norm", {hidden}, false)),
      soft_norm_(&need_weight(tower, weights, "mm.soft_norm", {hidden}, false)),
      projection_(&need_weight(tower, weights, "mm.projection", {text_hidden, hidden}, true)),
      vocab_(vocab), hidden_(hidden), text_hidden_(text_hidden), eps_(eps) {
  ones_ = dev.new_buffer(size_t(text_hidden) * sizeof(float));
  ones_->write(0, std::vector<float>(text_hidden, 1.0f).data(), size_t(text_hidden) * sizeof(float));
}

void Embedder::soft(gpu::Device& dev, gpu::ComputeEncoder& enc, const gpu::BufferPtr& x, const gpu::BufferPtr& normed,
                    const gpu::BufferPtr& out, uint32_t n) const {
  ops::rms_norm(dev, enc, {x, 0}, soft_norm_->view, soft_norm_->type, {normed, 0}, n, hidden_, eps_);
  linear(dev, enc, normed, *projection_, nullptr, out, n);
  ops::rms_norm(dev, enc, {out, 0}, {ones_, 0}, ops::WeightType::f32, {out, 0}, n, text_hidden_, eps_);
}

std::vector<float> Embedder::hard_rows(gpu::Device& dev, gpu::CommandQueue& queue) const {
  std::vector<int32_t> ids(vocab_);
  for (uint32_t i = 0; i < vocab_; ++i) ids[i] = int32_t(i);
  gpu::BufferPtr id_buf = dev.new_buffer(ids.size() * sizeof(int32_t));
  id_buf->write(0, ids.data(), ids.size() * sizeof(int32_t));
  gpu::BufferPtr emb = dev.new_buffer(size_t(vocab_) * hidden_ * sizeof(float));
  gpu::BufferPtr hard = dev.new_buffer(size_t(vocab_) * text_hidden_ * sizeof(float));
  kv::EncoderSession session(queue);
  gpu::ComputeEncoder& enc = session.compute();
  ops::embedding(dev, enc, embedding_->view, embedding_->type, {id_buf, 0}, {emb, 0}, vocab_, hidden_, vocab_);
  ops::rms_norm(dev, enc, {emb, 0}, hard_norm_->view, hard_norm_->type, {emb, 0}, vocab_, hidden_, eps_);
  linear(dev, enc, emb, *projection_, nullptr, hard, vocab_);
  ops::rms_norm(dev, enc, {hard, 0}, {ones_, 0}, ops::WeightType::f32, {hard, 0}, vocab_, text_hidden_, eps_);
  session.finish();
  std::vector<float> rows(size_t(vocab_) * text_hidden_);
  hard->read(0, rows.data(), rows.size() * sizeof(float));
  return rows;
}

}  // namespace mkv::towers
