// The host executor's shape of the prefill gemm (gemm_<fmt>_h, built for the
// host only; the GPU shape is gemm.h). Same grid and tile of Y as the GPU
// shape (kGemmTokens tokens x kGemmRows rows a threadgroup), but a lane owns
// kGemmHostRows whole rows of it over all the tile's tokens and reads its own
// weights and activations: no threadgroup memory, no barrier. The GPU shape's
// two barriers per kGemmK inputs are, on the host, two switches through all
// 64 fibers; with the tiles staged through threadgroup memory element by
// element they were most of a long prompt's prefill.
//
// Per step of kGemmHostK inputs a lane dequantizes its rows' chunks once, turns
// them k-major (a float4 holds 4 rows at one input), then for each 8-token
// slice of the tile adds x[t][k] * w[k][rows] into accumulators held in
// registers for the slice (8 tokens x 8 rows: 16 float4) and kept in the
// lane's stack between slices.
//
// Same results, bit for bit, as the GPU shape: each output sums its products
// x[t][k] * w[n][k] from 0 in increasing k, one rounding per multiply and per
// add, with the same dequantized weights (F::load), then adds the bias (or
// 0.0f) and what y holds when accumulating. The GPU shape's zero products past
// n_in (its last step of kGemmK) only turn a -0.0 sum into +0.0, which the
// epilogue's + 0.0f does as well, so they are not replayed here.
#pragma once

#include "mkv_kernel.h"
#include "linear_params.h"
#include "quant.h"
#include "gemm_common.h"

constant constexpr uint kGemmHostSlice = 8;  // tokens whose accumulators a lane holds in registers at once
constant constexpr uint kGemmHostK = 16;     // inputs per step: one quantized chunk, four float ones

template <typename F>
inline void gemm_host_body(constant mkv_params::Matmul& p,
                           const device uchar* w,     // (n_out, n_in) in format F
                           const device float* x,     // (n_tokens, n_in)
                           device float* y,           // (n_tokens, n_out)
                           const device float* bias,  // (n_out) if p.flags has kMatmulBias
                           device float* y2,          // kMatmulSplit's second and third outputs
                           device float* y3,
                           uint2 tg, uint lane) {
  constexpr uint HR = mkv_params::kGemmHostRows, R4 = HR / 4, C = F::kChunk;
  constexpr uint T = mkv_params::kGemmTokens, S = kGemmHostSlice;
  static_assert(kGemmHostK % C == 0 && HR % 4 == 0 && T % S == 0, "whole chunks, float4s of rows, slices");
  // A lane's rows: HR consecutive ones, or for a GLU 4 gate rows and the same 4 up rows
  // (gemm_common.h), so the epilogue has both sums of its outputs.
  const bool glu = gemm_glu(p);
  const uint n0 = tg.x * gemm_tile_outputs(p) + lane * (glu ? HR / 2 : HR);  // the lane's first output
  const uint t0 = tg.y * T;
  if (n0 >= p.n_out) return;  // no collective below: an idle lane is fine
  const uint slices = (min(T, p.n_tokens - t0) + S - 1) / S;

  // Rows past n_out re-read the last row, tokens past n_tokens the last token:
  // their sums are computed and never stored.
  const ulong row_bytes = F::row_bytes(p.n_in);
  const device uchar* wr[HR];
  for (uint r = 0; r < HR; ++r)
    wr[r] = w + row_bytes * gemm_weight_row(p, tg.x, glu ? (r < HR / 2 ? 0u : mkv_params::kGemmRows / 2) +
                                                           lane * (HR / 2) + r % (HR / 2)
                                                     : lane * HR + r);
  float4 acc[T][R4];
  for (uint t = 0; t < T; ++t)
    for (uint r4 = 0; r4 < R4; ++r4) acc[t][r4] = float4(0.0f);

  for (uint k0 = 0; k0 < p.n_in; k0 += kGemmHostK) {
    const uint len = min(kGemmHostK, p.n_in - k0);  // float formats: a tail of whole chunks of 4
    // The step's weights, k-major: wk[j][r4] = rows 4 r4 .. 4 r4 + 3 at input k0 + j.
    float4 wk[kGemmHostK][R4];
    for (uint c = 0; c * C < len; ++c)
      for (uint r4 = 0; r4 < R4; ++r4) {
        float4 v[4][C / 4];
        for (uint i = 0; i < 4; ++i) F::load(wr[4 * r4 + i], p.n_in, k0 / C + c, v[i]);
        for (uint j = 0; j < C; ++j)
          wk[c * C + j][r4] = float4(v[0][j / 4][j % 4], v[1][j / 4][j % 4], v[2][j / 4][j % 4], v[3][j / 4][j % 4]);
      }
    for (uint s = 0; s < slices; ++s) {
      const device float* xs[S];
      for (uint i = 0; i < S; ++i) xs[i] = x + ulong(min(t0 + s * S + i, p.n_tokens - 1)) * p.n_in + k0;
      float4 a[S][R4];  // the slice's sums, in registers for the step
      for (uint i = 0; i < S; ++i)
        for (uint r4 = 0; r4 < R4; ++r4) a[i][r4] = acc[s * S + i][r4];
      for (uint j = 0; j < len; ++j)
        for (uint i = 0; i < S; ++i) {
          const float xv = xs[i][j];
          for (uint r4 = 0; r4 < R4; ++r4) a[i][r4] += xv * wk[j][r4];
        }
      for (uint i = 0; i < S; ++i)
        for (uint r4 = 0; r4 < R4; ++r4) acc[s * S + i][r4] = a[i][r4];
    }
  }

  if (glu) {
    static_assert(R4 == 2, "a GLU lane holds one float4 of gate rows and one of up rows");
    for (uint i = 0; i < slices * S; ++i)
      for (uint j = 0; j < HR / 2; ++j) {
        const uint t = t0 + i, n = n0 + j;
        if (t < p.n_tokens && n < p.n_out) y[ulong(t) * p.n_out + n] = gemm_glu_value(p, acc[i][0][j], acc[i][1][j]);
      }
    return;
  }
  for (uint i = 0; i < slices * S; ++i) {
    const uint t = t0 + i;
    for (uint j = 0; j < HR; ++j) {
      const uint n = n0 + j;
      if (t >= p.n_tokens || n >= p.n_out) continue;
      gemm_put(p, bias, y, y2, y3, t, n, acc[i][j / 4][j % 4]);
    }
  }
}
