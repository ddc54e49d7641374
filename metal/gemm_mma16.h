// The prefill gemm with 16-bit operands on matrix units (gemm_mma_<fmt>_x16,
// MatmulArgs::activations_16bit): f16 or bf16 weights, the activations rounded
// to the weights' type as they are staged, float sums. The towers' gemm.
//
// With both operands 16-bit the products are cheap, so what a tile reads has
// to be worth more of them than gemm_mma.h's 32 x 64 tile: a threadgroup here
// covers kGemm16Tokens x kGemm16Rows (128 x 128) outputs with 16 SIMD-groups,
// each 32 tokens x 32 rows (4 x 4 accumulators), and reads 32 inputs a step
// (weights as their bits, 8 bytes a copy; activations as float4, rounded). Per
// input step the tile reads 128 x 2 + 128 x 4 bytes for 128 x 128 products: a
// quarter fewer bytes per product than a 64 x 128 tile (the first form, 1.5
// bytes a product against 2); on the H100 that first form waited on these
// reads (docs/KERNELS.md "16-bit operands"). Each thread stages 2 weight pieces
// and 2 activation float4s a step, few enough registers to hold kGemm16Depth
// (4) steps in flight: a fetch is issued four steps before its data is staged.
// Products go in 2 x 2 groups (simdgroup_tile.h: one m16n8k16 on the CUDA
// device). The body takes the geometry as template arguments; other shapes
// (larger SIMD-group tiles, 64 inputs a step) were slower or no faster on the
// H100 (docs/KERNELS.md, issue 38's seventh round).
//
// The tiles' rows are padded (gemm16_stride) so fragment loads do not
// conflict. The epilogue (matmul_out.h: bias, gelu, the fused residual
// add; the q/k/v split) writes each lane's fragment elements where fragment.h
// says they sit; no GLU.
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

// Tile rows are K + 8 halves apart (32 inputs and 8 of padding): a fragment's
// 8 rows then start in 8 different groups of 4 banks.
constexpr uint gemm16_stride(uint K) { return K + 8; }

// One step's share of a thread, from device memory into registers: WI weight
// pieces (4 inputs of one row, as bits; inputs past n_in are 0) and XI
// activation float4s (tokens past n_tokens and inputs past n_in are 0).
template <uint WI, uint XI, uint NT, uint K>
inline void gemm16_fetch(constant mkv_params::Matmul& p, const device uchar* const thread* wrow,
                         const device float* const thread* xrow, const thread bool* xlive, uint k0, uint tid,
                         thread uint2* wv, thread float4* xv) {
  MKV_UNROLL for (uint n = 0; n < WI; ++n) {
    const uint kk = ((tid + n * NT) % (K / 4)) * 4;
    wv[n] = k0 + kk < p.n_in ? ((const device uint2*)wrow[n])[(k0 + kk) / 4] : uint2(0u);
  }
  MKV_UNROLL for (uint n = 0; n < XI; ++n) {
    const uint kk = ((tid + n * NT) % (K / 4)) * 4;
    xv[n] = xlive[n] && k0 + kk < p.n_in ? *(const device float4*)(xrow[n] + k0 + kk) : float4(0.0f);
  }
}

// One step's products: SIMD-group (st, sr)'s (8 MI) x (8 NJ) block of the tile, 2 x 2 groups.
template <typename X, uint MI, uint NJ, uint K>
inline void gemm16_products(threadgroup const X* xs, threadgroup const X* ws, uint st, uint sr,
                            thread simdgroup_float8x8 (&acc)[MI][NJ]) {
  constexpr uint S = gemm16_stride(K);
  MKV_UNROLL for (uint kk = 0; kk < K; kk += 16) {
    // a[i][h]: tokens st + 8i .., inputs kk + 8h ..; b[j][h]: Wᵀ, rows sr + 8j .., the same inputs
    // (each group of four in the order a 2 x 2 product takes them).
    simdgroup_matrix<X, 8, 8> a[MI][2], b[NJ][2];
    MKV_UNROLL for (uint i = 0; i < MI; i += 2) {
      const threadgroup X* t = xs + (st + 8 * i) * S + kk;
      simdgroup_load4<false>(a[i][0], a[i + 1][0], a[i][1], a[i + 1][1], t, 8 * S, 8, S);
    }
    MKV_UNROLL for (uint j = 0; j < NJ; j += 2) {
      const threadgroup X* t = ws + (sr + 8 * j) * S + kk;
      simdgroup_load4<true>(b[j][0], b[j][1], b[j + 1][0], b[j + 1][1], t, 8, 8 * S, S, true);
    }
    MKV_UNROLL for (uint i = 0; i < MI; i += 2)
      MKV_UNROLL for (uint j = 0; j < NJ; ++j)
        simdgroup_mma_2x2(acc[i][j], acc[i + 1][j], a[i][0], a[i][1], a[i + 1][0], a[i + 1][1], b[j][0], b[j][1]);
  }
}

// The tile: T tokens x R rows of outputs, K inputs a step, NT threads as
// SIMD-groups of (8 MI) tokens x (8 NJ) rows, DEPTH steps' fetches in flight.
// The kernel's shape is linear_params.h's; others were timed in issue 38's
// rounds (bench/results/h100-2026-12-07-issue38-variants/).
template <typename X, uint T, uint R, uint K, uint NT, uint MI, uint NJ, uint DEPTH>
inline void gemm_mma16_body(constant mkv_params::Matmul& p,
                            const device uchar* w,     // (n_out, n_in) in X's type (f16 or bf16 rows)
                            const device float* x,     // (n_tokens, n_in)
                            device float* y,           // (n_tokens, n_out)
                            const device float* bias,  // (n_out) if p.flags has kMatmulBias
                            device float* y2,          // kMatmulSplit's second and third outputs
                            device float* y3,
                            threadgroup X* xs,         // (T, gemm16_stride(K))
                            threadgroup X* ws,         // (R, gemm16_stride(K))
                            uint2 tg, uint tid, uint simd, uint lane) {
  constexpr uint S = gemm16_stride(K);
  constexpr uint WI = R * K / 4 / NT, XI = T * K / 4 / NT;  // a thread's weight pieces and activation float4s a step
  constexpr uint WT = T / (8 * MI);                         // SIMD-groups along the tokens
  static_assert(WT * (R / (8 * NJ)) == NT / 32, "the SIMD-groups cover the tile");
  static_assert(R * K / 4 % NT == 0 && T * K / 4 % NT == 0, "every lane stages whole pieces");
  static_assert(MI % 2 == 0 && NJ % 2 == 0 && K % 16 == 0, "fragments go in 2 x 2 groups");
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
  // SIMD-group s: tokens (8 MI)(s % WT) .., rows (8 NJ)(s / WT) ..
  const uint st = (simd % WT) * (8 * MI), sr = (simd / WT) * (8 * NJ);
  simdgroup_float8x8 acc[MI][NJ];
  MKV_UNROLL for (uint i = 0; i < MI; ++i)
    MKV_UNROLL for (uint j = 0; j < NJ; ++j) acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);

  // DEPTH steps in flight: register set h holds step k0 + h K while the steps
  // before it run, and takes the step DEPTH ahead as soon as its own is in the
  // tiles (so a fetch has about DEPTH steps' products to arrive). The loop
  // takes DEPTH steps an iteration so each set keeps its registers.
  uint2 wv[DEPTH][WI];
  float4 xv[DEPTH][XI];
  MKV_UNROLL for (uint h = 0; h < DEPTH; ++h)
    if (h * K < p.n_in) gemm16_fetch<WI, XI, NT, K>(p, wrow, xrow, xlive, h * K, tid, wv[h], xv[h]);
  for (uint k0 = 0; k0 < p.n_in; k0 += DEPTH * K) {
    MKV_UNROLL for (uint h = 0; h < DEPTH; ++h) {
      const uint k = k0 + h * K;
      if (h > 0 && k >= p.n_in) break;
      MKV_UNROLL for (uint n = 0; n < WI; ++n) {
        const uint i = tid + n * NT;
        *(threadgroup uint2*)(ws + (i / (K / 4)) * S + (i % (K / 4)) * 4) = wv[h][n];
      }
      MKV_UNROLL for (uint n = 0; n < XI; ++n) {
        const uint i = tid + n * NT;
        gemm_tile_store(xs + (i / (K / 4)) * S + (i % (K / 4)) * 4, xv[h][n]);
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
      if (k + DEPTH * K < p.n_in) gemm16_fetch<WI, XI, NT, K>(p, wrow, xrow, xlive, k + DEPTH * K, tid, wv[h], xv[h]);
      gemm16_products<X, MI, NJ, K>(xs, ws, st, sr, acc);
      threadgroup_barrier(mem_flags::mem_threadgroup);  // before the next step overwrites the tiles
    }
  }

  // Each lane writes its two elements of every fragment (fragment.h's layout).
  const uint fr = fragment_row(lane), fc = fragment_col(lane);
  MKV_UNROLL for (uint i = 0; i < MI; ++i) {
    const uint t = t0 + st + 8 * i + fr;
    if (t >= p.n_tokens) continue;
    MKV_UNROLL for (uint j = 0; j < NJ; ++j) {
      MKV_UNROLL for (uint e = 0; e < 2; ++e) {
        const uint n = n0 + sr + 8 * j + fc + e;
        if (n >= p.n_out) continue;
        gemm_put(p, bias, y, y2, y3, t, n, acc[i][j].thread_elements()[e]);
      }
    }
  }
}
