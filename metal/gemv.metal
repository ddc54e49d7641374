// Matrix-vector product with f16 weights: y = W · x, accumulated in f32.
//
// Decode is memory bound: each weight byte is read exactly once. A SIMD-group
// owns kRowsPerSimd rows; its 32 lanes stride over the columns in half4 chunks
// and reduce with simd_sum. Threadgroup: kSimdsPerGroup SIMD-groups.
#include <metal_stdlib>
#include "params.h"
using namespace metal;

constant uint kRowsPerSimd = 4;

kernel void gemv_f16(constant mkv_params::Gemv& p [[buffer(0)]],
                     const device half* w [[buffer(1)]],      // (rows, cols)
                     const device float* x [[buffer(2)]],     // (cols)
                     device float* y [[buffer(3)]],           // (rows)
                     uint tg [[threadgroup_position_in_grid]],
                     uint simd [[simdgroup_index_in_threadgroup]],
                     uint simds [[simdgroups_per_threadgroup]],
                     uint lane [[thread_index_in_simdgroup]]) {
  const uint row0 = (tg * simds + simd) * kRowsPerSimd;
  float acc[kRowsPerSimd] = {0.0f, 0.0f, 0.0f, 0.0f};
  // half4 loads need 8-byte alignment, which every row has only if cols % 4 == 0.
  const uint vec_cols = p.cols % 4 == 0 ? p.cols : 0;
  for (uint c = lane * 4; c < vec_cols; c += 32 * 4) {
    const float4 xv = *(const device float4*)(x + c);
    for (uint r = 0; r < kRowsPerSimd; ++r) {
      if (row0 + r < p.rows) {
        const float4 wv = float4(*(const device half4*)(w + (row0 + r) * p.cols + c));
        acc[r] += dot(wv, xv);
      }
    }
  }
  for (uint c = vec_cols + lane; c < p.cols; c += 32) {  // cols % 4 != 0: scalar loads
    for (uint r = 0; r < kRowsPerSimd; ++r)
      if (row0 + r < p.rows) acc[r] += float(w[(row0 + r) * p.cols + c]) * x[c];
  }
  for (uint r = 0; r < kRowsPerSimd; ++r) {
    const float total = simd_sum(acc[r]);
    if (lane == 0 && row0 + r < p.rows) y[row0 + r] = total;
  }
}
