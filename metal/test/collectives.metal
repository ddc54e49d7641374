// Every SIMD-group function the prelude offers, for the executor tests.
// Results go to out[op * n + thread], n = threads in the grid.
#include "../mkv_kernel.h"

// Reductions and scans over the live lanes: lanes at or past `active` return
// first, as after a bounds check, so partial SIMD-groups are exercised.
template <typename T>
[[kernel]] void test_simd_reduce(const device T* in [[buffer(0)]],
                                 device T* out [[buffer(1)]],
                                 constant uint& active [[buffer(2)]],
                                 uint gid [[thread_position_in_grid]],
                                 uint n [[threads_per_grid]],
                                 uint lane [[thread_index_in_simdgroup]]) {
  if (lane >= active) return;
  const T x = in[gid];
  out[0 * n + gid] = simd_sum(x);
  out[1 * n + gid] = simd_max(x);
  out[2 * n + gid] = simd_min(x);
  out[3 * n + gid] = simd_prefix_inclusive_sum(x);
  out[4 * n + gid] = simd_prefix_exclusive_sum(x);
  out[5 * n + gid] = simd_broadcast_first(x);
}

MKV_KERNEL("test_simd_reduce_f32", test_simd_reduce<float>)
MKV_KERNEL("test_simd_reduce_f16", test_simd_reduce<half>)
MKV_KERNEL("test_simd_reduce_i32", test_simd_reduce<int>)
MKV_KERNEL("test_simd_reduce_u32", test_simd_reduce<uint>)

kernel void test_simd_product_f32(const device float* in [[buffer(0)]],
                                  device float* out [[buffer(1)]],
                                  uint gid [[thread_position_in_grid]],
                                  uint n [[threads_per_grid]]) {
  const float x = in[gid];
  out[0 * n + gid] = simd_product(x);
  out[1 * n + gid] = simd_prefix_inclusive_product(x);
  out[2 * n + gid] = simd_prefix_exclusive_product(x);
}

// Lane permutations; the tests use full SIMD-groups, as reading a lane that
// does not exist is an error.
template <typename T>
[[kernel]] void test_simd_permute(const device T* in [[buffer(0)]],
                                  device T* out [[buffer(1)]],
                                  uint gid [[thread_position_in_grid]],
                                  uint n [[threads_per_grid]],
                                  uint lane [[thread_index_in_simdgroup]]) {
  const T x = in[gid];
  out[0 * n + gid] = simd_shuffle(x, ushort((lane * 7 + 3) % 32));
  out[1 * n + gid] = simd_shuffle_xor(x, ushort(5));
  out[2 * n + gid] = simd_shuffle_down(x, ushort(3));
  out[3 * n + gid] = simd_shuffle_up(x, ushort(3));
  out[4 * n + gid] = simd_broadcast(x, ushort(7));
  out[5 * n + gid] = simd_shuffle_down(x, ushort(16));
}

MKV_KERNEL("test_simd_permute_f32", test_simd_permute<float>)
MKV_KERNEL("test_simd_permute_f16", test_simd_permute<half>)
MKV_KERNEL("test_simd_permute_i32", test_simd_permute<int>)

// Votes and bitwise reductions over uint predicates, with early exits.
kernel void test_simd_vote(const device uint* in [[buffer(0)]],
                           device uint* out [[buffer(1)]],
                           constant uint& active [[buffer(2)]],
                           uint gid [[thread_position_in_grid]],
                           uint n [[threads_per_grid]],
                           uint lane [[thread_index_in_simdgroup]]) {
  if (lane >= active) return;
  const uint x = in[gid];
  out[0 * n + gid] = simd_all(x != 0) ? 1u : 0u;
  out[1 * n + gid] = simd_any(x != 0) ? 1u : 0u;
  out[2 * n + gid] = uint(uint64_t(simd_ballot(x != 0)) & 0xffffffffu);
  out[3 * n + gid] = simd_is_first() ? 1u : 0u;
  out[4 * n + gid] = simd_and(x);
  out[5 * n + gid] = simd_or(x);
  out[6 * n + gid] = simd_xor(x);
}

// Collectives on vectors: elementwise over the components.
kernel void test_simd_vector(const device float4* in [[buffer(0)]],
                             device float4* out [[buffer(1)]],
                             uint gid [[thread_position_in_grid]],
                             uint n [[threads_per_grid]]) {
  const float4 x = in[gid];
  out[0 * n + gid] = simd_sum(x);
  out[1 * n + gid] = simd_max(x);
  out[2 * n + gid] = float4(float2(simd_shuffle_xor(half2(x.xy), ushort(1))), x.zw);
}

// Every builtin this executor provides, per thread of a 3-D dispatch.
kernel void test_builtins(device uint* out [[buffer(0)]],
                          uint3 pos_grid [[thread_position_in_grid]],
                          uint3 pos_tg [[thread_position_in_threadgroup]],
                          uint index_tg [[thread_index_in_threadgroup]],
                          uint3 tg_pos [[threadgroup_position_in_grid]],
                          uint3 tg_size [[threads_per_threadgroup]],
                          uint3 tg_count [[threadgroups_per_grid]],
                          uint3 grid_size [[threads_per_grid]],
                          ushort lane [[thread_index_in_simdgroup]],
                          ushort simd [[simdgroup_index_in_threadgroup]],
                          ushort simd_width [[threads_per_simdgroup]],
                          ushort simds [[simdgroups_per_threadgroup]]) {
  const uint linear = pos_grid.x + grid_size.x * (pos_grid.y + grid_size.y * pos_grid.z);
  device uint* o = out + linear * 20;
  o[0] = pos_grid.x; o[1] = pos_grid.y; o[2] = pos_grid.z;
  o[3] = pos_tg.x; o[4] = pos_tg.y; o[5] = pos_tg.z;
  o[6] = index_tg;
  o[7] = tg_pos.x; o[8] = tg_pos.y; o[9] = tg_pos.z;
  o[10] = tg_size.x * 10000 + tg_size.y * 100 + tg_size.z;
  o[11] = tg_count.x * 10000 + tg_count.y * 100 + tg_count.z;
  o[12] = grid_size.x * 10000 + grid_size.y * 100 + grid_size.z;
  o[13] = lane; o[14] = simd; o[15] = simd_width; o[16] = simds;
}
