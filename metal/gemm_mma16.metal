// The prefill gemm with 16-bit operands on matrix units: gemm_mma_f16_x16 and
// gemm_mma_bf16_x16, the activations in the weights' type (design:
// gemm_mma16.h). Built for every device; the op runs them for
// MatmulArgs::activations_16bit where the gemm runs on matrix units, and tests
// run them everywhere against the SIMD gemm of the rounded activations.
#include "mkv_kernel.h"
#include "gemm_mma16.h"

template <typename X>
MKV_MAX_THREADS(mkv_params::kGemm16Threads) kernel void gemm_mma16(constant mkv_params::Matmul& p [[buffer(0)]],
                                                             const device uchar* w [[buffer(1)]],
                                                             const device float* x [[buffer(2)]],
                                                             device float* y [[buffer(3)]],
                                                             const device float* bias [[buffer(4)]],
                                                             device float* y2 [[buffer(5)]],
                                                             device float* y3 [[buffer(6)]],
                                                             uint2 tg [[threadgroup_position_in_grid]],
                                                             uint tid [[thread_index_in_threadgroup]],
                                                             uint simd [[simdgroup_index_in_threadgroup]],
                                                             uint lane [[thread_index_in_simdgroup]]) {
  // uint4 storage: 16-byte aligned rows, as simdgroup_load4 asks.
  threadgroup uint4 xs[mkv_params::kGemm16Tokens * gemm16_stride(mkv_params::kGemmMmaK) * sizeof(X) / 16];
  threadgroup uint4 ws[mkv_params::kGemm16Rows * gemm16_stride(mkv_params::kGemmMmaK) * sizeof(X) / 16];
  gemm_mma16_body<X, mkv_params::kGemm16Tokens, mkv_params::kGemm16Rows, mkv_params::kGemmMmaK,
                  mkv_params::kGemm16Threads, 4, 4, mkv_params::kGemm16Depth>(
      p, w, x, y, bias, y2, y3, (threadgroup X*)xs, (threadgroup X*)ws, tg, tid, simd, lane);
}

MKV_KERNEL("gemm_mma_f16_x16", gemm_mma16<half>)
MKV_KERNEL("gemm_mma_bf16_x16", gemm_mma16<bfloat>)
