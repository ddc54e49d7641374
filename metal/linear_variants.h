// The gemv shape variants, as data: matmul.metal and gemv_tokens.metal
// instantiate through these lists and cpp/ops/linear.cpp accepts, picks and
// names widths from the same lists (the weight formats are quant.h's
// MKV_FOR_EACH_FORMAT; the host executor's widths and token counts are the
// constants of linear_params.h). X-macros: LIST(X, ...) calls X(entry, ...)
// once per entry, the extra arguments unchanged.
#pragma once

// Rows per SIMD-group of the GPU shapes (gemv_<fmt>_r<R>, one token per
// threadgroup row); the largest is kGemvRowsMaxGpu.
#define MKV_GEMV_GPU_ROWS(X, ...) X(1, __VA_ARGS__) X(2, __VA_ARGS__) X(4, __VA_ARGS__)
// The GPU widths that also have a kGemvTokensGpu-token shape (gemv_<fmt>_r<R>_t4).
#define MKV_GEMV_GPU_TOKEN_ROWS(X, ...) X(1, __VA_ARGS__) X(2, __VA_ARGS__)
// The formats whose GPU shapes read 8-weight chunks (16-byte loads) and so
// have a 4-weight fallback for rows that do not start 16-byte aligned
// (gemv_<fmt>_c4_r<R>): X(format name, its 4-weight reader, ...).
#define MKV_GEMV_C4_FORMATS(X, ...) X(f16, FmtF16, __VA_ARGS__) X(bf16, FmtBF16, __VA_ARGS__)
