// The prefill gemm with 16-bit operands on matrix units (gemm_mma_<fmt>_x16,
// MatmulArgs::activations_16bit): f16 or bf16 weights, the activations rounded
// to the weights' type as they are staged, float sums. The towers' gemm.
//
// With both operands 16-bit the products are cheap, so what a tile reads has
// to be worth more of them than gemm_mma.h's 32 x 64 tile: a threadgroup here
// covers kGemm16Tokens x kGemm16Rows (64 x 128) outputs with 8 SIMD-groups,
// each 32 tokens x 32 rows (4 x 4 accumulators), and reads 32 inputs a step
// (weights as their bits, 8 bytes a copy; activations as float4, rounded). Per
// input step the tile reads 128 x 2 + 64 x 4 bytes for 64 x 128 products: half
// gemm_mma.h's bytes per product, which on the H100 bounded it at the L2
// (docs/KERNELS.md "16-bit operands"). The next step is fetched into registers
// while this one's products run. Products go in 2 x 2 groups
// (simdgroup_tile.h: one m16n8k16 on the CUDA device).
//
// The tiles' rows are kGemm16Stride halves apart (32 inputs and 8 of padding):
// a fragment's 8 rows then start in 8 different groups of 4 banks, so its loads
// do not conflict. The epilogue (bias, the fused residual add, the q/k/v split)
// writes each lane's fragment elements where fragment.h says they sit; no GLU.
//
// Every output is the sum of its products in increasing k, one rounding per
// operation where products follow the host's documented order (the host):
// there it is gemm_gpu's sum of the rounded activations to the bit. A token's
// outputs never depend on the tile's other tokens.
#pragma once

#include "mkv_kernel.h"
#include "linear_params.h"
#include "gemm_common.h"
#include "gemm_mma.h"  // gemm_tile_store
#include "fragment.h"
#include "simdgroup_tile.h"

// One step's share of a thread, from device memory into registers: WI weight
// pieces (4 inputs of one row, as bits; inputs past n_in are 0) and XI
// activation float4s (tokens past n_tokens and inputs past n_in are 0).
template <uint WI, uint XI>
inline void gemm16_fetch(constant mkv_params::Matmul& p, const device uchar* const thread* wrow,
                         const device float* const thread* xrow, const thread bool* xlive, uint k0, uint tid,
                         thread uint2* wv, thread float4* xv) {
  constexpr uint NT = mkv_params::kGemm16Threads, K = mkv_params::kGemmMmaK;
  MKV_UNROLL for (uint n = 0; n < WI; ++n) {
    const uint kk = ((tid + n * NT) % (K / 4)) * 4;
    wv[n] = k0 + kk < p.n_in ? ((const device uint2*)wrow[n])[(k0 + kk) / 4] : uint2(0u);
  }
  MKV_UNROLL for (uint n = 0; n < XI; ++n) {
    const uint kk = ((tid + n * NT) % (K / 4)) * 4;
    xv[n] = xlive[n] && k0 + kk < p.n_in ? *(const device float4*)(xrow[n] + k0 + kk) : float4(0.0f);
  }
}

template <typename X>
inline void gemm_mma16_body(constant mkv_params::Matmul& p,
                            const device uchar* w,     // (n_out, n_in) in X's type (f16 or bf16 rows)
                            const device float* x,     // (n_tokens, n_in)
                            device float* y,           // (n_tokens, n_out)
                            const device float* bias,  // (n_out) if p.flags has kMatmulBias
                            device float* y2,          // kMatmulSplit's second and third outputs
                            device float* y3,
                            threadgroup X* xs,         // (kGemm16Tokens, kGemm16Stride)
                            threadgroup X* ws,         // (kGemm16Rows, kGemm16Stride)
                            uint2 tg, uint tid, uint simd, uint lane) {
  constexpr uint T = mkv_params::kGemm16Tokens, R = mkv_params::kGemm16Rows, K = mkv_params::kGemmMmaK;
  constexpr uint NT = mkv_params::kGemm16Threads, S = mkv_params::kGemm16Stride;
  constexpr uint WI = R * K / 4 / NT, XI = T * K / 4 / NT;  // a thread's weight pieces and activation float4s a step
  const uint n0 = tg.x * R, t0 = tg.y * T;
  const ulong row_bytes = ulong(p.n_in) * 2;
  // What a thread stages, the same every step: its weight rows (rows past
  // n_out re-read the last row) and activation rows (past n_tokens: zeros).
  const device uchar* wrow[WI];
  MKV_UNROLL for (uint n = 0; n < WI; ++n)
    wrow[n] = w + ulong(min(n0 + (tid + n * NT) / (K / 4), p.n_out - 1)) * row_bytes;
  const device float* xrow[XI];
  bool xlive[XI];
  MKV_UNROLL for (uint n = 0; n < XI; ++n) {
    const uint t = (tid + n * NT) / (K / 4);
    xlive[n] = t0 + t < p.n_tokens;
    xrow[n] = x + ulong(xlive[n] ? t0 + t : 0u) * p.n_in;
  }
  // SIMD-group s: tokens 32 (s % 2) .. + 32, rows 32 (s / 2) .. + 32.
  const uint st = (simd % 2) * 32, sr = (simd / 2) * 32;
  simdgroup_float8x8 acc[4][4];
  MKV_UNROLL for (uint i = 0; i < 4; ++i)
    MKV_UNROLL for (uint j = 0; j < 4; ++j) acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);

  uint2 wv[WI];
  float4 xv[XI];
  gemm16_fetch<WI, XI>(p, wrow, xrow, xlive, 0, tid, wv, xv);
  for (uint k0 = 0; k0 < p.n_in; k0 += K) {
    MKV_UNROLL for (uint n = 0; n < WI; ++n) {
      const uint i = tid + n * NT;
      *(threadgroup uint2*)(ws + (i / (K / 4)) * S + (i % (K / 4)) * 4) = wv[n];
    }
    MKV_UNROLL for (uint n = 0; n < XI; ++n) {
      const uint i = tid + n * NT;
      gemm_tile_store(xs + (i / (K / 4)) * S + (i % (K / 4)) * 4, xv[n]);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (k0 + K < p.n_in) gemm16_fetch<WI, XI>(p, wrow, xrow, xlive, k0 + K, tid, wv, xv);
    MKV_UNROLL for (uint kk = 0; kk < K; kk += 16) {
      simdgroup_matrix<X, 8, 8> a[4][2], b[4][2];
      MKV_UNROLL for (uint i = 0; i < 4; ++i)
        MKV_UNROLL for (uint h = 0; h < 2; ++h) simdgroup_load(a[i][h], xs, S, ulong2(kk + 8 * h, st + 8 * i));
      MKV_UNROLL for (uint j = 0; j < 4; ++j)
        MKV_UNROLL for (uint h = 0; h < 2; ++h) simdgroup_load(b[j][h], ws, S, ulong2(kk + 8 * h, sr + 8 * j), true);
      MKV_UNROLL for (uint i = 0; i < 4; i += 2)
        MKV_UNROLL for (uint j = 0; j < 4; ++j)
          simdgroup_mma_2x2(acc[i][j], acc[i + 1][j], a[i][0], a[i][1], a[i + 1][0], a[i + 1][1], b[j][0], b[j][1]);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);  // before the next step overwrites the tiles
  }

  // Each lane writes its two elements of every fragment (fragment.h's layout).
  const uint fr = fragment_row(lane), fc = fragment_col(lane);
  MKV_UNROLL for (uint i = 0; i < 4; ++i) {
    const uint t = t0 + st + 8 * i + fr;
    if (t >= p.n_tokens) continue;
    MKV_UNROLL for (uint j = 0; j < 4; ++j) {
      MKV_UNROLL for (uint e = 0; e < 2; ++e) {
        const uint n = n0 + sr + 8 * j + fc + e;
        if (n >= p.n_out) continue;
        device float& out = gemm_out(p, y, y2, y3, t, n);
        const float v = acc[i][j].thread_elements()[e] + ((p.flags & mkv_params::kMatmulBias) ? bias[n] : 0.0f);
        out = (p.flags & mkv_params::kMatmulAccumulate) ? out + v : v;  // the residual add, fused
      }
    }
  }
}
