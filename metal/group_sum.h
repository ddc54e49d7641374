// A threadgroup-wide sum, for kernels that give each row one threadgroup
// (altup.h, vision.h).
#pragma once

#include "mkv_kernel.h"  // metal_stdlib, using namespace metal

// The threadgroup's sum of every thread's v, in every thread. partial holds a
// float per SIMD-group; the second barrier lets the next call reuse it.
inline float group_sum(float v, threadgroup float* partial, uint simd, uint lane, uint simds) {
  v = simd_sum(v);
  if (lane == 0) partial[simd] = v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float total = 0.0f;
  for (uint s = 0; s < simds; ++s) total += partial[s];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return total;
}
