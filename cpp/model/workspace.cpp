#include "model/workspace.h"

#include <algorithm>
#include <vector>

namespace mkv::model {

Workspace::Workspace(gpu::Device& device, const ModelSpec& spec, uint32_t step_rows, uint32_t logit_rows)
    : device_(device), step_rows_(step_rows), logit_rows_(logit_rows), vocab_(spec.vocab), hidden_(spec.hidden), per_layer_vocab_(spec.per_layer_dim ? spec.per_layer_vocab : 0) {
  if (step_rows == 0 || logit_rows == 0) ops::fail("workspace", "step_rows and logit_rows must be at least 1");
  const size_t t = step_rows, f = sizeof(float);
  auto alloc = [&](size_t elements) { return device_.new_buffer(elements * f); };
  ids_ = alloc(t);
  rows_ = alloc(logit_rows);
  positions_ = alloc(t);
  x_ = alloc(t * spec.hidden);
  h_ = alloc(t * spec.hidden);
  q_ = alloc(t * spec.n_heads * spec.head_dim);
  k_ = alloc(t * spec.n_kv_heads * spec.head_dim);
  v_ = alloc(t * spec.n_kv_heads * spec.head_dim);
  qkv_ = alloc(t * (spec.n_heads + 2 * spec.n_kv_heads) * spec.head_dim);
  attn_ = alloc(t * spec.n_heads * spec.head_dim);
  gate_ = alloc(t * spec.ffn_hidden);
  up_ = alloc(t * spec.ffn_hidden);
  logits_ = alloc(size_t(logit_rows) * spec.vocab);
  gathered_ = alloc(size_t(logit_rows) * spec.hidden);
  if (spec.altup_inputs) {
    streams_ = alloc(t * spec.altup_inputs * spec.hidden);
    pred_ = alloc(t * spec.altup_inputs * spec.hidden);
    laurel_ = alloc(t * spec.hidden);
    narrow_ = alloc(t * std::max({spec.laurel_rank, spec.per_layer_dim, 1u}));
    if (spec.per_layer_dim) {
      per_layer_ids_ = alloc(t);
      per_layer_ = alloc(t * spec.n_layers * spec.per_layer_dim);
      per_layer_proj_ = alloc(t * spec.n_layers * spec.per_layer_dim);
    }
  }
}

void Workspace::write_ids(const int32_t* ids, uint32_t n) {
  ids_->write(0, ids, size_t(n) * sizeof(int32_t));
  if (!per_layer_ids_) return;
  std::vector<int32_t> clamped(ids, ids + n);
  for (int32_t& id : clamped)
    if (id < 0 || uint32_t(id) >= per_layer_vocab_) id = 0;
  per_layer_ids_->write(0, clamped.data(), size_t(n) * sizeof(int32_t));
}

void Workspace::write_soft(uint32_t first, const float* data, uint32_t n) {
  if (uint64_t(first) + n > step_rows_) ops::fail("workspace", "soft rows past the step's rows");
  if (!soft_) {
    soft_ = device_.new_buffer(size_t(step_rows_) * hidden_ * sizeof(float));
    std::vector<int32_t> index(step_rows_);
    for (uint32_t i = 0; i < step_rows_; ++i) index[i] = int32_t(i);
    soft_index_ = device_.new_buffer(index.size() * sizeof(int32_t));
    soft_index_->write(0, index.data(), index.size() * sizeof(int32_t));
  }
  soft_->write(size_t(first) * hidden_ * sizeof(float), data, size_t(n) * hidden_ * sizeof(float));
}

void Workspace::write_rows(const int32_t* rows, uint32_t n) { rows_->write(0, rows, size_t(n) * sizeof(int32_t)); }

void Workspace::write_positions(const uint32_t* pos, uint32_t n) {
  positions_->write(0, pos, size_t(n) * sizeof(uint32_t));
}

void Workspace::read_logits(float* dst, uint32_t rows, uint32_t first) const {
  logits_->read(size_t(first) * vocab_ * sizeof(float), dst, size_t(rows) * vocab_ * sizeof(float));
}

ops::BufferView Workspace::policy_scratch(size_t bytes) {
  if (bytes && (!policy_ || policy_->length() < bytes)) policy_ = device_.new_buffer(bytes);
  return {policy_, 0};
}

ops::BufferView Workspace::attention_scratch(size_t bytes) {
  // Work already encoded keeps a replaced buffer alive through its command buffer.
  if (bytes && (!scratch_ || scratch_->length() < bytes)) scratch_ = device_.new_buffer(bytes);
  return {scratch_, 0};
}

}  // namespace mkv::model
