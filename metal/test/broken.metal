// Deliberately broken kernels: each provokes one validation error of the host
// executor, asserted by message in tests/gpu/test_validation.py.
#include "../mkv_kernel.h"
#include "test_params.h"

// Half the threads wait at one barrier, half at another.
kernel void broken_barrier_divergence(device float* out [[buffer(0)]],
                                      uint tid [[thread_index_in_threadgroup]]) {
  if (tid % 2 == 0) {
    threadgroup_barrier(mem_flags::mem_threadgroup);
  } else {
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  out[tid] = 1.0f;
}

// Threads past 8 return before the barrier the others wait at.
kernel void broken_barrier_after_return(device float* out [[buffer(0)]],
                                        uint tid [[thread_index_in_threadgroup]]) {
  if (tid >= 8) return;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[tid] = 1.0f;
}

// simd_sum inside a branch only half the SIMD-group takes, while the other
// half goes on to a threadgroup barrier.
kernel void broken_partial_collective(device float* out [[buffer(0)]],
                                      uint lane [[thread_index_in_simdgroup]]) {
  float x = float(lane);
  if (lane < 16) x = simd_sum(x);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[lane] = x;
}

// Two halves of a SIMD-group at different collectives.
kernel void broken_mismatched_collectives(device float* out [[buffer(0)]],
                                          uint lane [[thread_index_in_simdgroup]]) {
  float x = float(lane);
  if (lane < 16) {
    x = simd_sum(x);
  } else {
    x = simd_max(x);
  }
  out[lane] = x;
}

// Lanes 16..31 return; lane 0 then reads lane 16.
// Dispatched with 16 threads: the SIMD-group has lanes 0..15 only, and lane 0
// reads lane 16, which does not exist.
kernel void broken_inactive_lane(device float* out [[buffer(0)]],
                                 uint lane [[thread_index_in_simdgroup]]) {
  out[lane] = simd_shuffle_down(float(lane), ushort(16));
}

// Lanes 20..31 return before the others reach simd_sum: defined in Metal over the
// lanes left, undefined on NVIDIA GPUs; the contract is that every lane takes part.
kernel void broken_return_before_simd(device float* out [[buffer(0)]],
                                      uint lane [[thread_index_in_simdgroup]]) {
  if (lane >= 20) return;
  out[lane] = simd_sum(1.0f);
}

// 36,000 bytes of threadgroup memory: over the 32 KiB limit.
kernel void broken_threadgroup_memory(device float* out [[buffer(0)]],
                                      uint tid [[thread_index_in_threadgroup]]) {
  threadgroup float big[9000];
  big[tid] = 1.0f;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[tid] = big[0];
}

// Reads a 32-byte struct; the test binds fewer bytes.
kernel void broken_wide_constant(constant mkv_test::Wide& p [[buffer(0)]],
                                 device float* out [[buffer(1)]],
                                 uint tid [[thread_index_in_threadgroup]]) {
  out[tid] = p.values[tid % 8];
}
