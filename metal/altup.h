// The bodies of Gemma 3n's per-row kernels (altup.metal instantiates them):
// AltUp's predict and correct steps over its streams (each routed by the
// tanh of a projection of an RMS-normed stream), the streams' magnitude
// matching, their mean, the FFN gate's Gaussian top-k, and the per-layer
// input gate. Activations are float; the small coefficient matrices f32.
// (Templates over T = float only because MKV_KERNEL instantiates templates.)
#pragma once

#include "mkv_kernel.h"
#include "altup_params.h"
#include "linear_params.h"
#include "activation.h"
#include "group_sum.h"


// AltUp's router: m[n] = tanh(router[n, :] . (rms_norm(x) * norm_w) / dim),
// for n < n_inputs.
inline void altup_route(const device float* x, const device float* norm_w, const device float* router,
                        uint dim, uint n_inputs, float eps, thread float* m, threadgroup float* partial,
                        uint tid, uint nt, uint simd, uint lane, uint simds) {
  float ss = 0.0f;
  for (uint j = tid; j < dim; j += nt) ss += x[j] * x[j];
  const float inv = 1.0f / sqrt(group_sum(ss, partial, simd, lane, simds) / float(dim) + eps);
  for (uint n = 0; n < n_inputs; ++n) {
    float d = 0.0f;
    for (uint j = tid; j < dim; j += nt) d += x[j] * norm_w[j] * router[ulong(n) * dim + j];
    m[n] = tanh(group_sum(d, partial, simd, lane, simds) * inv / float(dim));
  }
}

// predict: pred_k = X_k + Σ_j C[k, j] X_j, C = (coefs m) as (n_inputs, n_inputs)
// row-major; the active stream's prediction also to act (the layer's input).
template <typename T>
MKV_MAX_THREADS(mkv_params::kRowSimds * 32) kernel void altup_predict(
    constant mkv_params::Altup& p [[buffer(0)]],
    const device float* X [[buffer(1)]],       // (n_inputs streams, n_rows, dim)
    const device float* norm_w [[buffer(2)]],  // (dim) router_norm
    const device float* router [[buffer(3)]],  // (n_inputs, dim)
    const device float* coefs [[buffer(4)]],   // (n_inputs², n_inputs) prediction_coefs
    device float* pred [[buffer(5)]],          // like X
    device float* act [[buffer(6)]],           // (n_rows, dim)
    uint r [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
    uint nt [[threads_per_threadgroup]], uint simd [[simdgroup_index_in_threadgroup]],
    uint simds [[simdgroups_per_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
  threadgroup float partial[mkv_params::kRowSimds];
  const uint N = p.n_inputs;
  const ulong row = ulong(r) * p.dim;
  float m[mkv_params::kAltupMaxInputs];
  altup_route(X + ulong(p.active) * p.stride + row, norm_w, router, p.dim, N, p.eps, m, partial, tid, nt, simd,
              lane, simds);
  float C[mkv_params::kAltupMaxInputs * mkv_params::kAltupMaxInputs];
  for (uint o = 0; o < N * N; ++o) {
    float c = 0.0f;
    for (uint n = 0; n < N; ++n) c += coefs[o * N + n] * m[n];
    C[o] = c;
  }
  for (uint c = tid; c < p.dim; c += nt) {
    float xs[mkv_params::kAltupMaxInputs];
    for (uint j = 0; j < N; ++j) xs[j] = X[ulong(j) * p.stride + row + c];
    for (uint k = 0; k < N; ++k) {
      float s = 0.0f;
      for (uint j = 0; j < N; ++j) s += C[k * N + j] * xs[j];
      pred[ulong(k) * p.stride + row + c] = xs[k] + s;
      if (k == p.active) act[row + c] = xs[k] + s;
    }
  }
}

// correct: X_k = pred_k + (correct_coefs m + 1)_k (act - pred_active), the router
// on act; first = X_active * scale (the per-layer input gate's input).
template <typename T>
MKV_MAX_THREADS(mkv_params::kRowSimds * 32) kernel void altup_correct(
    constant mkv_params::Altup& p [[buffer(0)]],
    const device float* pred [[buffer(1)]],    // (n_inputs streams, n_rows, dim)
    const device float* act [[buffer(2)]],     // (n_rows, dim): the layer's output
    const device float* norm_w [[buffer(3)]],  // (dim) router_norm
    const device float* router [[buffer(4)]],  // (n_inputs, dim)
    const device float* coefs [[buffer(5)]],   // (n_inputs, n_inputs) correction_coefs
    const device float* scale [[buffer(6)]],   // (dim) correct_output_scale
    device float* X [[buffer(7)]],             // like pred
    device float* first [[buffer(8)]],         // (n_rows, dim)
    uint r [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
    uint nt [[threads_per_threadgroup]], uint simd [[simdgroup_index_in_threadgroup]],
    uint simds [[simdgroups_per_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
  threadgroup float partial[mkv_params::kRowSimds];
  const uint N = p.n_inputs;
  const ulong row = ulong(r) * p.dim;
  float m[mkv_params::kAltupMaxInputs];
  altup_route(act + row, norm_w, router, p.dim, N, p.eps, m, partial, tid, nt, simd, lane, simds);
  float coef[mkv_params::kAltupMaxInputs];
  for (uint k = 0; k < N; ++k) {
    float c = 0.0f;
    for (uint n = 0; n < N; ++n) c += coefs[k * N + n] * m[n];
    coef[k] = c + 1.0f;
  }
  for (uint c = tid; c < p.dim; c += nt) {
    const float innovation = act[row + c] - pred[ulong(p.active) * p.stride + row + c];
    for (uint k = 0; k < N; ++k) {
      const float x = pred[ulong(k) * p.stride + row + c] + coef[k] * innovation;
      X[ulong(k) * p.stride + row + c] = x;
      if (k == p.active) first[row + c] = x * scale[c];
    }
  }
}

// y_k *= rms(ref) / sqrt(max(mean(y_k²), floor)) for each of y's streams (grid.y).
template <typename T>
MKV_MAX_THREADS(mkv_params::kRowSimds * 32) kernel void altup_magnitude(
    constant mkv_params::AltupMagnitude& p [[buffer(0)]],
    const device float* ref [[buffer(1)]],  // (n_rows, dim)
    device float* y [[buffer(2)]],          // (count streams, n_rows, dim)
    uint2 g [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
    uint nt [[threads_per_threadgroup]], uint simd [[simdgroup_index_in_threadgroup]],
    uint simds [[simdgroups_per_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
  threadgroup float partial[mkv_params::kRowSimds];
  const device float* a = ref + ulong(g.x) * p.dim;
  device float* b = y + ulong(g.y) * p.stride + ulong(g.x) * p.dim;
  float sa = 0.0f, sb = 0.0f;
  for (uint j = tid; j < p.dim; j += nt) {
    sa += a[j] * a[j];
    sb += b[j] * b[j];
  }
  const float target = sqrt(group_sum(sa, partial, simd, lane, simds) / float(p.dim));
  const float now = sqrt(max(group_sum(sb, partial, simd, lane, simds) / float(p.dim), p.floor));
  const float k = target / now;
  for (uint j = tid; j < p.dim; j += nt) b[j] *= k;
}

// out[i] = (first[i] + Σ_k others[k stride + i]) / (1 + count).
template <typename T>
MKV_MAX_THREADS(mkv_params::kElementThreads) kernel void altup_mean(
    constant mkv_params::AltupMean& p [[buffer(0)]],
    const device float* first [[buffer(1)]], const device float* others [[buffer(2)]],
    device float* out [[buffer(3)]],
    uint tg [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
    uint nt [[threads_per_threadgroup]]) {
  for (uint k = 0, i = tg * nt * mkv_params::kElementsPerThread + tid; k < mkv_params::kElementsPerThread;
       ++k, i += nt) {
    if (i >= p.n) continue;
    float s = first[i];
    for (uint j = 0; j < p.count; ++j) s += others[ulong(j) * p.stride + i];
    out[i] = s / float(1 + p.count);
  }
}

// The FFN gate's activation sparsity: x = max(x - (mean + std * std_mul), 0),
// std the population standard deviation of the row (two passes).
template <typename T>
MKV_MAX_THREADS(mkv_params::kRowSimds * 32) kernel void gaussian_topk(
    constant mkv_params::GaussianTopk& p [[buffer(0)]],
    device float* x [[buffer(1)]],  // (n_rows, dim), in place
    uint r [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
    uint nt [[threads_per_threadgroup]], uint simd [[simdgroup_index_in_threadgroup]],
    uint simds [[simdgroups_per_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
  threadgroup float partial[mkv_params::kRowSimds];
  device float* xr = x + ulong(r) * p.dim;
  float s = 0.0f;
  for (uint j = tid; j < p.dim; j += nt) s += xr[j];
  const float mean = group_sum(s, partial, simd, lane, simds) / float(p.dim);
  float v = 0.0f;
  for (uint j = tid; j < p.dim; j += nt) v += (xr[j] - mean) * (xr[j] - mean);
  const float cutoff = mean + sqrt(group_sum(v, partial, simd, lane, simds) / float(p.dim)) * p.std_mul;
  for (uint j = tid; j < p.dim; j += nt) xr[j] = max(xr[j] - cutoff, 0.0f);
}

// Each layer's input from its token: g = gelu_tanh(g) * inputs (a strided view:
// the layer's columns of the step's per-layer inputs).
template <typename T>
MKV_MAX_THREADS(mkv_params::kElementThreads) kernel void per_layer_gate(
    constant mkv_params::PerLayerGate& p [[buffer(0)]],
    device float* g [[buffer(1)]],              // (n_rows, dim), in place
    const device float* inputs [[buffer(2)]],   // row r at r * in_stride
    uint tg [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
    uint nt [[threads_per_threadgroup]]) {
  const uint n = p.n_rows * p.dim;
  for (uint k = 0, i = tg * nt * mkv_params::kElementsPerThread + tid; k < mkv_params::kElementsPerThread;
       ++k, i += nt)
    if (i < n) g[i] = ActGeluTanh::apply(g[i]) * inputs[ulong(i / p.dim) * p.in_stride + i % p.dim];
}
