// The host executor's prefill gemm shape: gemm_<fmt>_h for every weight format
// (design: gemm_host.h), built for the host executor only; GPU compilers see
// an empty file. The host also builds and tests the GPU shape (matmul.metal's
// gemm_<fmt>).
#include "mkv_kernel.h"
#include "gemm_host.h"

#if defined(MKV_HOST_SHAPES)
template <typename F>
MKV_MAX_THREADS(mkv_params::kGemmHostThreads) kernel void gemm_host(constant mkv_params::Matmul& p [[buffer(0)]],
                                                               const device uchar* w [[buffer(1)]],
                                                               const device float* x [[buffer(2)]],
                                                               device float* y [[buffer(3)]],
                                                               const device float* bias [[buffer(4)]],
                                                               device float* y2 [[buffer(5)]],
                                                               device float* y3 [[buffer(6)]],
                                                               uint2 tg [[threadgroup_position_in_grid]],
                                                               uint lane [[thread_index_in_threadgroup]]) {
  gemm_host_body<F>(p, w, x, y, bias, y2, y3, tg, lane);
}

#define MKV_GEMM_HOST_FORMAT(fmt, F) MKV_KERNEL(MKV_STR(gemm_##fmt##_h), gemm_host<F>)
MKV_FOR_EACH_FORMAT(MKV_GEMM_HOST_FORMAT)
#endif
