// What every tower (siglip.h, conformer.h, mobilenet.h) does the same way: check a
// tensor of its weights, run a linear layer in the prefill gemm over its rows;
// and Gemma 3n's multimodal embedder, which its audio and vision towers share.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpu/device.h"
#include "model/weights.h"
#include "ops/linear.h"

namespace mkv::towers {

// The tensor `name` of `weights`: present, of `shape`, f32, f16 or bf16 for a
// matrix and f32 for anything else; raises GpuError "[tower] ..." naming it.
const model::Weight& need_weight(const char* tower, const model::Weights& weights, const std::string& name,
                                 const std::vector<uint64_t>& shape, bool matrix);

// y = act(x · Wᵀ (+ bias)) over n rows, y += that when accumulate: float32 x
// and y at offset 0, the gemm shape of the device (ops::MatmulKernel::gemm);
// x16: MatmulArgs::activations_16bit; act: MatmulArgs::activation.
void linear(gpu::Device& dev, gpu::ComputeEncoder& enc, const gpu::BufferPtr& x, const model::Weight& w,
            const model::Weight* bias, const gpu::BufferPtr& y, uint32_t n, bool accumulate = false,
            bool x16 = false, ops::MatmulActivation act = ops::MatmulActivation::none);

// q, k, v (n rows of width each) = x · [W_q; W_k; W_v]ᵀ (+ bias) in one gemm, split
// by its epilogue: w (3 width, n_in). q float32; k and v float32, or f16 rows with
// kv_f16 (MatmulArgs::split_f16: a K/V pool's two sections).
void linear_qkv(gpu::Device& dev, gpu::ComputeEncoder& enc, const ops::BufferView& x, const model::Weight& w,
                const model::Weight* bias, const ops::BufferView& q, const ops::BufferView& k,
                const ops::BufferView& v, uint32_t n, bool x16 = false, bool kv_f16 = false);

// Gemma 3n's multimodal embedder (transformers' Gemma3nMultimodalEmbedder), from a
// tower's rows or its hard tokens to the text model's: RMSNorm (soft or hard
// weights) -> · W_projᵀ -> RMSNorm without a scale. Its tensors: mm.embedding
// (vocab, hidden), mm.hard_norm and mm.soft_norm (hidden) f32, mm.projection
// (text_hidden, hidden).
class Embedder {
 public:
  Embedder(const char* tower, gpu::Device& dev, const model::Weights& weights, uint32_t vocab, uint32_t hidden,
           uint32_t text_hidden, float eps);

  // out (n, text_hidden) = the embedder of x (n, hidden); normed (n, hidden) is scratch.
  void soft(gpu::Device& dev, gpu::ComputeEncoder& enc, const gpu::BufferPtr& x, const gpu::BufferPtr& normed,
            const gpu::BufferPtr& out, uint32_t n) const;

  // The rows of hard tokens 0 .. vocab - 1 ((vocab, text_hidden) float32), run on `queue`.
  std::vector<float> hard_rows(gpu::Device& dev, gpu::CommandQueue& queue) const;

 private:
  const model::Weight *embedding_, *hard_norm_, *soft_norm_, *projection_;
  uint32_t vocab_, hidden_, text_hidden_;
  float eps_;
  gpu::BufferPtr ones_;  // the last norm's weight
};

}  // namespace mkv::towers
