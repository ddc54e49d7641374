// Several-token gemv shapes (metal/gemv.h with kTokens > 1): a batched decode
// step's projections, each weight byte read once per kTokens tokens, each
// (token, row) bit-identical to the one-token shapes of matmul.metal.
// gemv_<fmt>_t<T> (8 rows, simd_sum: a variant) and gemv_<fmt>_r32_t<T>
// (32 rows, a row a lane: the host's pick) with T = kGemvTokensHost, built for the host
// executor only; the GPU shapes gemv_<fmt>_r1_t<T>, _r2_t<T> with
// T = kGemvTokensGpu (cpp/ops/linear.cpp picks them: gemv_rows, gemv_tokens).
#include "mkv_kernel.h"
#include "gemv.h"
#include "linear_variants.h"

// The GLU forms of the host's shape at 8 rows only: at 32 (64 rows held, 512
// accumulators a lane) they were slower on the host executor and the costliest
// kernels of the build.
#define MKV_GEMV_TOKENS_HOST(fmt, F, T)                             \
  MKV_GEMV_SHAPE(fmt##_t##T, F, mkv_params::kGemvRows, T)            \
  MKV_GEMV_LANES_SHAPE(fmt##_r32_t##T, F, T)
#define MKV_GEMV_TOKENS_GPU_SHAPE(R, fmt, F, T) MKV_GEMV_SHAPE(fmt##_r##R##_t##T, F, R, T)
#define MKV_GEMV_TOKENS_GPU(fmt, F, T) MKV_GEMV_GPU_TOKEN_ROWS(MKV_GEMV_TOKENS_GPU_SHAPE, fmt, F, T)
// T as a literal: it is pasted into the name (static_asserted against
// kGemvTokensHost / kGemvTokensGpu below).
// The host executor builds both families (so the GPU shapes are tested on any
// machine); GPU compilers only theirs: a host shape holds 8 tokens x 32 rows (x2
// for GLU) of accumulators, would never be picked there, and cost nvcc over 20
// minutes per architecture.
#if defined(MKV_HOST_SHAPES)
#define MKV_GEMV_TOKENS_FORMAT(fmt, F) \
  MKV_GEMV_TOKENS_HOST(fmt, F, 8)      \
  MKV_GEMV_TOKENS_GPU(fmt, MKV_GEMV_GPU_FORMAT_##fmt(F), 4)
#else
#define MKV_GEMV_TOKENS_FORMAT(fmt, F) MKV_GEMV_TOKENS_GPU(fmt, MKV_GEMV_GPU_FORMAT_##fmt(F), 4)
#endif
MKV_FOR_EACH_FORMAT(MKV_GEMV_TOKENS_FORMAT)
#define MKV_GEMV_TOKENS_C4_FORMAT(fmt, F, T) MKV_GEMV_TOKENS_GPU(fmt##_c4, F, T)
MKV_GEMV_C4_FORMATS(MKV_GEMV_TOKENS_C4_FORMAT, 4)
static_assert(mkv_params::kGemvTokensHost == 8 && mkv_params::kGemvTokensGpu == 4,
              "the instantiations above paste these counts into their names");
