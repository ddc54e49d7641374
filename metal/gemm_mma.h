// The prefill gemm on matrix units (gemm_mma_<fmt>): the tile of Y of the
// SIMD gemm (gemm.h: kGemmTokens tokens x kGemmRows rows a threadgroup, the
// same grid), computed with simdgroup_matrix 8x8 products. Per step of
// kGemmMmaK inputs the threads dequantize the weight tile (rows x k, row-major:
// whole float4 chunks as F::load gives them) and copy the activation tile
// (tokens x k) into threadgroup memory; each of the 2 SIMD-groups then takes
// all 32 tokens x 32 rows: 4 x 4 accumulators, fed by 8x8 blocks of X (A) and
// of W read transposed (B = Wᵀ). The next step's weights and activations are
// fetched into registers while this step's products run. The sums go through
// threadgroup memory to the epilogue (bias, the fused residual add), which is
// the SIMD gemm's. Half and bfloat weights stay in their own type in the tile
// (GemmMmaTile).
//
// Where products follow the host executor's documented order (k in order, one
// rounding per operation: the host, the CUDA device's shuffle form), every
// output is the SIMD gemm's sum to the bit: the same products x[t][k] * w[n][k]
// added onto 0 in increasing k. Apple's matrix units sum 8 at a time in their
// own order. A token's outputs never depend on the tile's other tokens, so
// prefill stays chunk-invariant on every device.
//
// Tile sizes: 32 x 64 with a 32-input step, as the peers use on Apple GPUs
// (MLX's steel gemm 32-64 square tiles with 16-32 inputs a step; llama.cpp's
// kernel_mul_mm 64 x 32, 32 inputs): up to 20 KiB of threadgroup memory
// (weights and activations, and the output staging). 2 SIMD-groups of 32 x 32
// rather than 4 of 16 x 32: 16 independent accumulators a SIMD-group, and 8
// fragment loads for 16 products instead of 6 for 8 (the CUDA device: each
// product is an mma.sync whose latency the others hide). To confirm on a Mac.
#pragma once

#include "mkv_kernel.h"
#include "linear_params.h"
#include "quant.h"
#include "gemm_common.h"
#include <metal_simdgroup_matrix>

// The weight tile's element type: the weights' own for half and bfloat rows
// (exact, half the threadgroup memory, and operands a device's matrix units
// take as they are), float for f32 rows and dequantized blocks.
template <typename F> struct GemmMmaTile { typedef float type; };
template <> struct GemmMmaTile<FmtF16> { typedef half type; };
template <> struct GemmMmaTile<FmtBF16> { typedef bfloat type; };

// 4 values rounded to the tile's type (also gemm_mma16.h's activations): half
// as one 8-byte store of their bits; bfloat element by element (MSL's as_type
// does not take bfloat).
inline void gemm_tile_store(threadgroup float* t, float4 v) { *(threadgroup float4*)t = v; }
inline void gemm_tile_store(threadgroup half* t, float4 v) { *(threadgroup uint2*)t = as_type<uint2>(half4(v)); }
inline void gemm_tile_store(threadgroup bfloat* t, float4 v) {
  for (uint e = 0; e < 4; ++e) t[e] = bfloat(v[e]);
}

// One step's share of a thread, from device memory into registers: its weight
// chunks (inputs past n_in, the float formats' tails, are 0) and activation
// float4s (tokens past n_tokens and inputs past n_in are 0).
template <typename F, uint K, uint NT, uint WI, uint XI>
inline void gemm_mma_fetch(constant mkv_params::Matmul& p, const device uchar* const thread* wrow,
                           const device float* const thread* xrow, const thread bool* xlive, uint k0, uint tid,
                           thread float4* wv, thread float4* xv) {
  constexpr uint C = F::kChunk, WN = mkv_params::kGemmRows * (K / C);
  MKV_UNROLL for (uint n = 0; n < WI; ++n) {
    const uint i = tid + n * NT;
    if (WN % NT != 0 && i >= WN) break;
    const uint cc = i % (K / C);
    if (k0 + cc * C < p.n_in) {
      F::load(wrow[n], p.n_in, k0 / C + cc, wv + n * (C / 4));
    } else {
      MKV_UNROLL for (uint j = 0; j < C / 4; ++j) wv[n * (C / 4) + j] = float4(0.0f);
    }
  }
  MKV_UNROLL for (uint n = 0; n < XI; ++n) {
    const uint kk = ((tid + n * NT) % (K / 4)) * 4;
    xv[n] = xlive[n] && k0 + kk < p.n_in ? *(const device float4*)(xrow[n] + k0 + kk) : float4(0.0f);
  }
}

template <typename F, typename W>
inline void gemm_mma_body(constant mkv_params::Matmul& p,
                          const device uchar* w,     // (n_out, n_in) in format F
                          const device float* x,     // (n_tokens, n_in)
                          device float* y,           // (n_tokens, n_out)
                          const device float* bias,  // (n_out) if p.flags has kMatmulBias
                          device float* y2,          // kMatmulSplit's second and third outputs
                          device float* y3,
                          threadgroup float* xs,     // (kGemmTokens, kGemmMmaK)
                          threadgroup W* ws,         // (kGemmRows, kGemmMmaK)
                          threadgroup float* ys,     // (kGemmTokens, kGemmRows)
                          uint2 tg, uint tid, uint simd) {
  constexpr uint T = mkv_params::kGemmTokens, R = mkv_params::kGemmRows, K = mkv_params::kGemmMmaK;
  constexpr uint NT = mkv_params::kGemmMmaThreads, C = F::kChunk;
  constexpr uint WN = R * (K / C), WI = (WN + NT - 1) / NT;  // weight chunks a step, and a thread's share
  constexpr uint XI = T * K / 4 / NT;                          // activation float4s a thread copies a step
  const uint n0 = tg.x * R, t0 = tg.y * T;
  const ulong row_bytes = F::row_bytes(p.n_in);
  // What a thread stages, the same every step: its weight rows (rows past
  // n_out re-read the last row) and activation rows (past n_tokens: zeros).
  const device uchar* wrow[WI];
  for (uint n = 0; n < WI; ++n) wrow[n] = w + gemm_weight_row(p, tg.x, min(tid + n * NT, WN - 1) / (K / C)) * row_bytes;
  const device float* xrow[XI];
  bool xlive[XI];
  for (uint n = 0; n < XI; ++n) {
    const uint t = (tid + n * NT) / (K / 4);
    xlive[n] = t0 + t < p.n_tokens;
    xrow[n] = x + ulong(xlive[n] ? t0 + t : 0u) * p.n_in;
  }
  // SIMD-group s: every token of the tile (MT blocks of 8), rows 32 s .. + 32.
  constexpr uint MT = T / 8;
  const uint sr = simd * 32;
  simdgroup_float8x8 acc[MT][4];
  MKV_UNROLL for (uint i = 0; i < MT; ++i)
    MKV_UNROLL for (uint j = 0; j < 4; ++j) acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);

  // Software pipelining: the next step's weights and activations are fetched
  // into registers while this step's products run, then written to the tiles.
  float4 wv[WI * (C / 4)];
  float4 xv[XI];
  gemm_mma_fetch<F, K, NT, WI, XI>(p, wrow, xrow, xlive, 0, tid, wv, xv);
  for (uint k0 = 0; k0 < p.n_in; k0 += K) {
    MKV_UNROLL for (uint n = 0; n < WI; ++n) {
      const uint i = tid + n * NT;
      if (WN % NT != 0 && i >= WN) break;
      const uint r = i / (K / C), cc = i % (K / C);
      MKV_UNROLL for (uint j = 0; j < C / 4; ++j) gemm_tile_store(ws + r * K + cc * C + 4 * j, wv[n * (C / 4) + j]);
    }
    MKV_UNROLL for (uint n = 0; n < XI; ++n) {
      const uint i = tid + n * NT, t = i / (K / 4), kk = (i % (K / 4)) * 4;
      *(threadgroup float4*)(xs + t * K + kk) = xv[n];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (k0 + K < p.n_in) gemm_mma_fetch<F, K, NT, WI, XI>(p, wrow, xrow, xlive, k0 + K, tid, wv, xv);
    MKV_UNROLL for (uint kk = 0; kk < K; kk += 8) {
      simdgroup_float8x8 a[MT];
      simdgroup_matrix<W, 8, 8> b[4];
      MKV_UNROLL for (uint i = 0; i < MT; ++i) simdgroup_load(a[i], xs, K, ulong2(kk, 8 * i));
      MKV_UNROLL for (uint j = 0; j < 4; ++j) simdgroup_load(b[j], ws, K, ulong2(kk, sr + 8 * j), true);
      MKV_UNROLL for (uint i = 0; i < MT; ++i)
        MKV_UNROLL for (uint j = 0; j < 4; ++j) simdgroup_multiply_accumulate(acc[i][j], a[i], b[j], acc[i][j]);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);  // before the next step overwrites the tiles
  }

  MKV_UNROLL for (uint i = 0; i < MT; ++i)
    MKV_UNROLL for (uint j = 0; j < 4; ++j) simdgroup_store(acc[i][j], ys, R, ulong2(sr + 8 * j, 8 * i));
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (gemm_glu(p)) {
    constexpr uint H = R / 2;
    for (uint i = tid; i < T * H; i += NT) {
      const uint t = t0 + i / H, n = tg.x * H + i % H;
      if (t >= p.n_tokens || n >= p.n_out) continue;
      y[ulong(t) * p.n_out + n] = gemm_glu_value(p, ys[(i / H) * R + i % H], ys[(i / H) * R + H + i % H]);
    }
    return;
  }
  for (uint i = tid; i < T * R; i += NT) {
    const uint t = t0 + i / R, n = n0 + i % R;
    if (t >= p.n_tokens || n >= p.n_out) continue;
    gemm_put(p, bias, y, y2, y3, t, n, ys[i]);
  }
}
