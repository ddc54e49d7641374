// Products of 8x8 simdgroup_matrix fragments in groups a device's matrix units
// may run as one instruction, and loads of the fragments they take
// (docs/KERNELS.md "16-bit operands"):
//
//   simdgroup_mma_2x2(d0, d1, a00, a01, a10, a11, b0, b1):
//     d0 += a00 b0 + a01 b1;  d1 += a10 b0 + a11 b1
//
// two row blocks (d0, d1) over two k steps. Apple GPUs and the host executor run
// it as the four simdgroup_multiply_accumulate calls below, in that order (so
// every accumulator sums its k steps in the order a loop over them would).
// The CUDA device's prelude runs it as one mma.sync m16n8k16 when a and b are
// both half or both bfloat (rows 0-7 d0, rows 8-15 d1: none of the tensor
// core's rows left idle; the hardware's order within the 16 k), and as the four
// products otherwise.
//
//   simdgroup_load4<B>(m0, m1, m2, m3, src, step1, step2, elements_per_row, transpose):
//     m_q = simdgroup_load(src + (q % 2) step1 + (q / 2) step2, elements_per_row, 0, transpose)
//
// a 2 x 2 group of fragments of one threadgroup tile that will be a operands of
// products (B false) or b operands (B true). The values are simdgroup_load's
// on every device; the role lets a device load only the layout that operand
// takes, four fragments an instruction (the CUDA device: one ldmatrix.x4 of
// half or bfloat fragments). What it asks of the tile: every fragment row
// starts 16 bytes aligned (src, step1, step2 and elements_per_row multiples of
// 16 bytes); the host executor checks it, so a kernel that breaks it fails on
// every test run. And a fragment loaded as a b operand is not an accumulator
// before a product writes it (the CUDA device would read a layout it skipped).
#pragma once

#include <metal_simdgroup_matrix>

#if !defined(__METALKV_CUDA__)
template <typename T, typename U, typename V>
inline void simdgroup_mma_2x2(thread simdgroup_matrix<T, 8, 8>& d0, thread simdgroup_matrix<T, 8, 8>& d1,
                              thread const simdgroup_matrix<U, 8, 8>& a00, thread const simdgroup_matrix<U, 8, 8>& a01,
                              thread const simdgroup_matrix<U, 8, 8>& a10, thread const simdgroup_matrix<U, 8, 8>& a11,
                              thread const simdgroup_matrix<V, 8, 8>& b0, thread const simdgroup_matrix<V, 8, 8>& b1) {
  simdgroup_multiply_accumulate(d0, a00, b0, d0);
  simdgroup_multiply_accumulate(d0, a01, b1, d0);
  simdgroup_multiply_accumulate(d1, a10, b0, d1);
  simdgroup_multiply_accumulate(d1, a11, b1, d1);
}

template <bool B, typename T>
inline void simdgroup_load4(thread simdgroup_matrix<T, 8, 8>& m0, thread simdgroup_matrix<T, 8, 8>& m1,
                            thread simdgroup_matrix<T, 8, 8>& m2, thread simdgroup_matrix<T, 8, 8>& m3,
                            const threadgroup T* src, ulong step1, ulong step2, ulong elements_per_row,
                            bool transpose = false) {
#if defined(__METALKV_HOST__)
  simdgroup_matrix_detail::check_fragment_rows(src, (step1 | step2 | elements_per_row) * sizeof(T));
#endif
  simdgroup_load(m0, src, elements_per_row, ulong2(0, 0), transpose);
  simdgroup_load(m1, src + step1, elements_per_row, ulong2(0, 0), transpose);
  simdgroup_load(m2, src + step2, elements_per_row, ulong2(0, 0), transpose);
  simdgroup_load(m3, src + step1 + step2, elements_per_row, ulong2(0, 0), transpose);
}
#endif
