// The bodies of the audio tower's kernels (audio.metal instantiates them):
// im2col for the subsampling convolutions, the cumulative group norm, the
// conformer's local attention with relative positions, the causal depthwise
// convolution, GLU, SiLU and a strided row copy. Activations are float.
// (Templates over T = float only because MKV_KERNEL instantiates templates.)
#pragma once

#include "mkv_kernel.h"
#include "activation.h"
#include "audio_params.h"
#include "elementwise.h"  // MKV_FOR_EACH_ELEMENT
#include "group_sum.h"
#include "linear_params.h"

template <typename T>
MKV_MAX_THREADS(mkv_params::kElementThreads) kernel void im2col(constant mkv_params::Im2col& p [[buffer(0)]],
                                                                const device T* x [[buffer(1)]],
                                                                device T* out [[buffer(2)]],
                                                                uint tg [[threadgroup_position_in_grid]],
                                                                uint tid [[thread_index_in_threadgroup]],
                                                                uint nt [[threads_per_threadgroup]]) {
  const ulong i = ulong(tg) * nt + tid;
  if (i >= ulong(p.t_out) * p.f_out * p.cols) return;
  const uint row = uint(i / p.cols), col = uint(i % p.cols);
  float v = 0.0f;
  if (col < p.c_in * p.kt * p.kf) {
    const uint c = col / (p.kt * p.kf), ti = col / p.kf % p.kt, fj = col % p.kf;
    const int t = int(row / p.f_out * p.st + ti) - int(p.pad_t), f = int(row % p.f_out * p.sf + fj) - int(p.pad_f);
    if (t >= 0 && t < int(p.t_in) && f >= 0 && f < int(p.f_in)) v = x[(ulong(t) * p.f_in + f) * p.c_in + c];
  }
  out[i] = v;
}

// The cumulative sums of a pass are re-added by each row's threadgroup from
// the per-row partials: O(rows²) reads, a few million for a 30 s clip.
template <typename T>
MKV_MAX_THREADS(mkv_params::kRowSimds * 32) kernel void cumulative_norm(
    constant mkv_params::CumulativeNorm& p [[buffer(0)]],
    const device T* x [[buffer(1)]],  // (n_rows, dim)
    const device T* w [[buffer(2)]],  // (channels)
    device float* stats [[buffer(3)]],  // (2 n_rows): row sums, then squared differences
    device T* out [[buffer(4)]],      // (n_rows, dim); pass 2 only; may be x
    uint r [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
    uint nt [[threads_per_threadgroup]], uint simd [[simdgroup_index_in_threadgroup]],
    uint simds [[simdgroups_per_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
  threadgroup float partial[mkv_params::kRowSimds];
  const device T* xr = x + ulong(r) * p.dim;
  float s = 0.0f;
  if (p.pass == 0) {
    for (uint j = tid; j < p.dim; j += nt) s += xr[j];
    s = group_sum(s, partial, simd, lane, simds);
    if (tid == 0) stats[r] = s;
    return;
  }
  const float count = float(p.dim) * float(r + 1);
  for (uint u = tid; u <= r; u += nt) s += stats[u];
  const float mean = group_sum(s, partial, simd, lane, simds) / count;
  float d = 0.0f;
  if (p.pass == 1) {
    for (uint j = tid; j < p.dim; j += nt) d += (xr[j] - mean) * (xr[j] - mean);
    d = group_sum(d, partial, simd, lane, simds);
    if (tid == 0) stats[p.n_rows + r] = d;
    return;
  }
  for (uint u = tid; u <= r; u += nt) d += stats[p.n_rows + u];
  const float inv = rsqrt(group_sum(d, partial, simd, lane, simds) / count + p.eps);
  device T* o = out + ulong(r) * p.dim;
  for (uint j = tid; j < p.dim; j += nt) o[j] = max((xr[j] - mean) * inv * w[j % p.channels], 0.0f);
}

// Online softmax over the window; each lane holds head_dim / 32 of q, k and v.
template <typename T>
MKV_MAX_THREADS(32) kernel void audio_attention(constant mkv_params::AudioAttention& p [[buffer(0)]],
                                                const device T* q [[buffer(1)]],       // (n_tokens, n_heads head_dim)
                                                const device T* k [[buffer(2)]],       // (n_tokens, n_heads head_dim)
                                                const device T* v [[buffer(3)]],       // (n_tokens, n_heads head_dim)
                                                const device T* pos [[buffer(4)]],     // (left + right + 1, n_heads head_dim)
                                                const device T* qscale [[buffer(5)]],  // (head_dim)
                                                device T* out [[buffer(6)]],           // (n_tokens, n_heads head_dim)
                                                uint g [[threadgroup_position_in_grid]],
                                                uint lane [[thread_index_in_simdgroup]]) {
  constexpr uint L = mkv_params::kAudioDimsPerLane;
  const uint t = g / p.n_heads, h = g % p.n_heads, width = p.n_heads * p.head_dim;
  const ulong head = ulong(h) * p.head_dim;
  float qs[L], acc[L];
  MKV_UNROLL for (uint i = 0; i < L; ++i) {
    const uint j = lane + 32 * i;
    qs[i] = j < p.head_dim ? q[ulong(t) * width + head + j] * qscale[j] : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, sum = 0.0f;
  const int lo = max(int(t) - int(p.left), 0), hi = min(int(t) + int(p.right), int(p.n_valid) - 1);
  for (int u = lo; u <= hi; ++u) {
    const device T* ku = k + ulong(u) * width + head;
    const device T* pu = pos + ulong(int(p.left) - (int(t) - u)) * width + head;
    float s = 0.0f;
    MKV_UNROLL for (uint i = 0; i < L; ++i) {
      const uint j = lane + 32 * i;
      if (j < p.head_dim) s += qs[i] * ku[j] + qs[i] * pu[j];
    }
    s = simd_sum(s);
    s = p.softcap * tanh(s / p.softcap);
    const float m2 = max(m, s), c = exp(m - m2), e = exp(s - m2);
    sum = sum * c + e;
    const device T* vu = v + ulong(u) * width + head;
    MKV_UNROLL for (uint i = 0; i < L; ++i) {
      const uint j = lane + 32 * i;
      acc[i] = acc[i] * c + (j < p.head_dim ? e * vu[j] : 0.0f);
    }
    m = m2;
  }
  MKV_UNROLL for (uint i = 0; i < L; ++i) {
    const uint j = lane + 32 * i;
    if (j < p.head_dim) out[ulong(t) * width + head + j] = sum > 0.0f ? acc[i] / sum : 0.0f;
  }
}

template <typename T>
MKV_MAX_THREADS(mkv_params::kElementThreads) kernel void depthwise_conv(
    constant mkv_params::DepthwiseConv& p [[buffer(0)]], const device T* x [[buffer(1)]],  // (n_rows, channels)
    const device T* w [[buffer(2)]],                                                     // (taps, channels)
    device T* out [[buffer(3)]],                                                         // (n_rows, channels)
    uint tg [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
    uint nt [[threads_per_threadgroup]]) {
  const ulong i = ulong(tg) * nt + tid;
  if (i >= ulong(p.n_rows) * p.channels) return;
  const uint t = uint(i / p.channels), c = uint(i % p.channels);
  float s = 0.0f;
  for (uint j = 0; j < p.taps; ++j) {
    const int u = int(t) - int(p.taps - 1) + int(j);
    if (u >= 0) s += w[ulong(j) * p.channels + c] * x[ulong(u) * p.channels + c];
  }
  out[i] = s;
}

template <typename T>
MKV_MAX_THREADS(mkv_params::kElementThreads) kernel void glu(constant mkv_params::Rows& p [[buffer(0)]],
                                                             const device T* x [[buffer(1)]],  // (n_rows, 2 dim)
                                                             device T* out [[buffer(2)]],      // (n_rows, dim)
                                                             uint tg [[threadgroup_position_in_grid]],
                                                             uint tid [[thread_index_in_threadgroup]],
                                                             uint nt [[threads_per_threadgroup]]) {
  const ulong i = ulong(tg) * nt + tid;
  if (i >= ulong(p.n_rows) * p.dim) return;
  const ulong r = i / p.dim, j = i % p.dim;
  const float a = x[r * 2 * p.dim + j], b = x[r * 2 * p.dim + p.dim + j];
  out[i] = a / (1.0f + exp(-b));
}

template <typename T>
MKV_MAX_THREADS(mkv_params::kElementThreads) kernel void take_rows(constant mkv_params::Rows& p [[buffer(0)]],
                                                                   const device T* x [[buffer(1)]],
                                                                   device T* out [[buffer(2)]],
                                                                   uint tg [[threadgroup_position_in_grid]],
                                                                   uint tid [[thread_index_in_threadgroup]],
                                                                   uint nt [[threads_per_threadgroup]]) {
  const ulong i = ulong(tg) * nt + tid;
  if (i >= ulong(p.n_rows) * p.dim) return;
  out[i] = x[(i / p.dim) * p.stride * p.dim + i % p.dim];
}

// y[i] = silu(y[i]) (activation.h), in place.
template <typename T>
MKV_MAX_THREADS(mkv_params::kElementThreads) kernel void silu(constant mkv_params::Elementwise& p [[buffer(0)]],
                                                              device T* y [[buffer(1)]],  // (n)
                                                              uint tg [[threadgroup_position_in_grid]],
                                                              uint tid [[thread_index_in_threadgroup]],
                                                              uint nt [[threads_per_threadgroup]]) {
  MKV_FOR_EACH_ELEMENT(i) y[i] = ActSilu::apply(y[i]);
}
