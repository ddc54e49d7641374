// Workspace: the activation buffers one forward step reuses, sized once for
// the largest step (step_rows rows, logit_rows rows of logits) so a step
// allocates nothing.
#pragma once

#include <cstdint>

#include "gpu/device.h"
#include "model/model_spec.h"
#include "ops/ops.h"

namespace mkv::model {

class Workspace {
 public:
  Workspace(gpu::Device& device, const ModelSpec& spec, uint32_t step_rows, uint32_t logit_rows);

  uint32_t step_rows() const { return step_rows_; }
  uint32_t logit_rows() const { return logit_rows_; }

  // Inputs the host writes before encoding a step, outputs it reads after wait():
  void write_ids(const int32_t* ids, uint32_t n);         // (step_rows) token ids of the step
  void write_rows(const int32_t* rows, uint32_t n);       // (logit_rows) rows of x whose logits the step makes
  void write_positions(const uint32_t* pos, uint32_t n);  // (step_rows) each row's position (KV readers' rope)
  void read_logits(float* dst, uint32_t rows, uint32_t first = 0) const;  // rows first.. of logits()

  // Device views, all float32 unless noted:
  ops::BufferView ids_view() const { return {ids_, 0}; }
  ops::BufferView rows_view() const { return {rows_, 0}; }  // (logit_rows) int32
  ops::BufferView positions() const { return {positions_, 0}; }  // (step_rows) uint32
  ops::BufferView x() const { return {x_, 0}; }         // (step_rows, hidden) residual stream
  ops::BufferView h() const { return {h_, 0}; }         // (step_rows, hidden) normed / projected
  ops::BufferView q() const { return {q_, 0}; }         // (step_rows, n_heads, head_dim)
  ops::BufferView k() const { return {k_, 0}; }         // (step_rows, n_kv_heads, head_dim)
  ops::BufferView v() const { return {v_, 0}; }         // (step_rows, n_kv_heads, head_dim)
  // Decode rows' q, k, v side by side, from the stacked q/k/v projection:
  // (step_rows, n_heads + 2 n_kv_heads, head_dim).
  ops::BufferView qkv() const { return {qkv_, 0}; }
  ops::BufferView attn() const { return {attn_, 0}; }   // (step_rows, n_heads, head_dim)
  ops::BufferView gate() const { return {gate_, 0}; }   // (step_rows, ffn_hidden)
  ops::BufferView up() const { return {up_, 0}; }       // (step_rows, ffn_hidden)
  ops::BufferView logits() const { return {logits_, 0}; }  // (logit_rows, vocab)
  ops::BufferView gathered() const { return {gathered_, 0}; }  // (logit_rows, hidden): rows of x picked for logits

  // Gemma 3n's (ModelSpec::altup_inputs > 0; null otherwise): AltUp's streams and their
  // predictions, (altup_inputs, step_rows, hidden), stream k at k * stream_stride() floats;
  // the step's per-layer inputs and their projection, (step_rows, n_layers * per_layer_dim);
  // LAuReL's output (step_rows, hidden); the narrow products (step_rows, max(rank, P)).
  ops::BufferView stream(uint32_t k) const { return {streams_, size_t(k) * stream_stride() * sizeof(float)}; }
  ops::BufferView predicted(uint32_t k) const { return {pred_, size_t(k) * stream_stride() * sizeof(float)}; }
  uint32_t stream_stride() const { return step_rows_ * hidden_; }
  ops::BufferView per_layer() const { return {per_layer_, 0}; }
  ops::BufferView per_layer_proj() const { return {per_layer_proj_, 0}; }
  ops::BufferView laurel() const { return {laurel_, 0}; }
  ops::BufferView narrow() const { return {narrow_, 0}; }
  // (step_rows) int32: the step's ids for per_layer_token_embd, those outside it 0 (as
  // transformers maps Gemma 3n's image and audio ids; written by write_ids)
  ops::BufferView per_layer_ids() const { return {per_layer_ids_, 0}; }

  // Soft tokens (Segment::soft): rows first .. first + n - 1 of the staging
  // buffer, (step_rows, hidden) float, written from data (allocated at first
  // use), which the step gathers into x through soft_index(): (step_rows)
  // int32 0, 1, 2, ...
  void write_soft(uint32_t first, const float* data, uint32_t n);
  ops::BufferView soft_rows() const { return {soft_, 0}; }
  ops::BufferView soft_index() const { return {soft_index_, 0}; }

  // Split-K attention scratch; grows to the largest request (context-dependent).
  ops::BufferView attention_scratch(size_t bytes);
  // An eviction policy's attention logits and their softmax statistics
  // (ops::attention_scores); grows likewise.
  ops::BufferView policy_scratch(size_t bytes);

 private:
  gpu::Device& device_;
  uint32_t step_rows_;
  uint32_t logit_rows_;
  uint32_t vocab_;
  uint32_t hidden_;
  uint32_t per_layer_vocab_;
  gpu::BufferPtr soft_, soft_index_;
  gpu::BufferPtr per_layer_ids_, streams_, pred_, per_layer_, per_layer_proj_, laurel_, narrow_;
  gpu::BufferPtr ids_, rows_, positions_, x_, h_, q_, k_, v_, qkv_, attn_, gate_, up_, logits_, gathered_, scratch_, policy_;
};

}  // namespace mkv::model
