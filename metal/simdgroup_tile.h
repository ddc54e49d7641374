// Products of 8x8 simdgroup_matrix fragments in groups a device's matrix units
// may run as one instruction (docs/KERNELS.md "16-bit operands"):
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
#endif
