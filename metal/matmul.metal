// Linear layers: Y = X · Wᵀ (+ bias), W (n_out, n_in) row-major in one of
// the formats of quant.h (f32, f16, bf16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
// Q4_K, Q5_K, Q6_K), activations float. Two kernel shapes:
//
//   gemv_<fmt>_r<R>  decode. Memory bound: every weight byte is read exactly
//               once. A SIMD-group owns R rows; its lanes stride over the row's
//               chunks (quant.h), kGemvUnroll chunks per step, load the matching
//               activations once and apply them to all its rows, then reduce
//               (four rows per simd_sum when R allows).
//               Grid: (ceil(n_out / (R * simds)), n_tokens).
//   gemv_swiglu_<fmt>, gemv_geglu_<fmt>  decode of a GLU feed-forward: gate
//               and up stacked in one matrix, act(gate) * up written directly.
//   gemm_<fmt>  prefill. A threadgroup computes a kGemmTokens x kGemmRows tile
//               of Y: per step of kGemmK inputs it dequantizes the weight tile and
//               the activation tile into threadgroup memory, so each weight
//               block read serves kGemmTokens tokens. Each thread computes kTM
//               tokens x 4 rows. Grid: (ceil(n_out / 64), ceil(n_tokens / 32)).
//
// gemv and gemm add to what y holds when p.flags has kMatmulAccumulate (a
// fused residual add).
//
// The host functions that build these names and geometries: cpp/ops/linear.cpp.
#include "mkv_kernel.h"
#include "linear_params.h"
#include "quant.h"
#include "activation.h"

// Geometry shared with the host (linear_params.h).
using mkv_params::kGemvRows;
using mkv_params::kGemmTokens;
using mkv_params::kGemmRows;
using mkv_params::kGemmK;
using mkv_params::kGemmThreads;
// Tokens per gemm thread: the threads cover the 64 rows 4 at a time.
constant constexpr uint kTM = kGemmTokens / (kGemmThreads / (kGemmRows / 4));

// Fetch kUnroll chunks c, c + stride, ... for every row, and their activations.
template <typename F, uint kRows, uint kUnroll>
inline void gemv_fetch(const device uchar* w, ulong row_bytes, uint n_in, thread const ulong* rows,
                       const device float* xt, uint c, thread typename F::Raw* raw, thread float4* xc) {
  constexpr uint kX = F::kChunk / 4;
  MKV_UNROLL for (uint u = 0; u < kUnroll; ++u) {
    MKV_UNROLL for (uint r = 0; r < kRows; ++r) raw[u * kRows + r] = F::fetch(w + rows[r] * row_bytes, n_in, c + 32 * u);
  }
  MKV_UNROLL for (uint u = 0; u < kUnroll; ++u) {
    MKV_UNROLL for (uint i = 0; i < kX; ++i) xc[u * kX + i] = ((const device float4*)(xt + (c + 32 * u) * F::kChunk))[i];
  }
}
template <typename F, uint kRows, uint kUnroll>
inline void gemv_apply(thread const typename F::Raw* raw, thread const float4* xc, thread float* acc) {
  constexpr uint kX = F::kChunk / 4;
  MKV_UNROLL for (uint u = 0; u < kUnroll; ++u) {
    float4 xs4 = xc[u * kX];
    for (uint i = 1; i < kX; ++i) xs4 += xc[u * kX + i];
    const float xsum = xs4.x + xs4.y + xs4.z + xs4.w;
    MKV_UNROLL for (uint r = 0; r < kRows; ++r) acc[r] += F::dot(raw[u * kRows + r], xc + u * kX, xsum);
  }
}

// One lane's share of kRows dot products: acc[r] = Σ over the lane's chunks
// of W[rows[r]] · x. The lanes stride over the chunks, load the matching
// activations once and apply them to every row. kGpuShape (R <= 4 rows,
// counting a GLU SIMD-group's 2R: GLU R = 4 would spill 0.6-2.5 KB on nvcc):
// step kGemvUnroll chunks per lane and fetch the next step's weights and
// activations before multiplying the current ones (software pipelining):
// a GPU needs several loads in flight per lane to cover DRAM latency, and
// nvcc otherwise sinks each load next to its use. The host shapes step one
// chunk at a time.
template <typename F, uint kRows, bool kGpuShape>
void gemv_lane_dots(const device uchar* w, ulong row_bytes, thread const ulong* rows,
                    const device float* xt, uint n_in, uint lane, thread float* acc) {
  // Chunks per step: 4 of 4-8 weights, 2 of 16 (two buffers of them stay in registers).
  constexpr uint kUnroll = !kGpuShape ? 1
                           : F::kChunk >= 16                   ? mkv_params::kGemvUnrollQuant
                                                                : mkv_params::kGemvUnroll;
  constexpr uint kX = F::kChunk / 4;
  for (uint r = 0; r < kRows; ++r) acc[r] = 0.0f;
  const uint n_chunks = n_in / F::kChunk;
  uint c = lane;
  if (kUnroll > 1 && c + 32 * (kUnroll - 1) < n_chunks) {
    typename F::Raw raw[kUnroll * kRows];
    float4 xc[kUnroll * kX];
    gemv_fetch<F, kRows, kUnroll>(w, row_bytes, n_in, rows, xt, c, raw, xc);
    for (;;) {
      const uint next = c + 32 * kUnroll;
      if (next + 32 * (kUnroll - 1) >= n_chunks) {
        gemv_apply<F, kRows, kUnroll>(raw, xc, acc);
        c = next;
        break;
      }
      typename F::Raw raw_next[kUnroll * kRows];
      float4 xc_next[kUnroll * kX];
      gemv_fetch<F, kRows, kUnroll>(w, row_bytes, n_in, rows, xt, next, raw_next, xc_next);
      gemv_apply<F, kRows, kUnroll>(raw, xc, acc);
      for (uint i = 0; i < kUnroll * kRows; ++i) raw[i] = raw_next[i];
      for (uint i = 0; i < kUnroll * kX; ++i) xc[i] = xc_next[i];
      c = next;
    }
  }
  // The rest (all of it on the host shapes): one chunk at a time.
  for (; c < n_chunks; c += 32) {
    typename F::Raw raw[kRows];
    float4 xc[kX];
    gemv_fetch<F, kRows, 1>(w, row_bytes, n_in, rows, xt, c, raw, xc);
    gemv_apply<F, kRows, 1>(raw, xc, acc);
  }
}

// The SIMD-group's sums of rows r .. r + kRowGroup<kRows> (4 at a time in one
// simd_sum(float4) when kRows allows: a quarter of the collectives).
template <uint kRows> constexpr uint row_group() { return kRows % 4 == 0 ? 4 : 1; }
template <uint kRows> inline float4 simd_sum_rows(thread const float* acc, uint r) {
  if (row_group<kRows>() == 4) return simd_sum(float4(acc[r], acc[r + 1], acc[r + 2], acc[r + 3]));
  return float4(simd_sum(acc[r]), 0.0f, 0.0f, 0.0f);
}

template <typename F, uint kRows>
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
  float acc[kRows];
  gemv_lane_dots<F, kRows, (kRows <= mkv_params::kGemvRowsMaxGpu)>(w, F::row_bytes(p.n_in), rows, x + ulong(tg.y) * p.n_in, p.n_in, lane, acc);

  device float* yt = y + ulong(tg.y) * p.n_out;
  for (uint r = 0; r < kRows; r += row_group<kRows>()) {
    const float4 total = simd_sum_rows<kRows>(acc, r);
    for (uint i = 0; i < row_group<kRows>(); ++i) {
      const uint row = row0 + r + i;
      if (lane != 0 || row >= p.n_out) continue;
      const float out = total[i] + ((p.flags & mkv_params::kMatmulBias) ? bias[row] : 0.0f);
      yt[row] = (p.flags & mkv_params::kMatmulAccumulate) ? yt[row] + out : out;  // the residual add, fused
    }
  }
}

// GLU feed-forward input in one weight pass: y = act(x · W_gateᵀ) * (x · W_upᵀ)
// with W = [W_gate; W_up] stacked along rows. A SIMD-group computes the same
// kRows rows of both halves, so the gate and up values meet in registers.
template <typename F, typename Act, uint kRows>
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
  float acc[2 * kRows];
  gemv_lane_dots<F, 2 * kRows, (2 * kRows <= mkv_params::kGemvRowsMaxGpu)>(w, F::row_bytes(p.n_in), rows, x + ulong(tg.y) * p.n_in, p.n_in, lane, acc);

  device float* yt = y + ulong(tg.y) * p.n_out;
  for (uint r = 0; r < kRows; r += row_group<kRows>()) {
    const float4 gate = simd_sum_rows<kRows>(acc, r);
    const float4 up = simd_sum_rows<kRows>(acc, kRows + r);
    for (uint i = 0; i < row_group<kRows>(); ++i) {
      const uint row = row0 + r + i;
      if (lane == 0 && row < p.n_out) yt[row] = Act::apply(gate[i]) * up[i];
    }
  }
}

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

// One instance per kernel shape, weight format and gemv width; the host
// builds the same names (cpp/ops/linear.cpp: gemv_name). gemv_<fmt> has 8 rows
// per SIMD-group (the host executor's f16 shape), gemv_<fmt>_r32 32 (its shape
// for the other formats); gemv_<fmt>_r1, _r2, _r4 are the GPU shapes (the op
// picks R from the device's wave). On those, f16 and bf16 read 8-weight
// chunks with one 16-byte load (FmtF16x8) and need 16-byte aligned rows;
// gemv_f16_c4_r<R> is the 4-weight fallback for other rows. Names are single
// literals (stringized after pasting), e.g. "gemv_swiglu_q4_1_r32".
#define MKV_GEMV(name, ...) MKV_KERNEL(MKV_STR(name), __VA_ARGS__)
#define MKV_GEMV_SHAPE(name, F, R)                             \
  MKV_GEMV(gemv_##name, gemv<F, R>)                            \
  MKV_GEMV(gemv_swiglu_##name, gemv_glu<F, ActSilu, R>)        \
  MKV_GEMV(gemv_geglu_##name, gemv_glu<F, ActGeluTanh, R>)
#define MKV_GEMV_GPU_SHAPES(fmt, F) \
  MKV_GEMV_SHAPE(fmt##_r1, F, 1)    \
  MKV_GEMV_SHAPE(fmt##_r2, F, 2)    \
  MKV_GEMV_SHAPE(fmt##_r4, F, 4)
#define MKV_GEMV_FORMAT(fmt, F)                             \
  MKV_GEMV_SHAPE(fmt, F, mkv_params::kGemvRows)             \
  MKV_GEMV_SHAPE(fmt##_r32, F, mkv_params::kGemvRowsWide)   \
  MKV_GEMV_GPU_SHAPES(fmt, MKV_GEMV_GPU_FORMAT_##fmt(F))
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
#define MKV_GEMM_FORMAT(fmt, F) MKV_GEMV(gemm_##fmt, gemm<F>)
MKV_FOR_EACH_FORMAT(MKV_GEMV_FORMAT)
MKV_GEMV_GPU_SHAPES(f16_c4, FmtF16)
MKV_GEMV_GPU_SHAPES(bf16_c4, FmtBF16)
MKV_FOR_EACH_FORMAT(MKV_GEMM_FORMAT)
