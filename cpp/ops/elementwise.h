// The transformer's small kernels (metal/elementwise.metal): embedding lookup,
// RMSNorm, residual add, scale, SwiGLU / GeGLU, argmax and softmax. Activations are
// float32; every function validates, then encodes one dispatch, and raises
// GpuError "[op] ..." on bad input.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/linear.h"

namespace mkv::ops {

// out[t, :] = table[ids[t], :] * scale for t < n_tokens.
//   table (vocab, dim) in ttype; ids (n_tokens) int32; out (n_tokens, dim) float32.
// An id outside [0, vocab) yields a row of zeros (ids may come from the GPU,
// so the host cannot check them here).
void embedding(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& table,
               WeightType ttype, const BufferView& ids, const BufferView& out, uint32_t n_tokens,
               uint32_t dim, uint32_t vocab, float scale = 1.0f);

// out[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) * (w_offset + w) for r < n_rows.
//   x, out (n_rows, dim) float32 (out may be x); w (dim) f32 or f16.
//   w_offset: 0 for Llama's w, 1 for Gemma's (1 + w). Per-head QK-norm:
//   n_rows = tokens * heads, dim = head_dim.
void rms_norm(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& x,
              const BufferView& w, WeightType wtype, const BufferView& out, uint32_t n_rows,
              uint32_t dim, float eps, float w_offset = 0.0f);

// y[i] += x[i] for i < n (residual add).
void add(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& y, const BufferView& x,
         uint32_t n);

// y[i] *= s for i < n.
void scale(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& y, uint32_t n,
           float s);

// y[i] = cap * tanh(y[i] / cap) for i < n (logit soft-capping); cap > 0.
void softcap(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& y, uint32_t n,
             float cap);

// out[i] = act(gate[i]) * up[i] for i < n, act = silu (swiglu) or
// gelu_pytorch_tanh (geglu). gate and up are separate views (e.g. two halves
// of one buffer); out may be gate or up.
void swiglu(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& gate,
            const BufferView& up, const BufferView& out, uint32_t n);
void geglu(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& gate,
           const BufferView& up, const BufferView& out, uint32_t n);

// out[r] = lowest index of the largest value in x[r, :], as int32.
//   x (n_rows, n) float32; out (n_rows) int32. NaNs are never chosen (a row
//   of NaNs gives 0). mask (constrained decoding, n_rows 1): only the ids whose
//   bit is set, bit i % 32 of uint32 word i / 32; at least one must be.
void argmax(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& x,
            const BufferView& out, uint32_t n_rows, uint32_t n, const BufferView& mask = {});

// Every kernel name the ops above build (tests/gpu/test_kernel_names.py).
std::vector<std::string> elementwise_kernel_names(gpu::Device& device);

// out[r, :] = softmax(x[r, :] * scale) for r < n_rows; x, out (n_rows, n)
// float32, out may be x. scale = 1 / temperature for sampling.
void softmax(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& x,
             const BufferView& out, uint32_t n_rows, uint32_t n, float scale = 1.0f);

}  // namespace mkv::ops
