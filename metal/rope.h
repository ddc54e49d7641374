// Rotary position embedding (RoPE) math shared by the kernels that rotate:
// the K store (kv_store.metal) and the standalone Q rope (rope.metal).
//
// For each rotary pair i < rotary_dim/2 with elements (a, b):
//   theta = float(pos) * inv_freq[i]                      (float, as specified)
//   a' = a*cos(theta) - b*sin(theta),  b' = b*cos(theta) + a*sin(theta)
// The pair's elements depend on the style:
//   neox        (i, i + rotary_dim/2)  half-split; HF transformers' rotate_half
//   interleaved (2i, 2i + 1)           llama.cpp LLAMA ("normal") on GGUF weights
// inv_freq is a host-computed table of rotary_dim/2 floats, so default,
// linear-scaled and Llama-3-scaled RoPE are only different tables.
#pragma once

#include "mkv_kernel.h"  // metal_stdlib, using namespace metal

namespace mkv_rope {

// Style tags: template arguments of the kernels, whose names encode them.
enum Style : uint {
  kStyleNone = 0,         // copy only (V, or K without rope)
  kStyleNeox = 1,
  kStyleInterleaved = 2,
};

// Element indices (within a head) of rotary pair i.
template <Style S>
inline uint2 pair_elements(uint i, uint rotary_dim) {
  return S == kStyleNeox ? uint2(i, i + rotary_dim / 2) : uint2(2 * i, 2 * i + 1);
}

// (a, b) rotated by theta = pos * inv_freq. precise:: because angles reach
// ~1e5 rad at long positions, where fast:: sin/cos lose their accuracy.
inline float2 rotate(float a, float b, uint pos, float inv_freq) {
  const float theta = float(pos) * inv_freq;
  const float c = metal::precise::cos(theta);
  const float s = metal::precise::sin(theta);
  return float2(a * c - b * s, b * c + a * s);
}

// Rotates one token's n_heads heads (head_dim floats each) in place, threads
// tid, tid + nt, ... taking one pair each: no element is touched by two
// threads, so no barrier is needed. Q's rope (rope.metal, and the K store's
// fused Q rows in kv_store.metal).
template <Style S>
inline void rotate_heads(device float* row, uint n_heads, uint head_dim, uint rotary_dim, uint pos,
                         const device float* inv_freq, uint tid, uint nt) {
  const uint pairs = rotary_dim / 2;
  for (uint j = tid; j < n_heads * pairs; j += nt) {
    const uint h = j / pairs;
    const uint i = j - h * pairs;
    device float* head = row + h * head_dim;
    const uint2 e = pair_elements<S>(i, rotary_dim);
    const float2 r = rotate(head[e.x], head[e.y], pos, inv_freq[i]);
    head[e.x] = r.x;
    head[e.y] = r.y;
  }
}

}  // namespace mkv_rope
