// Linear layers (metal/matmul.metal): Y = X · Wᵀ (+ bias) with f32, f16, bf16
// or GGUF block-quantized (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)
// weights read inside the kernel.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/ops.h"
#include "ops/weight_type.h"

namespace mkv::ops {

// Raises unless [view.offset, view.offset + bytes) lies in the buffer and the
// offset is a multiple of `align`. `what` names the argument in the message.
void check_view(const char* op, const char* what, const BufferView& view, size_t bytes,
                size_t align);

enum class MatmulKernel {
  automatic,  // gemv for one token, gemm otherwise
  gemv,       // decode: one weight pass per gemv_tokens tokens, each token's
              // outputs bit-identical to a one-token gemv (metal/gemv.h)
  gemm,       // tiled, weight tiles reused across 32 tokens: prefill, in the
              // device's shape (gemm_mma with matrix units, gemm_host on fiber
              // lanes, gemm_gpu elsewhere)
  gemm_gpu,   // the GPU's SIMD gemm shape on any device (the host tests it)
  gemm_host,  // the host executor's gemm shape (metal/gemm_host.h), bit-identical
              // to gemm_gpu; refused on devices without host shapes
  gemm_mma,   // the gemm on simdgroup_matrix (metal/gemm_mma.h) on any device;
              // bit-identical to gemm_gpu where products follow the host's order
};

enum class MatmulActivation { none, gelu_tanh };

struct MatmulArgs {
  BufferView x;     // (n_tokens, n_in) float32, offset 16-byte aligned
  BufferView w;     // (n_out, n_in) in wtype, offset aligned to weight_align(wtype)
  BufferView y;     // (n_tokens, n_out) float32; must not overlap x
  BufferView bias;  // (n_out) float32, or no buffer for none
  uint32_t n_tokens = 1;
  uint32_t n_in = 0;
  uint32_t n_out = 0;
  WeightType wtype = WeightType::f16;
  MatmulKernel kernel = MatmulKernel::automatic;
  bool accumulate = false;  // y += X · Wᵀ (+ bias): a residual add in the epilogue
  // gelu_tanh: y = gelu_tanh(X · Wᵀ + bias) in the epilogue (before accumulate), the
  // float function ops::gelu runs: an MLP's up projection and its activation in one pass.
  MatmulActivation activation = MatmulActivation::none;
  // f16 and bf16 weights: where the gemm runs on matrix units (gemm_mma: kernel
  // gemm on a device that reports them, or gemm_mma), X is rounded to the
  // weights' type as it is staged (gemm_mma_<wtype>_x16), so every product
  // runs at the matrix units' 16-bit rate; sums stay float. Other shapes
  // compute in float as always. The towers' choice (their specs'
  // operands_16bit); off, the gemm's products are float's on every device.
  bool activations_16bit = false;
  uint32_t gemv_rows = 0;   // gemv rows per SIMD-group: 0 = the device's (gemv_rows()), or 1, 2, 4, 8, 32
  uint32_t gemv_tokens = 0; // gemv tokens per threadgroup: 0 = the device's (gemv_tokens()), 1, or
                            // kGemvTokensHost (rows 8 or 32) / kGemvTokensGpu (rows 1 or 2)
  // A gemm over stacked matrices into three token-major outputs (q, k, v from
  // [W_q; W_k; W_v]): split_a > 0 sends columns [0, split_a) to y, [split_a,
  // split_b) to y2 and [split_b, n_out) to y3. Gemm kernels only.
  uint32_t split_a = 0;
  uint32_t split_b = 0;
  BufferView y2;
  BufferView y3;
  // With a split: y2 and y3 take f16 rows, each value rounded once (a K/V pool's
  // sections: a tower's q/k/v gemm stores its K and V there). Not with accumulate.
  bool split_f16 = false;
};

// Rows per SIMD-group of the gemv a device runs best, the one place that
// decides it. GPUs (Metal, CUDA): 2 rows, or 1 for float formats when 2 would
// not give one wave of SIMD-groups (ops::device_wave: compute units x
// resident threadgroups; a small grid leaves the memory system idle, extra rows
// share the activation loads; matmul_glu halves it, its SIMD-groups do both
// halves). The host executor, where each lane is a fiber
// and costs its setup and switches whatever work it does: 32 rows and one
// SIMD-group (1.2-1.3x faster for q4_1/q8_0/f32), except f16, whose 8-row loop
// g++ vectorizes (r32 is 0.6-0.96x there). All are real MSL; tests run each.
uint32_t gemv_rows(gpu::Device& device, WeightType wtype, uint32_t n_out, uint32_t n_tokens);

// Tokens per threadgroup of a gemv over n_tokens tokens, the one place that
// decides it: 1 for one token; else the device's several-token shape
// (kGemvTokensHost on the host executor, kGemvTokensGpu on GPUs, where every
// token's activations and sums live in registers).
uint32_t gemv_tokens(gpu::Device& device, uint32_t n_tokens);

// Validates shapes and buffer sizes, then encodes one dispatch of
// gemv_<wtype> or gemm_<wtype>. Raises GpuError "[matmul] ...".
void matmul(gpu::Device& device, gpu::ComputeEncoder& enc, const MatmulArgs& a);

enum class GluActivation { silu, gelu_tanh };  // SwiGLU (Llama), GeGLU (Gemma)

// y = act(X · W_gateᵀ) * (X · W_upᵀ) in one gemv pass over the stacked
// weights (one dispatch of gemv_swiglu_<wtype> / gemv_geglu_<wtype>): the
// decode step's feed-forward input. One weight pass per token.
struct GluArgs {
  BufferView x;  // (n_tokens, n_in) float32, offset 16-byte aligned
  BufferView w;  // (2 n_out, n_in) in wtype: W_gate rows, then W_up rows
  BufferView y;  // (n_tokens, n_out) float32; must not overlap x
  uint32_t n_tokens = 1;
  uint32_t n_in = 0;
  uint32_t n_out = 0;  // rows of each half (the FFN width)
  WeightType wtype = WeightType::f16;
  GluActivation act = GluActivation::silu;
  uint32_t gemv_rows = 0;  // as MatmulArgs::gemv_rows
  uint32_t gemv_tokens = 0;  // as MatmulArgs::gemv_tokens
  // automatic and gemv: the fused gemv (decode; each token's outputs those of a
  // one-token step); gemm, gemm_gpu, gemm_host, gemm_mma: the prefill gemm of
  // that shape with the GLU epilogue (metal/gemm_common.h), the same floats as
  // two gemms and swiglu / geglu.
  MatmulKernel kernel = MatmulKernel::automatic;
};
void matmul_glu(gpu::Device& device, gpu::ComputeEncoder& enc, const GluArgs& a);

// Every kernel name matmul and matmul_glu can build on `dev` (gemv widths,
// token counts and the c4 fallback each op accepts; gemm): each must be in the
// device's library (tests/gpu/test_kernel_names.py).
std::vector<std::string> linear_kernel_names(gpu::Device& dev);

// Weight bytes one call reads from device memory: gemv reads W once per
// gemv_tokens tokens, gemm once per tile of 32 tokens.
uint64_t matmul_weight_bytes_read(gpu::Device& device, const MatmulArgs& a);

}  // namespace mkv::ops
