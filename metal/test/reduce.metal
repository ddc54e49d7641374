// Reductions and scans for the executor tests: barriers inside loops,
// threadgroup arrays (dynamic and declared in the body), SIMD sums.
#include "../mkv_kernel.h"
#include "test_params.h"

// Tree reduction in [[threadgroup(0)]] memory, one barrier per level.
// partial[tg] = sum of in[tg*chunk .. tg*chunk + chunk).
kernel void test_reduce_tree(constant mkv_test::Reduce& p [[buffer(0)]],
                             const device float* in [[buffer(1)]],
                             device float* partial [[buffer(2)]],
                             threadgroup float* scratch [[threadgroup(0)]],
                             uint tg [[threadgroup_position_in_grid]],
                             uint tid [[thread_index_in_threadgroup]],
                             uint nt [[threads_per_threadgroup]]) {
  float acc = 0.0f;
  const uint begin = tg * p.chunk, end = min(begin + p.chunk, p.n);
  for (uint i = begin + tid; i < end; i += nt) acc += in[i];
  scratch[tid] = acc;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint stride = nt / 2; stride > 0; stride /= 2) {
    if (tid < stride) scratch[tid] += scratch[tid + stride];
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  if (tid == 0) partial[tg] = scratch[0];
}

// Two levels: simd_sum inside each SIMD-group, then the first SIMD-group sums
// the per-group results from a threadgroup array declared in the body.
kernel void test_reduce_simd(constant mkv_test::Reduce& p [[buffer(0)]],
                             const device float* in [[buffer(1)]],
                             device float* partial [[buffer(2)]],
                             uint tg [[threadgroup_position_in_grid]],
                             uint tid [[thread_index_in_threadgroup]],
                             uint nt [[threads_per_threadgroup]],
                             uint simd [[simdgroup_index_in_threadgroup]],
                             uint simds [[simdgroups_per_threadgroup]],
                             uint lane [[thread_index_in_simdgroup]]) {
  threadgroup float sums[32];
  float acc = 0.0f;
  const uint begin = tg * p.chunk, end = min(begin + p.chunk, p.n);
  for (uint i = begin + tid; i < end; i += nt) acc += in[i];
  acc = simd_sum(acc);
  if (lane == 0) sums[simd] = acc;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (simd == 0) {
    float total = lane < simds ? sums[lane] : 0.0f;
    total = simd_sum(total);
    if (lane == 0) partial[tg] = total;
  }
}

// Hillis–Steele inclusive scan over one threadgroup: a barrier between the
// reads and the writes of every step, in a loop.
kernel void test_scan_inclusive(const device float* in [[buffer(0)]],
                                device float* out [[buffer(1)]],
                                uint tg [[threadgroup_position_in_grid]],
                                uint tid [[thread_index_in_threadgroup]],
                                uint nt [[threads_per_threadgroup]]) {
  threadgroup float buf[1024];
  buf[tid] = in[tg * nt + tid];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint offset = 1; offset < nt; offset *= 2) {
    const float add = tid >= offset ? buf[tid - offset] : 0.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    buf[tid] += add;
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  out[tg * nt + tid] = buf[tid];
}

// Missing barrier on purpose: each thread reads its neighbour's slot right
// after writing its own. Poisoned threadgroup memory makes the race visible.
kernel void test_neighbour_no_barrier(const device float* in [[buffer(0)]],
                                      device float* out [[buffer(1)]],
                                      uint tid [[thread_index_in_threadgroup]],
                                      uint nt [[threads_per_threadgroup]]) {
  threadgroup float buf[256];
  buf[tid] = in[tid];
  out[tid] = buf[(tid + 1) % nt];
}

// The same with the barrier: correct in every fiber order.
kernel void test_neighbour_barrier(const device float* in [[buffer(0)]],
                                   device float* out [[buffer(1)]],
                                   uint tid [[thread_index_in_threadgroup]],
                                   uint nt [[threads_per_threadgroup]]) {
  threadgroup float buf[256];
  buf[tid] = in[tid];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[tid] = buf[(tid + 1) % nt];
}
