// The KV cache's optional rotation (kv_rotate; docs/KV_QUANT.md): an
// orthonormal Walsh-Hadamard transform H = H_D / sqrt(D) of every head (D a
// power of two, Sylvester order). H is symmetric and H H = I, so rotating K
// and Q alike keeps every q.k, and rotating V before it is stored makes the
// attention output H o, which one more H turns back into o. A rotated head
// spreads an outlier channel over all D elements, so a group's range, and a
// quantized format's error, is set by the head's norm rather than by its
// largest channel.
#pragma once

#include "mkv_kernel.h"  // metal_stdlib, using namespace metal

namespace mkv_hadamard {

// Rotates n_heads heads of D floats at row in place. The threads of the
// threadgroup (tid < nt) take the butterflies of each of the log2(D) stages,
// with a threadgroup barrier before each stage and after the last: every
// thread of the threadgroup must call it (it publishes what they wrote to
// row before the call). The last stage multiplies by 1 / sqrt(D).
inline void rotate_heads(device float* row, uint n_heads, uint D, uint tid, uint nt) {
  const float norm = 1.0f / sqrt(float(D));
  const uint half_d = D / 2;
  for (uint h = 1; h < D; h *= 2) {
    threadgroup_barrier(mem_flags::mem_device);
    const float s = h == half_d ? norm : 1.0f;
    for (uint j = tid; j < n_heads * half_d; j += nt) {
      const uint head = j / half_d;
      const uint i = j - head * half_d;
      const uint a = head * D + (i / h) * 2 * h + i % h;  // the butterfly (a, a + h)
      const float x = row[a], y = row[a + h];
      row[a] = (x + y) * s;
      row[a + h] = (x - y) * s;
    }
  }
  threadgroup_barrier(mem_flags::mem_device);
}

}  // namespace mkv_hadamard
