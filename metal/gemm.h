// The prefill gemm kernel body (instantiated per weight format by matmul.metal):
// a threadgroup computes a kGemmTokens x kGemmRows tile of Y = X · Wᵀ (+ bias);
// per step of kGemmK inputs it dequantizes the weight tile and the activation
// tile into threadgroup memory, so each weight block read serves kGemmTokens
// tokens (matmul.metal's header comment has the geometry).
#pragma once

#include "mkv_kernel.h"
#include "linear_params.h"
#include "quant.h"
#include "gemm_common.h"

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
                 device float* y2 [[buffer(5)]],           // kMatmulSplit: the second and third
                 device float* y3 [[buffer(6)]],           // outputs' buffers (gemm_common.h); y if none
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
      const ulong row = gemm_weight_row(p, tg.x, r);
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

  if (gemm_glu(p)) {  // gate and up sums meet in threadgroup memory (the weight tile's, free after the loop)
    for (uint i = 0; i < kTM; ++i)
      for (uint j = 0; j < 4; ++j) ((threadgroup float*)ws)[(ty * kTM + i) * kGemmRows + tx * 4 + j] = acc[i][j];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    constexpr uint H = kGemmRows / 2;
    for (uint i = tid; i < kGemmTokens * H; i += kGemmThreads) {
      const uint t = t0 + i / H, n = tg.x * H + i % H;
      if (t >= p.n_tokens || n >= p.n_out) continue;
      const uint at = (i / H) * kGemmRows + i % H;  // the token's gate sum; its up sum is H further
      y[ulong(t) * p.n_out + n] =
          gemm_glu_value(p, ((const threadgroup float*)ws)[at], ((const threadgroup float*)ws)[at + H]);
    }
    return;
  }
  for (uint i = 0; i < kTM; ++i) {
    const uint t = t0 + ty * kTM + i;
    for (uint j = 0; j < 4; ++j) {
      const uint n = n0 + tx * 4 + j;
      if (t >= p.n_tokens || n >= p.n_out) continue;
      gemm_put(p, bias, y, y2, y3, t, n, acc[i][j]);
    }
  }
}
