// What every tower (siglip.h, conformer.h) does the same way: check a tensor of
// its weights, and run a linear layer in the prefill gemm over its rows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/weights.h"
#include "ops/linear.h"

namespace mkv::towers {

// The tensor `name` of `weights`: present, of `shape`, f32, f16 or bf16 for a
// matrix and f32 for anything else; raises GpuError "[tower] ..." naming it.
const model::Weight& need_weight(const char* tower, const model::Weights& weights, const std::string& name,
                                 const std::vector<uint64_t>& shape, bool matrix);

// y = x · Wᵀ (+ bias) over n rows, y += that when accumulate: float32 x and y
// at offset 0, the gemm shape of the device (ops::MatmulKernel::gemm).
void linear(gpu::Device& dev, gpu::ComputeEncoder& enc, const gpu::BufferPtr& x, const model::Weight& w,
            const model::Weight* bias, const gpu::BufferPtr& y, uint32_t n, bool accumulate = false);

// q, k, v (n rows of width each) = x · [W_q; W_k; W_v]ᵀ (+ bias) in one gemm, split
// by its epilogue: w (3 width, n_in).
void linear_qkv(gpu::Device& dev, gpu::ComputeEncoder& enc, const gpu::BufferPtr& x, const model::Weight& w,
                const model::Weight* bias, const gpu::BufferPtr& q, const gpu::BufferPtr& k, const gpu::BufferPtr& v,
                uint32_t n);

}  // namespace mkv::towers
