// simdgroup_matrix<T, 8, 8> on every device, for tests/gpu/test_simdgroup_matrix.py:
// loads (device and threadgroup memory, strides, origins, transposes), products,
// stores, the element layout a lane holds, and its constructors. One SIMD-group
// (32 threads) a threadgroup.
#include "../mkv_kernel.h"
#include "test_params.h"
#include <metal_simdgroup_matrix>
#include "../simdgroup_tile.h"

// prm: what a test asks for (test_params.h's SgMatrix): D = sum over k tiles of
// A_t B_t (+ C), A_t the 8x8 block of a at (a_x + 8t, a_y), B_t the block of b
// at (b_x, b_y + 8t) (origins are (column, row)), each read transposed if asked.
template <typename T>
[[kernel]] void test_sgm_mma(const device T* a [[buffer(0)]],
                             const device T* b [[buffer(1)]],
                             const device T* c [[buffer(2)]],
                             device T* d [[buffer(3)]],
                             constant mkv_test::SgMatrix& p [[buffer(4)]]) {
  simdgroup_matrix<T, 8, 8> acc;
  simdgroup_load(acc, c, p.ldc);
  for (uint t = 0; t < p.k_tiles; ++t) {
    simdgroup_matrix<T, 8, 8> ma, mb;
    const ulong2 ao = p.ta ? ulong2(p.a_x, p.a_y + 8 * t) : ulong2(p.a_x + 8 * t, p.a_y);
    const ulong2 bo = p.tb ? ulong2(p.b_x + 8 * t, p.b_y) : ulong2(p.b_x, p.b_y + 8 * t);
    simdgroup_load(ma, a, p.lda, ao, p.ta != 0);
    simdgroup_load(mb, b, p.ldb, bo, p.tb != 0);
    if (p.accumulate || t > 0) {
      simdgroup_multiply_accumulate(acc, ma, mb, acc);
    } else {
      simdgroup_multiply(acc, ma, mb);
    }
  }
  simdgroup_store(acc, d, p.ldd, ulong2(p.d_x, p.d_y), p.td != 0);
}

// The same product staged through threadgroup memory: A and B copied in by the
// threads, loaded from there (stride 8), D stored there and copied out.
template <typename T>
[[kernel]] void test_sgm_mma_threadgroup(const device T* a [[buffer(0)]],
                                         const device T* b [[buffer(1)]],
                                         const device T* c [[buffer(2)]],
                                         device T* d [[buffer(3)]],
                                         uint lane [[thread_index_in_simdgroup]]) {
  threadgroup T ta[64];
  threadgroup T tb[64];
  threadgroup T td[64];
  for (uint i = lane; i < 64; i += 32) {
    ta[i] = a[i];
    tb[i] = b[i];
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  simdgroup_matrix<T, 8, 8> ma, mb, mc;
  simdgroup_load(ma, ta);
  simdgroup_load(mb, tb);
  simdgroup_load(mc, c);
  simdgroup_multiply_accumulate(mc, ma, mb, mc);
  simdgroup_store(mc, td);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint i = lane; i < 64; i += 32) d[i] = td[i];
}

// Mixed precision, as MSL allows: half (or bfloat) inputs, a float accumulator.
template <typename T>
[[kernel]] void test_sgm_mixed(const device T* a [[buffer(0)]],
                               const device T* b [[buffer(1)]],
                               const device float* c [[buffer(2)]],
                               device float* d [[buffer(3)]]) {
  simdgroup_matrix<T, 8, 8> ma, mb;
  simdgroup_float8x8 acc;
  simdgroup_load(ma, a);
  simdgroup_load(mb, b, 8, 0, true);
  simdgroup_load(acc, c);
  simdgroup_multiply_accumulate(acc, ma, mb, acc);
  simdgroup_store(acc, d);
}

// The layout: out[lane][0..1] = the elements lane holds of a matrix loaded
// from src (so the test sees which source elements land where); then the
// diagonal and filled constructors (out rows 32..63, 64..95); then products
// after every lane doubled its own elements of M, as A (out rows 96..127) and
// as B (rows 128..159): a product must see all lanes' changes.
template <typename T>
[[kernel]] void test_sgm_layout(const device T* src [[buffer(0)]],
                                device T* out [[buffer(1)]],
                                uint lane [[thread_index_in_simdgroup]]) {
  simdgroup_matrix<T, 8, 8> m;
  simdgroup_load(m, src);
  out[2 * lane] = m.thread_elements()[0];
  out[2 * lane + 1] = m.thread_elements()[1];
  simdgroup_matrix<T, 8, 8> diag = simdgroup_matrix<T, 8, 8>(T(3.0f));
  simdgroup_store(diag, out + 64, 8);
  simdgroup_matrix<T, 8, 8> filled = make_filled_simdgroup_matrix<T, 8, 8>(T(2.0f));
  simdgroup_store(filled, out + 128, 8);
  simdgroup_matrix<T, 8, 8> twice = m;
  twice.thread_elements()[0] = T(float(twice.thread_elements()[0]) * 2.0f);
  twice.thread_elements()[1] = T(float(twice.thread_elements()[1]) * 2.0f);
  simdgroup_matrix<T, 8, 8> prod;
  simdgroup_multiply(prod, twice, diag);
  simdgroup_store(prod, out + 192, 8);
  simdgroup_multiply(prod, diag, twice);  // the changed matrix as B
  simdgroup_store(prod, out + 256, 8);
}

// simdgroup_load4<B> (metal/simdgroup_tile.h) from a threadgroup tile (the
// 1024-element src copied in, 16-byte aligned storage): out[q] = fragment q as
// simdgroup_store writes it (64 elements each), then out[4] = fragment 0 x
// fragment 1 and out[5] = fragment 2 x fragment 3, so each fragment serves as
// the a and as the b operand whatever role it was loaded for.
template <bool B, typename T>
[[kernel]] void test_sgm_load4(const device T* src [[buffer(0)]],
                               device T* out [[buffer(1)]],
                               constant mkv_test::SgLoad4& p [[buffer(2)]],
                               uint lane [[thread_index_in_simdgroup]]) {
  threadgroup uint4 storage[1024 * sizeof(T) / 16];
  threadgroup T* tile = (threadgroup T*)storage;
  for (uint i = lane; i < 1024; i += 32) tile[i] = src[i];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  simdgroup_matrix<T, 8, 8> m[4];
  simdgroup_load4<B>(m[0], m[1], m[2], m[3], tile + p.start, p.step1, p.step2, p.elements_per_row, p.transpose != 0);
  for (uint q = 0; q < 4; ++q) simdgroup_store(m[q], out + 64 * q, 8);
  simdgroup_matrix<T, 8, 8> prod;
  simdgroup_multiply(prod, m[0], m[1]);
  simdgroup_store(prod, out + 256, 8);
  simdgroup_multiply(prod, m[2], m[3]);
  simdgroup_store(prod, out + 320, 8);
}

MKV_KERNEL("test_sgm_mma_f32", test_sgm_mma<float>)
MKV_KERNEL("test_sgm_mma_threadgroup_f32", test_sgm_mma_threadgroup<float>)
MKV_KERNEL("test_sgm_layout_f32", test_sgm_layout<float>)
MKV_KERNEL("test_sgm_mma_f16", test_sgm_mma<half>)
MKV_KERNEL("test_sgm_mma_threadgroup_f16", test_sgm_mma_threadgroup<half>)
MKV_KERNEL("test_sgm_layout_f16", test_sgm_layout<half>)
MKV_KERNEL("test_sgm_mma_bf16", test_sgm_mma<bfloat>)
MKV_KERNEL("test_sgm_mma_threadgroup_bf16", test_sgm_mma_threadgroup<bfloat>)
MKV_KERNEL("test_sgm_layout_bf16", test_sgm_layout<bfloat>)
MKV_KERNEL("test_sgm_mixed_f16", test_sgm_mixed<half>)
MKV_KERNEL("test_sgm_mixed_bf16", test_sgm_mixed<bfloat>)
MKV_KERNEL("test_sgm_load4_a_f32", test_sgm_load4<false, float>)
MKV_KERNEL("test_sgm_load4_b_f32", test_sgm_load4<true, float>)
MKV_KERNEL("test_sgm_load4_a_f16", test_sgm_load4<false, half>)
MKV_KERNEL("test_sgm_load4_b_f16", test_sgm_load4<true, half>)
MKV_KERNEL("test_sgm_load4_a_bf16", test_sgm_load4<false, bfloat>)
MKV_KERNEL("test_sgm_load4_b_bf16", test_sgm_load4<true, bfloat>)
