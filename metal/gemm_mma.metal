// The prefill gemm on simdgroup_matrix: gemm_mma_<fmt> for every weight format
// (design: gemm_mma.h). Built for every device; the ops pick it where the
// device reports matrix units (DeviceProperties::matrix_units), and tests run
// it everywhere against the SIMD gemm.
#include "mkv_kernel.h"
#include "gemm_mma.h"

template <typename F>
MKV_MAX_THREADS(mkv_params::kGemmMmaThreads) kernel void gemm_mma(constant mkv_params::Matmul& p [[buffer(0)]],
                                                            const device uchar* w [[buffer(1)]],
                                                            const device float* x [[buffer(2)]],
                                                            device float* y [[buffer(3)]],
                                                            const device float* bias [[buffer(4)]],
                                                            device float* y2 [[buffer(5)]],
                                                            device float* y3 [[buffer(6)]],
                                                            uint2 tg [[threadgroup_position_in_grid]],
                                                            uint tid [[thread_index_in_threadgroup]],
                                                            uint simd [[simdgroup_index_in_threadgroup]]) {
  threadgroup float xs[mkv_params::kGemmTokens * mkv_params::kGemmMmaK];
  threadgroup typename GemmMmaTile<F>::type ws[mkv_params::kGemmRows * mkv_params::kGemmMmaK];
  threadgroup float ys[mkv_params::kGemmTokens * mkv_params::kGemmRows];
  gemm_mma_body<F, typename GemmMmaTile<F>::type>(p, w, x, y, bias, y2, y3, xs, ws, ys, tg, tid, simd);
}

#define MKV_GEMM_MMA_FORMAT(fmt, F) MKV_KERNEL(MKV_STR(gemm_mma_##fmt), gemm_mma<F>)
MKV_FOR_EACH_FORMAT(MKV_GEMM_MMA_FORMAT)
