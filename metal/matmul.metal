// Linear layers: Y = X · Wᵀ (+ bias), W (n_out, n_in) row-major in one of
// the formats of quant.h (f32, f16, bf16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
// Q4_K, Q5_K, Q6_K), activations float. Two kernel shapes:
//
//   gemv_<fmt>_r<R>  decode (metal/gemv.h). Memory bound: every weight byte is
//               read once per token here, once per kTokens tokens in the
//               several-token shapes of gemv_tokens.metal (a batched step).
//               Grid: (ceil(n_out / (R * simds)), n_tokens).
//   gemv_swiglu_<fmt>, gemv_geglu_<fmt>  decode of a GLU feed-forward: gate
//               and up stacked in one matrix, act(gate) * up written directly.
//   gemm_<fmt>  prefill. A threadgroup computes a kGemmTokens x kGemmRows tile
//               of Y: per step of kGemmK inputs it dequantizes the weight tile and
//               the activation tile into threadgroup memory, so each weight
//               block read serves kGemmTokens tokens. Each thread computes kTM
//               tokens x 4 rows. Grid: (ceil(n_out / 64), ceil(n_tokens / 32)).
//               A token's outputs do not depend on the other tokens of the tile
//               (each sums its k in one order), so prefill is chunk-invariant.
//
// Every gemv and gemm ends in matmul_out.h's epilogue: the bias, gelu_tanh
// with kMatmulGelu, and an add to what y holds with kMatmulAccumulate (a fused
// residual add).
//
// The host functions that build these names and geometries: cpp/ops/linear.cpp.
#include "mkv_kernel.h"
#include "gemv.h"
#include "gemm.h"
#include "linear_variants.h"

// One instance per kernel shape, weight format and gemv width, one token per
// threadgroup row (gemv_tokens.metal has the several-token shapes); the host
// builds the same names (cpp/ops/linear.cpp: gemv_name). gemv_<fmt> has 8 rows
// per SIMD-group (simd_sum; a host variant), gemv_<fmt>_r32 32, a row a lane
// (the host executor's shape); gemv_<fmt>_r1, _r2, _r4 are the GPU shapes (the op
// picks R from the device's wave). On those, f16 and bf16 read 8-weight
// chunks with one 16-byte load (FmtF16x8) and need 16-byte aligned rows;
// gemv_f16_c4_r<R> is the 4-weight fallback for other rows. e.g. "gemv_swiglu_q4_1_r32".
// The GPU widths and the c4 formats: linear_variants.h.
#define MKV_GEMV_GPU_SHAPE(R, fmt, F) MKV_GEMV_SHAPE(fmt##_r##R, F, R, 1)
#define MKV_GEMV_GPU_SHAPES(fmt, F) MKV_GEMV_GPU_ROWS(MKV_GEMV_GPU_SHAPE, fmt, F)
#define MKV_GEMV_FORMAT(fmt, F)                               \
  MKV_GEMV_SHAPE(fmt, F, mkv_params::kGemvRows, 1)            \
  MKV_GEMV_LANES_SHAPE(fmt##_r32, F, 1)                       \
  MKV_GEMV_GPU_SHAPES(fmt, MKV_GEMV_GPU_FORMAT_##fmt(F))
#define MKV_GEMV_C4_FORMAT(fmt, F, unused) MKV_GEMV_GPU_SHAPES(fmt##_c4, F)
#define MKV_GEMM_FORMAT(fmt, F) MKV_GEMV(gemm_##fmt, gemm<F>)
MKV_FOR_EACH_FORMAT(MKV_GEMV_FORMAT)
MKV_GEMV_C4_FORMATS(MKV_GEMV_C4_FORMAT, )
MKV_FOR_EACH_FORMAT(MKV_GEMM_FORMAT)
