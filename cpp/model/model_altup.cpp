// Gemma 3n's parts of Model (model.h has the flow; docs/research/
// issue37-gemma3n-gguf.md §1 the forward as transformers runs it): the
// tensors it requires, the step's start (per-layer inputs, AltUp's streams),
// a layer's prediction, LAuReL, correction and per-layer input gate, and the
// step's end (the streams back into one hidden state).
#include <cmath>

#include "model/model.h"
#include "ops/altup.h"
#include "ops/elementwise.h"

namespace mkv::model {
namespace {

std::string str(uint64_t v) { return std::to_string(v); }
ops::BufferView at(const ops::BufferView& v, size_t byte_offset) { return {v.buffer, v.offset + byte_offset}; }

}  // namespace

void Model::require_altup(const std::string& p, Layer& L) {
  const uint64_t H = spec_.hidden, N = spec_.altup_inputs, R = spec_.laurel_rank, P = spec_.per_layer_dim;
  auto f32 = [&](const std::string& name, std::vector<uint64_t> shape) {
    const Weight* w = require(name, std::move(shape), true);
    if (w->type != ops::WeightType::f32)
      ops::fail("model", "tensor " + name + " is " + ops::weight_type_name(w->type) + "; expected f32");
    return w;
  };
  if (N) {
    L.router_norm = f32(p + "altup_router_norm.weight", {H});
    L.router = f32(p + "altup_router.weight", {N, H});
    L.predict_coef = f32(p + "altup_predict_coef.weight", {N * N, N});
    L.correct_coef = f32(p + "altup_correct_coef.weight", {N, N});
    L.correct_scale = f32(p + "altup_correct_scale.weight", {H});
  }
  if (R) {
    L.laurel_l = require(p + "laurel_l.weight", {R, H}, true);
    L.laurel_r = require(p + "laurel_r.weight", {H, R}, true);
    L.laurel_norm = require(p + "laurel_post_norm.weight", {H}, false);
  }
  if (P) {
    L.inp_gate = require(p + "inp_gate.weight", {P, H}, true);
    L.proj = require(p + "proj.weight", {H, P}, true);
    L.post_norm = require(p + "post_norm.weight", {H}, false);
  }
}

void Model::encode_altup_inputs(gpu::ComputeEncoder& enc, Workspace& ws, const StepRows& rows) const {
  const ModelSpec& m = spec_;
  gpu::Device& dev = *device_;
  const uint32_t n_rows = rows.prefill + rows.decode, H = m.hidden, N = m.altup_inputs;
  if (const uint32_t P = m.per_layer_dim) {
    // (token row * sqrt P + rms_norm(embedding W / sqrt H)) / sqrt 2, each layer's P columns normed alone
    const uint32_t LP = m.n_layers * P;
    linear(enc, ws.stream(0), *per_layer_proj_, nullptr, ws.per_layer_proj(), rows);
    ops::scale(dev, enc, ws.per_layer_proj(), n_rows * LP, 1.0f / std::sqrt(float(H)));
    norm(enc, ws.per_layer_proj(), *per_layer_norm_, ws.per_layer_proj(), n_rows * m.n_layers, P);
    ops::embedding(dev, enc, per_layer_embd_->view, per_layer_embd_->type, ws.per_layer_ids(), ws.per_layer(), n_rows,
                   LP, m.per_layer_vocab, std::sqrt(float(P)));
    ops::add(dev, enc, ws.per_layer(), ws.per_layer_proj(), n_rows * LP);
    ops::scale(dev, enc, ws.per_layer(), n_rows * LP, 1.0f / std::sqrt(2.0f));
  }
  for (uint32_t k = 1; k < N; ++k) linear(enc, ws.stream(0), *altup_in_[k - 1], nullptr, ws.stream(k), rows);
  ops::altup_magnitude(dev, enc, ws.stream(0), ws.stream(1), n_rows, H, N - 1, ws.stream_stride());
}

void Model::encode_altup_predict(gpu::ComputeEncoder& enc, Workspace& ws, const StepRows& rows, uint32_t l) const {
  const Layer& L = layers_[l];
  ops::AltupArgs a{rows.prefill + rows.decode, spec_.hidden, spec_.altup_inputs, spec_.altup_active,
                   ws.stream_stride(), spec_.rms_eps, L.router_norm->view, L.router->view};
  ops::altup_predict(*device_, enc, a, ws.stream(0), L.predict_coef->view, ws.predicted(0), ws.x());
}

void Model::encode_laurel(gpu::ComputeEncoder& enc, Workspace& ws, const StepRows& rows, uint32_t l) const {
  // laurel = h + rms_norm(h Wl Wr), h the layer's normed input (ws.h())
  const Layer& L = layers_[l];
  const uint32_t n = rows.prefill + rows.decode, H = spec_.hidden;
  linear(enc, ws.h(), *L.laurel_l, nullptr, ws.narrow(), rows);
  linear(enc, ws.narrow(), *L.laurel_r, nullptr, ws.laurel(), rows);
  norm(enc, ws.laurel(), *L.laurel_norm, ws.laurel(), n, H);
  ops::add(*device_, enc, ws.laurel(), ws.h(), n * H);
}

void Model::encode_altup_correct(gpu::ComputeEncoder& enc, Workspace& ws, const StepRows& rows, uint32_t l) const {
  const Layer& L = layers_[l];
  const ModelSpec& m = spec_;
  gpu::Device& dev = *device_;
  const uint32_t n_rows = rows.prefill + rows.decode, H = m.hidden;
  ops::AltupArgs a{n_rows, H, m.altup_inputs, m.altup_active, ws.stream_stride(), m.rms_eps, L.router_norm->view,
                   L.router->view};
  // the streams from the predictions and the layer's output (ws.x()); ws.h() the
  // corrected active stream times correct_output_scale
  ops::altup_correct(dev, enc, a, ws.predicted(0), ws.x(), L.correct_coef->view, L.correct_scale->view,
                     ws.stream(0), ws.h());
  if (const uint32_t P = m.per_layer_dim) {  // + rms_norm(gelu(h Wgate) * the layer's inputs Wproj): streams 1..
    linear(enc, ws.h(), *L.inp_gate, nullptr, ws.narrow(), rows);
    ops::per_layer_gate(dev, enc, ws.narrow(), at(ws.per_layer(), size_t(l) * P * sizeof(float)), n_rows, P,
                        m.n_layers * P);
    linear(enc, ws.narrow(), *L.proj, nullptr, ws.laurel(), rows);
    norm(enc, ws.laurel(), *L.post_norm, ws.laurel(), n_rows, H);
    for (uint32_t k = 1; k < m.altup_inputs; ++k)  // (not the active one: stream 0, whatever altup_active is)
      ops::add(dev, enc, ws.stream(k), ws.laurel(), n_rows * H);
  }
}

void Model::encode_altup_output(gpu::ComputeEncoder& enc, Workspace& ws, const StepRows& rows) const {
  const uint32_t n_rows = rows.prefill + rows.decode, H = spec_.hidden, N = spec_.altup_inputs;
  for (uint32_t k = 1; k < N; ++k) linear(enc, ws.stream(k), *altup_out_[k - 1], nullptr, ws.predicted(k), rows);
  ops::altup_magnitude(*device_, enc, ws.stream(0), ws.predicted(1), n_rows, H, N - 1, ws.stream_stride());
  ops::altup_mean(*device_, enc, ws.stream(0), ws.predicted(1), ws.x(), n_rows * H, N - 1, ws.stream_stride());
}

}  // namespace mkv::model
