// gemv bodies (decode): Y = X · Wᵀ (+ bias) with every weight byte read once
// per kTokens tokens. A SIMD-group owns kRows rows; its lanes stride over the
// row's chunks (quant.h), load the matching activations of each of its tokens
// once and apply them to all its rows, then reduce (four rows per simd_sum
// when kRows allows). Grid: (ceil(n_out / (kRows * simds)), ceil(n_tokens / kTokens)).
//
// Batch invariance. For every (token, row) the arithmetic is the same whatever
// kRows, kTokens and the unrolling are: lane l sums F::dot over chunks l,
// l + 32, l + 64, ... in that order, then simd_sum adds the 32 lane sums. So
// a row of a batched decode step (kTokens > 1) is bit-identical to the same
// row decoded alone (kTokens = 1): what lets many sequences share a step and
// each get exactly what it would get alone (docs/BATCHING.md).
//
// Instantiated by matmul.metal (kTokens = 1) and gemv_tokens.metal (kTokens > 1).
#pragma once

#include "mkv_kernel.h"
#include "linear_params.h"
#include "quant.h"
#include "activation.h"
#include "matmul_out.h"

// Fetch kUnroll chunks c, c + 32, ... of every row, and the matching
// activations of the first n_tok tokens (token t's row of X starts at x +
// xoff[t]; n_tok is the same for the whole threadgroup: a uniform branch).
template <typename F, uint kRows, uint kTokens, uint kUnroll>
inline void gemv_fetch(const device uchar* w, ulong row_bytes, uint n_in, thread const ulong* rows,
                       const device float* x, thread const ulong* xoff, uint n_tok, uint c,
                       thread typename F::Raw* raw, thread float4* xc) {
  constexpr uint kX = F::kChunk / 4;
  MKV_UNROLL for (uint u = 0; u < kUnroll; ++u) {
    MKV_UNROLL for (uint r = 0; r < kRows; ++r) raw[u * kRows + r] = F::fetch(w + rows[r] * row_bytes, n_in, c + 32 * u);
  }
  MKV_UNROLL for (uint t = 0; t < kTokens; ++t) {
    if (kTokens > 1 && t >= n_tok) break;
    MKV_UNROLL for (uint u = 0; u < kUnroll; ++u) {
      const device float4* xs = (const device float4*)(x + xoff[t] + (c + 32 * u) * F::kChunk);
      MKV_UNROLL for (uint i = 0; i < kX; ++i) xc[(t * kUnroll + u) * kX + i] = xs[i];
    }
  }
}
template <typename F, uint kRows, uint kTokens, uint kUnroll>
inline void gemv_apply(thread const typename F::Raw* raw, thread const float4* xc, uint n_tok, thread float* acc) {
  constexpr uint kX = F::kChunk / 4;
  MKV_UNROLL for (uint u = 0; u < kUnroll; ++u) {
    MKV_UNROLL for (uint t = 0; t < kTokens; ++t) {
      if (kTokens > 1 && t >= n_tok) break;
      thread const float4* xt = xc + (t * kUnroll + u) * kX;
      float4 xs4 = xt[0];
      for (uint i = 1; i < kX; ++i) xs4 += xt[i];
      const float xsum = xs4.x + xs4.y + xs4.z + xs4.w;
      MKV_UNROLL for (uint r = 0; r < kRows; ++r) acc[t * kRows + r] += F::dot(raw[u * kRows + r], xt, xsum);
    }
  }
}

// One lane's share of kTokens x kRows dot products: acc[t * kRows + r] = Σ
// over the lane's chunks of W[rows[r]] · X[token t]. kGpuShape (one token, R
// <= 4 rows, counting a GLU SIMD-group's 2R: GLU R = 4 would spill 0.6-2.5 KB
// on nvcc): step kGemvUnroll chunks per lane and fetch the next step's weights
// and activations before multiplying the current ones (software pipelining):
// a GPU needs several loads in flight per lane to cover DRAM latency, and nvcc
// otherwise sinks each load next to its use. Several tokens are loads in
// flight of their own; the host shapes step one chunk at a time.
//
// kStep: the lane's chunks are lane, lane + kStep, ...; 32 spreads a row over
// the SIMD-group, 1 (with lane 0) gives one lane the whole row (gemv_lanes).
template <typename F, uint kRows, uint kTokens, bool kGpuShape, uint kStep = 32>
void gemv_lane_dots(const device uchar* w, ulong row_bytes, thread const ulong* rows, const device float* x,
                    thread const ulong* xoff, uint n_tok, uint n_in, uint lane, thread float* acc) {
  // Chunks per step: 4 of 4-8 weights, 2 of 16 (two buffers of them stay in registers).
  constexpr uint kUnroll = !kGpuShape || kTokens > 1 ? 1
                           : F::kChunk >= 16           ? mkv_params::kGemvUnrollQuant
                                                       : mkv_params::kGemvUnroll;
  constexpr uint kX = F::kChunk / 4;
  static_assert(kStep == 32 || kUnroll == 1, "gemv_fetch steps unrolled chunks 32 apart");
  for (uint i = 0; i < kTokens * kRows; ++i) acc[i] = 0.0f;
  const uint n_chunks = n_in / F::kChunk;
  uint c = lane;
  if (kUnroll > 1 && c + kStep * (kUnroll - 1) < n_chunks) {
    typename F::Raw raw[kUnroll * kRows];
    float4 xc[kTokens * kUnroll * kX];
    gemv_fetch<F, kRows, kTokens, kUnroll>(w, row_bytes, n_in, rows, x, xoff, n_tok, c, raw, xc);
    for (;;) {
      const uint next = c + kStep * kUnroll;
      if (next + kStep * (kUnroll - 1) >= n_chunks) {
        gemv_apply<F, kRows, kTokens, kUnroll>(raw, xc, n_tok, acc);
        c = next;
        break;
      }
      typename F::Raw raw_next[kUnroll * kRows];
      float4 xc_next[kTokens * kUnroll * kX];
      gemv_fetch<F, kRows, kTokens, kUnroll>(w, row_bytes, n_in, rows, x, xoff, n_tok, next, raw_next, xc_next);
      gemv_apply<F, kRows, kTokens, kUnroll>(raw, xc, n_tok, acc);
      for (uint i = 0; i < kUnroll * kRows; ++i) raw[i] = raw_next[i];
      for (uint i = 0; i < kTokens * kUnroll * kX; ++i) xc[i] = xc_next[i];
      c = next;
    }
  }
  // The rest (all of it on the host and several-token shapes): one chunk at a time.
  for (; c < n_chunks; c += kStep) {
    typename F::Raw raw[kRows];
    float4 xc[kTokens * kX];
    gemv_fetch<F, kRows, kTokens, 1>(w, row_bytes, n_in, rows, x, xoff, n_tok, c, raw, xc);
    gemv_apply<F, kRows, kTokens, 1>(raw, xc, n_tok, acc);
  }
}

// The SIMD-group's sums of rows r .. r + kRowGroup<kRows> (4 at a time in one
// simd_sum(float4) when kRows allows: a quarter of the collectives).
template <uint kRows> constexpr uint row_group() { return kRows % 4 == 0 ? 4 : 1; }
template <uint kRows> inline float4 simd_sum_rows(thread const float* acc, uint r) {
  if (row_group<kRows>() == 4) return simd_sum(float4(acc[r], acc[r + 1], acc[r + 2], acc[r + 3]));
  return float4(simd_sum(acc[r]), 0.0f, 0.0f, 0.0f);
}

// The threadgroup's tokens: t0 .. t0 + kTokens - 1, of which the first n_tok
// exist (the last threadgroup row may have fewer: they are skipped, not
// computed; the accumulators of the others stay 0 and are never written).
template <uint kTokens>
inline uint gemv_tokens(uint tg_y, uint n_tokens, uint n_in, thread ulong* xoff, thread uint& n_tok) {
  const uint t0 = tg_y * kTokens;
  n_tok = min(kTokens, n_tokens - t0);
  for (uint t = 0; t < kTokens; ++t) xoff[t] = ulong(min(t0 + t, n_tokens - 1)) * n_in;
  return t0;
}

template <typename F, uint kRows, uint kTokens>
MKV_MAX_THREADS(mkv_params::kGemvSimds * 32) kernel void gemv(constant mkv_params::Matmul& p [[buffer(0)]],
                 const device uchar* w [[buffer(1)]],      // (n_out, n_in) in format F
                 const device float* x [[buffer(2)]],      // (n_tokens, n_in)
                 device float* y [[buffer(3)]],            // (n_tokens, n_out)
                 const device float* bias [[buffer(4)]],   // (n_out) if p.flags has kMatmulBias
                 uint2 tg [[threadgroup_position_in_grid]],
                 uint simd [[simdgroup_index_in_threadgroup]],
                 uint simds [[simdgroups_per_threadgroup]],
                 uint lane [[thread_index_in_simdgroup]]) {
  const uint row0 = (tg.x * simds + simd) * kRows;
  if (row0 >= p.n_out) return;  // the whole SIMD-group leaves together
  // Rows past the end re-read the last row (no branch); never written.
  ulong rows[kRows];
  for (uint r = 0; r < kRows; ++r) rows[r] = min(row0 + r, p.n_out - 1);
  ulong xoff[kTokens];
  uint n_tok;
  const uint t0 = gemv_tokens<kTokens>(tg.y, p.n_tokens, p.n_in, xoff, n_tok);
  float acc[kTokens * kRows];
  gemv_lane_dots<F, kRows, kTokens, (kRows <= mkv_params::kGemvRowsMaxGpu)>(w, F::row_bytes(p.n_in), rows, x, xoff,
                                                                           n_tok, p.n_in, lane, acc);

  for (uint t = 0; t < n_tok; ++t) {  // uniform across the SIMD-group
    device float* yt = y + ulong(t0 + t) * p.n_out;
    for (uint r = 0; r < kRows; r += row_group<kRows>()) {
      const float4 total = simd_sum_rows<kRows>(acc + t * kRows, r);
      for (uint i = 0; i < row_group<kRows>(); ++i) {
        const uint row = row0 + r + i;
        if (lane != 0 || row >= p.n_out) continue;
        matmul_put(p, bias, row, total[i], yt[row]);
      }
    }
  }
}

// GLU feed-forward input in one weight pass: y = act(x · W_gateᵀ) * (x · W_upᵀ)
// with W = [W_gate; W_up] stacked along rows. A SIMD-group computes the same
// kRows rows of both halves, so the gate and up values meet in registers.
template <typename F, typename Act, uint kRows, uint kTokens>
MKV_MAX_THREADS(mkv_params::kGemvSimds * 32) kernel void gemv_glu(constant mkv_params::Matmul& p [[buffer(0)]],  // n_out: rows per half
                     const device uchar* w [[buffer(1)]],      // (2 n_out, n_in) in format F
                     const device float* x [[buffer(2)]],      // (n_tokens, n_in)
                     device float* y [[buffer(3)]],            // (n_tokens, n_out)
                     uint2 tg [[threadgroup_position_in_grid]],
                     uint simd [[simdgroup_index_in_threadgroup]],
                     uint simds [[simdgroups_per_threadgroup]],
                     uint lane [[thread_index_in_simdgroup]]) {
  const uint row0 = (tg.x * simds + simd) * kRows;
  if (row0 >= p.n_out) return;  // the whole SIMD-group leaves together
  ulong rows[2 * kRows];  // gate rows, then the matching up rows
  for (uint r = 0; r < kRows; ++r) {
    rows[r] = min(row0 + r, p.n_out - 1);
    rows[kRows + r] = p.n_out + rows[r];
  }
  ulong xoff[kTokens];
  uint n_tok;
  const uint t0 = gemv_tokens<kTokens>(tg.y, p.n_tokens, p.n_in, xoff, n_tok);
  float acc[kTokens * 2 * kRows];
  gemv_lane_dots<F, 2 * kRows, kTokens, (2 * kRows <= mkv_params::kGemvRowsMaxGpu)>(w, F::row_bytes(p.n_in), rows, x,
                                                                                   xoff, n_tok, p.n_in, lane, acc);

  for (uint t = 0; t < n_tok; ++t) {  // uniform across the SIMD-group
    device float* yt = y + ulong(t0 + t) * p.n_out;
    for (uint r = 0; r < kRows; r += row_group<kRows>()) {
      const float4 gate = simd_sum_rows<kRows>(acc + t * 2 * kRows, r);
      const float4 up = simd_sum_rows<kRows>(acc + t * 2 * kRows, kRows + r);
      for (uint i = 0; i < row_group<kRows>(); ++i) {
        const uint row = row0 + r + i;
        if (lane == 0 && row < p.n_out) yt[row] = Act::apply(gate[i]) * up[i];
      }
    }
  }
}

// The host's wide shape (gemv_<fmt>_r32, kGemvRowsWide rows, one SIMD-group):
// lane l owns row row0 + l whole and sums its chunks in order, so no lane ever
// waits for another. On the host executor every simd_sum is a rendezvous of 32
// fibers, a switch in and out per lane, which cost more than the arithmetic of
// the 32-row simd_sum form this replaced (docs/KERNELS.md, "Decode step on the
// host executor"); here a lane runs from start to return. Each (token, row)
// sums the same chunks in the same order whatever kTokens, so the several-token
// form is bit-identical to one token (batch invariance within this shape; the
// simd_sum shapes above are a family of their own). A GPU would read a row per
// lane, strided: GPUs never pick this shape.
template <typename F, uint kTokens>
MKV_MAX_THREADS(mkv_params::kGemvRowsWide) kernel void gemv_lanes(constant mkv_params::Matmul& p [[buffer(0)]],
                 const device uchar* w [[buffer(1)]],      // (n_out, n_in) in format F
                 const device float* x [[buffer(2)]],      // (n_tokens, n_in)
                 device float* y [[buffer(3)]],            // (n_tokens, n_out)
                 const device float* bias [[buffer(4)]],   // (n_out) if p.flags has kMatmulBias
                 uint2 tg [[threadgroup_position_in_grid]],
                 uint lane [[thread_index_in_threadgroup]]) {
  const uint row = tg.x * mkv_params::kGemvRowsWide + lane;
  if (row >= p.n_out) return;
  const ulong rows[1] = {row};
  ulong xoff[kTokens];
  uint n_tok;
  const uint t0 = gemv_tokens<kTokens>(tg.y, p.n_tokens, p.n_in, xoff, n_tok);
  float acc[kTokens];
  gemv_lane_dots<F, 1, kTokens, false, 1>(w, F::row_bytes(p.n_in), rows, x, xoff, n_tok, p.n_in, 0, acc);
  for (uint t = 0; t < n_tok; ++t) {
    device float* yt = y + ulong(t0 + t) * p.n_out;
    matmul_put(p, bias, row, acc[t], yt[row]);
  }
}

// gemv_glu in the same form: lane l owns gate row row0 + l and its up row.
template <typename F, typename Act, uint kTokens>
MKV_MAX_THREADS(mkv_params::kGemvRowsWide) kernel void gemv_glu_lanes(constant mkv_params::Matmul& p [[buffer(0)]],
                     const device uchar* w [[buffer(1)]],      // (2 n_out, n_in) in format F
                     const device float* x [[buffer(2)]],      // (n_tokens, n_in)
                     device float* y [[buffer(3)]],            // (n_tokens, n_out)
                     uint2 tg [[threadgroup_position_in_grid]],
                     uint lane [[thread_index_in_threadgroup]]) {
  const uint row = tg.x * mkv_params::kGemvRowsWide + lane;
  if (row >= p.n_out) return;
  const ulong rows[2] = {row, ulong(p.n_out) + row};  // gate, up
  ulong xoff[kTokens];
  uint n_tok;
  const uint t0 = gemv_tokens<kTokens>(tg.y, p.n_tokens, p.n_in, xoff, n_tok);
  float acc[kTokens * 2];
  gemv_lane_dots<F, 2, kTokens, false, 1>(w, F::row_bytes(p.n_in), rows, x, xoff, n_tok, p.n_in, 0, acc);
  for (uint t = 0; t < n_tok; ++t) y[ulong(t0 + t) * p.n_out + row] = Act::apply(acc[t * 2]) * acc[t * 2 + 1];
}

// Instantiation: MKV_GEMV_SHAPE(q4_1_r2, FmtQ4_1, 2, 1) makes gemv_q4_1_r2,
// gemv_swiglu_q4_1_r2 and gemv_geglu_q4_1_r2 (the host builds the same names:
// cpp/ops/linear.cpp gemv_name). Names are single literals (stringized after pasting).
#define MKV_GEMV(name, ...) MKV_KERNEL(MKV_STR(name), __VA_ARGS__)
#define MKV_GEMV_SHAPE(name, F, R, T)                          \
  MKV_GEMV(gemv_##name, gemv<F, R, T>)                         \
  MKV_GEMV(gemv_swiglu_##name, gemv_glu<F, ActSilu, R, T>)     \
  MKV_GEMV(gemv_geglu_##name, gemv_glu<F, ActGeluTanh, R, T>)
// The wide shape: MKV_GEMV_LANES_SHAPE(q4_1_r32, FmtQ4_1, 1) makes gemv_q4_1_r32, ...
#define MKV_GEMV_LANES_SHAPE(name, F, T)                          \
  MKV_GEMV(gemv_##name, gemv_lanes<F, T>)                         \
  MKV_GEMV(gemv_swiglu_##name, gemv_glu_lanes<F, ActSilu, T>)     \
  MKV_GEMV(gemv_geglu_##name, gemv_glu_lanes<F, ActGeluTanh, T>)
// The format the GPU shapes read: f16 and bf16 in 8-weight chunks.
#define MKV_GEMV_GPU_FORMAT_f32(F) F
#define MKV_GEMV_GPU_FORMAT_f16(F) FmtF16x8
#define MKV_GEMV_GPU_FORMAT_bf16(F) FmtBF16x8
#define MKV_GEMV_GPU_FORMAT_q8_0(F) F
#define MKV_GEMV_GPU_FORMAT_q4_0(F) F
#define MKV_GEMV_GPU_FORMAT_q4_1(F) F
#define MKV_GEMV_GPU_FORMAT_q5_0(F) F
#define MKV_GEMV_GPU_FORMAT_q5_1(F) F
#define MKV_GEMV_GPU_FORMAT_q4_k(F) F
#define MKV_GEMV_GPU_FORMAT_q5_k(F) F
#define MKV_GEMV_GPU_FORMAT_q6_k(F) F
