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
// gemv and gemm add to what y holds when p.flags has kMatmulAccumulate (a
// fused residual add).
//
// The host functions that build these names and geometries: cpp/ops/linear.cpp.
#include "mkv_kernel.h"
#include "gemv.h"

// Geometry shared with the host (linear_params.h).
using mkv_params::kGemvRows;
using mkv_params::kGemmTokens;
using mkv_params::kGemmRows;
using mkv_params::kGemmK;
using mkv_params::kGemmThreads;
// Tokens per gemm thread: the threads cover the 64 rows 4 at a time.
constant constexpr uint kTM = kGemmTokens / (kGemmThreads / (kGemmRows / 4));

template <typename F>
MKV_MAX_THREADS(mkv_params::kGemmThreads) kernel void gemm(constant mkv_params::Matmul& p [[buffer(0)]],
                 const device uchar* w [[buffer(1)]],      // (n_out, n_in) in format F
                 const device float* x [[buffer(2)]],      // (n_tokens, n_in)
                 device float* y [[buffer(3)]],            // (n_tokens, n_out)
                 const device float* bias [[buffer(4)]],   // (n_out) if p.flags has kMatmulBias
                 uint2 tg [[threadgroup_position_in_grid]],
                 uint tid [[thread_index_in_threadgroup]]) {
  // k-major tiles, so the inner loop reads 4 consecutive tokens / rows as one float4.
  threadgroup float4 xs[kGemmK * kGemmTokens / 4];  // (k, token)
  threadgroup float4 ws[kGemmK * kGemmRows / 4];    // (k, row)
  const uint n0 = tg.x * kGemmRows, t0 = tg.y * kGemmTokens;
  // Thread tile: rows 4tx .. 4tx + 4 x tokens kTM·ty .. kTM·ty + kTM.
  const uint tx = tid % (kGemmRows / 4), ty = tid / (kGemmRows / 4);
  const ulong row_bytes = F::row_bytes(p.n_in);
  const uint chunks_per_step = kGemmK / F::kChunk;
  float4 acc[kTM];  // acc[i][j]: token kTM·ty + i, row 4tx + j
  for (uint i = 0; i < kTM; ++i) acc[i] = float4(0.0f);

  for (uint k0 = 0; k0 < p.n_in; k0 += kGemmK) {
    // Weight tile: kGemmRows rows x kGemmK inputs, dequantized chunk by chunk;
    // rows past n_out re-read the last row, inputs past n_in (f16/f32) are 0.
    for (uint i = tid; i < kGemmRows * chunks_per_step; i += kGemmThreads) {
      const uint r = i / chunks_per_step, cc = i % chunks_per_step;
      const ulong row = min(n0 + r, p.n_out - 1);
      float4 v[F::kChunk / 4];
      if (k0 + cc * F::kChunk < p.n_in) {
        F::load(w + row * row_bytes, p.n_in, k0 / F::kChunk + cc, v);
      } else {
        for (uint i = 0; i < F::kChunk / 4; ++i) v[i] = float4(0.0f);
      }
      for (uint j = 0; j < F::kChunk; ++j) {
        const uint k = cc * F::kChunk + j;
        ws[(k * kGemmRows + r) / 4][r % 4] = v[j / 4][j % 4];
      }
    }
    // Activation tile: kGemmTokens tokens x kGemmK inputs, float4 loads.
    for (uint i = tid; i < kGemmTokens * kGemmK / 4; i += kGemmThreads) {
      const uint t = i / (kGemmK / 4), k4 = i % (kGemmK / 4);
      const uint k = k0 + k4 * 4;
      float4 v = float4(0.0f);
      if (t0 + t < p.n_tokens && k < p.n_in) v = *(const device float4*)(x + ulong(t0 + t) * p.n_in + k);
      for (uint j = 0; j < 4; ++j) xs[((k4 * 4 + j) * kGemmTokens + t) / 4][t % 4] = v[j];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint k = 0; k < kGemmK; ++k) {
      const float4 b = ws[(k * kGemmRows) / 4 + tx];
      for (uint i4 = 0; i4 < kTM / 4; ++i4) {
        const float4 a = xs[(k * kGemmTokens + kTM * ty) / 4 + i4];
        for (uint i = 0; i < 4; ++i) acc[4 * i4 + i] += a[i] * b;
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);  // before the next step overwrites the tiles
  }

  for (uint i = 0; i < kTM; ++i) {
    const uint t = t0 + ty * kTM + i;
    for (uint j = 0; j < 4; ++j) {
      const uint n = n0 + tx * 4 + j;
      if (t >= p.n_tokens || n >= p.n_out) continue;
      device float& out = y[ulong(t) * p.n_out + n];
      const float v = acc[i][j] + ((p.flags & mkv_params::kMatmulBias) ? bias[n] : 0.0f);
      out = (p.flags & mkv_params::kMatmulAccumulate) ? out + v : v;  // the residual add, fused
    }
  }
}

// One instance per kernel shape, weight format and gemv width, one token per
// threadgroup row (gemv_tokens.metal has the several-token shapes); the host
// builds the same names (cpp/ops/linear.cpp: gemv_name). gemv_<fmt> has 8 rows
// per SIMD-group (simd_sum; a host variant), gemv_<fmt>_r32 32, a row a lane
// (the host executor's shape); gemv_<fmt>_r1, _r2, _r4 are the GPU shapes (the op
// picks R from the device's wave). On those, f16 and bf16 read 8-weight
// chunks with one 16-byte load (FmtF16x8) and need 16-byte aligned rows;
// gemv_f16_c4_r<R> is the 4-weight fallback for other rows. e.g. "gemv_swiglu_q4_1_r32".
#define MKV_GEMV_GPU_SHAPES(fmt, F) \
  MKV_GEMV_SHAPE(fmt##_r1, F, 1, 1) \
  MKV_GEMV_SHAPE(fmt##_r2, F, 2, 1) \
  MKV_GEMV_SHAPE(fmt##_r4, F, 4, 1)
#define MKV_GEMV_FORMAT(fmt, F)                               \
  MKV_GEMV_SHAPE(fmt, F, mkv_params::kGemvRows, 1)            \
  MKV_GEMV_LANES_SHAPE(fmt##_r32, F, 1)                       \
  MKV_GEMV_GPU_SHAPES(fmt, MKV_GEMV_GPU_FORMAT_##fmt(F))
#define MKV_GEMM_FORMAT(fmt, F) MKV_GEMV(gemm_##fmt, gemm<F>)
MKV_FOR_EACH_FORMAT(MKV_GEMV_FORMAT)
MKV_GEMV_GPU_SHAPES(f16_c4, FmtF16)
MKV_GEMV_GPU_SHAPES(bf16_c4, FmtBF16)
MKV_FOR_EACH_FORMAT(MKV_GEMM_FORMAT)
