// The bodies of the transformer's small per-element and per-row kernels
// (elementwise.metal instantiates them): embedding lookup, RMSNorm, residual
// add, scale, soft-capping, SwiGLU / GeGLU, argmax, softmax. Templates over
// the weight format or the element type; activations are float (T = float).
#pragma once

#include "mkv_kernel.h"
#include "linear_params.h"
#include "quant.h"
#include "activation.h"

using mkv_params::kElementsPerThread;  // geometry shared with the host
using mkv_params::kRowSimds;

// ---- embedding: one threadgroup per token, threads over the row's chunks ----
// (dim a whole number of the format's blocks: the op checks)
template <typename F>
MKV_MAX_THREADS(mkv_params::kEmbeddingThreads) kernel void embedding(constant mkv_params::Embedding& p [[buffer(0)]],
                      const device uchar* table [[buffer(1)]],  // (vocab, dim) in format F
                      const device int* ids [[buffer(2)]],      // (n_tokens)
                      device float* out [[buffer(3)]],          // (n_tokens, dim)
                      uint t [[threadgroup_position_in_grid]],
                      uint tid [[thread_index_in_threadgroup]],
                      uint nt [[threads_per_threadgroup]]) {
  const int id = ids[t];
  const bool valid = id >= 0 && uint(id) < p.vocab;
  const device uchar* row = table + ulong(valid ? id : 0) * F::row_bytes(p.dim);
  device float* o = out + ulong(t) * p.dim;
  for (uint c = tid; c < p.dim / F::kChunk; c += nt) {
    float4 v[F::kChunk / 4];
    F::load(row, p.dim, c, v);
    for (uint i = 0; i < F::kChunk / 4; ++i)
      ((device float4*)(o + c * F::kChunk))[i] = valid ? v[i] * p.scale : float4(0.0f);
  }
}

// One per weight format of quant.h: "embedding_f16", "embedding_q4_k", ...

// ---- RMSNorm: one threadgroup per row, 1 to kRmsNormSimds SIMD-groups ------
// (the op picks: a GPU spreads a 4096-wide row over 8 SIMD-groups, where one
// SIMD-group's 128 dependent loads a lane took 60 us on an H200; the host
// executor, where every thread is a fiber, runs one). With kRmsNormVec4 (the
// op's check: dim % 4 == 0, 16-byte aligned rows, at most kRmsNormVec float4
// a thread) a thread loads its float4s once, all before the first use, and
// keeps them in registers for the output: one round trip to memory, not two
// passes of dependent loads. In place is safe: each thread reads and writes
// only its own elements, and the barrier sits between.
inline float4 weights4(const device float* w, uint j) { return ((const device float4*)w)[j]; }
inline float4 weights4(const device half* w, uint j) { return float4(((const device half4*)w)[j]); }

template <typename W>
MKV_MAX_THREADS(mkv_params::kRmsNormSimds * 32) kernel void rms_norm(constant mkv_params::RmsNorm& p [[buffer(0)]],
                     const device float* x [[buffer(1)]],  // (n_rows, dim)
                     const device W* w [[buffer(2)]],      // (dim)
                     device float* out [[buffer(3)]],      // (n_rows, dim); may be x
                     uint r [[threadgroup_position_in_grid]],
                     uint tid [[thread_index_in_threadgroup]],
                     uint nt [[threads_per_threadgroup]],
                     uint simd [[simdgroup_index_in_threadgroup]],
                     uint simds [[simdgroups_per_threadgroup]],
                     uint lane [[thread_index_in_simdgroup]]) {
  threadgroup float partial[mkv_params::kRmsNormSimds];
  const device float* xr = x + ulong(r) * p.dim;
  device float* o = out + ulong(r) * p.dim;
  const bool vec = (p.flags & mkv_params::kRmsNormVec4) != 0;
  const uint n4 = p.dim / 4;
  float4 v[mkv_params::kRmsNormVec];
  float ss = 0.0f;
  if (vec) {
    for (uint k = 0; k < mkv_params::kRmsNormVec; ++k) {
      const uint j = tid + k * nt;
      v[k] = j < n4 ? ((const device float4*)xr)[j] : float4(0.0f);
    }
    for (uint k = 0; k < mkv_params::kRmsNormVec; ++k) ss += dot(v[k], v[k]);
  } else {
    for (uint j = tid; j < p.dim; j += nt) ss += xr[j] * xr[j];
  }
  ss = simd_sum(ss);
  if (lane == 0) partial[simd] = ss;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float total = 0.0f;
  for (uint s = 0; s < simds; ++s) total += partial[s];
  const float inv = 1.0f / sqrt(total / float(p.dim) + p.eps);
  if (vec) {
    for (uint k = 0; k < mkv_params::kRmsNormVec; ++k) {
      const uint j = tid + k * nt;
      if (j < n4) ((device float4*)o)[j] = v[k] * inv * (p.w_offset + weights4(w, j));
    }
  } else {
    for (uint j = tid; j < p.dim; j += nt) o[j] = xr[j] * inv * (p.w_offset + float(w[j]));
  }
}

// ---- elementwise: thread tid of group g handles g*2048 + tid + 256k, k < 8 ----
#define MKV_FOR_EACH_ELEMENT(i)                                                   \
  for (uint k = 0, i = tg * nt * kElementsPerThread + tid; k < kElementsPerThread; \
       ++k, i += nt)                                                              \
    if (i < p.n)

template <typename T>
MKV_MAX_THREADS(mkv_params::kElementThreads) kernel void add(constant mkv_params::Elementwise& p [[buffer(0)]],
                    device T* y [[buffer(1)]],        // (n): y += x
                    const device T* x [[buffer(2)]],  // (n)
                    uint tg [[threadgroup_position_in_grid]],
                    uint tid [[thread_index_in_threadgroup]],
                    uint nt [[threads_per_threadgroup]]) {
  MKV_FOR_EACH_ELEMENT(i) y[i] += x[i];
}

template <typename T>
MKV_MAX_THREADS(mkv_params::kElementThreads) kernel void scale(constant mkv_params::Elementwise& p [[buffer(0)]],
                      device T* y [[buffer(1)]],  // (n): y *= scale
                      uint tg [[threadgroup_position_in_grid]],
                      uint tid [[thread_index_in_threadgroup]],
                      uint nt [[threads_per_threadgroup]]) {
  MKV_FOR_EACH_ELEMENT(i) y[i] *= p.scale;
}

// Logit soft-capping (Gemma 2's final_logit_softcapping): y = cap * tanh(y / cap).
template <typename T>
MKV_MAX_THREADS(mkv_params::kElementThreads) kernel void softcap(constant mkv_params::Elementwise& p [[buffer(0)]],
                        device T* y [[buffer(1)]],  // (n), p.scale = cap > 0
                        uint tg [[threadgroup_position_in_grid]],
                        uint tid [[thread_index_in_threadgroup]],
                        uint nt [[threads_per_threadgroup]]) {
  MKV_FOR_EACH_ELEMENT(i) y[i] = p.scale * tanh(y[i] / p.scale);
}

// out = act(gate) * up, act from activation.h.
template <typename Act>
MKV_MAX_THREADS(mkv_params::kElementThreads) kernel void gated(constant mkv_params::Elementwise& p [[buffer(0)]],
                  const device float* gate [[buffer(1)]],  // (n)
                  const device float* up [[buffer(2)]],    // (n)
                  device float* out [[buffer(3)]],         // (n); may be gate or up
                  uint tg [[threadgroup_position_in_grid]],
                  uint tid [[thread_index_in_threadgroup]],
                  uint nt [[threads_per_threadgroup]]) {
  MKV_FOR_EACH_ELEMENT(i) out[i] = Act::apply(gate[i]) * up[i];
}

// ---- argmax: one threadgroup per row -------------------------------------
// Each thread scans a strided slice (indices increase, so `>` keeps the
// lowest index of a tie), then SIMD and threadgroup reductions pick the
// largest value and, among equal values, the lowest index.
// The op runs kRowSimds SIMD-groups on the host and up to kArgmaxSimds on a
// GPU (a 128k vocabulary over 8 SIMD-groups took 196 us on an H200).
template <typename T>
MKV_MAX_THREADS(mkv_params::kArgmaxSimds * 32) kernel void argmax(constant mkv_params::Argmax& p [[buffer(0)]],
                       const device T* x [[buffer(1)]],  // (n_rows, n)
                       device int* out [[buffer(2)]],        // (n_rows)
                       const device uint* mask [[buffer(3)]],  // masked: ceil(n / 32) words, bit i % 32 of word i / 32
                       uint row [[threadgroup_position_in_grid]],
                       uint tid [[thread_index_in_threadgroup]],
                       uint nt [[threads_per_threadgroup]],
                       uint simd [[simdgroup_index_in_threadgroup]],
                       uint simds [[simdgroups_per_threadgroup]],
                       uint lane [[thread_index_in_simdgroup]]) {
  threadgroup float group_best[mkv_params::kArgmaxSimds];
  threadgroup uint group_index[mkv_params::kArgmaxSimds];
  const device T* xr = x + ulong(row) * p.n;
  float best = -INFINITY;
  uint index = p.n;  // none yet: larger than every real index
  for (uint i = tid; i < p.n; i += nt) {
    if (p.masked != 0 && ((mask[i / 32] >> (i % 32)) & 1u) == 0) continue;
    const float v = xr[i];
    if (v > best || (index == p.n && v == best)) {  // the first -inf counts too
      best = v;
      index = i;
    }
  }
  float m = simd_max(best);
  index = simd_min(best == m ? index : p.n);
  if (lane == 0) {
    group_best[simd] = m;
    group_index[simd] = index;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (simd == 0) {
    best = lane < simds ? group_best[lane] : -INFINITY;
    index = lane < simds ? group_index[lane] : p.n;
    m = simd_max(best);
    index = simd_min(best == m ? index : p.n);
    if (lane == 0) out[row] = index < p.n ? int(index) : 0;  // all NaN: 0
  }
}

// ---- softmax: one threadgroup of kRowSimds SIMD-groups per row ----------
// Two threadgroup reductions (max, then Σ e^(x - max)); in place is safe:
// each thread writes only elements it read.
template <typename T>
MKV_MAX_THREADS(mkv_params::kRowSimds * 32) kernel void softmax(constant mkv_params::Softmax& p [[buffer(0)]],
                        const device T* x [[buffer(1)]],  // (n_rows, n)
                        device T* out [[buffer(2)]],      // (n_rows, n); may be x
                        uint row [[threadgroup_position_in_grid]],
                        uint tid [[thread_index_in_threadgroup]],
                        uint nt [[threads_per_threadgroup]],
                        uint simd [[simdgroup_index_in_threadgroup]],
                        uint lane [[thread_index_in_simdgroup]]) {
  threadgroup float group_max[kRowSimds];
  threadgroup float group_sum[kRowSimds];
  const device T* xr = x + ulong(row) * p.n;
  device T* o = out + ulong(row) * p.n;
  float m = -INFINITY;
  for (uint i = tid; i < p.n; i += nt) m = max(m, xr[i] * p.scale);
  m = simd_max(m);
  if (lane == 0) group_max[simd] = m;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  m = group_max[0];
  for (uint s = 1; s < kRowSimds; ++s) m = max(m, group_max[s]);
  float sum = 0.0f;
  for (uint i = tid; i < p.n; i += nt) sum += exp(xr[i] * p.scale - m);
  sum = simd_sum(sum);
  if (lane == 0) group_sum[simd] = sum;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  sum = 0.0f;
  for (uint s = 0; s < kRowSimds; ++s) sum += group_sum[s];
  const float inv = 1.0f / sum;
  for (uint i = tid; i < p.n; i += nt) o[i] = exp(xr[i] * p.scale - m) * inv;
}
