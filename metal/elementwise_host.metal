// The host executor's shape of RMSNorm: rms_norm_<w>_h, built for the host
// only (GPU compilers see an empty file; the host also builds and tests the
// GPU shape, elementwise.h's rms_norm). A lane is one row, with no collective
// and no barrier. The GPU shape on the host runs a threadgroup of 32 fibers a
// row (the op gives fiber lanes one SIMD-group) and meets twice, at its
// simd_sum and its barrier: about 4 us a row of 576, most of it fiber
// switches (the default model's prefill spent 4 % of its time there).
//
// Same results, bit for bit, as the GPU shape with one SIMD-group on the
// host: lane l's sum of squares over its elements in the GPU shape's order
// (its float4s l, l + 32, ... through dot, or its scalars), the 32 lane sums
// folded in lane order as the host's simd_sum folds them, plus the
// threadgroup's 0.0f, then the same expression per element. In place is safe:
// a lane reads its row whole before it writes it.
#include "mkv_kernel.h"
#include "elementwise.h"

#if defined(MKV_HOST_SHAPES)
template <typename W>
MKV_MAX_THREADS(32) kernel void rms_norm_host(constant mkv_params::RmsNorm& p [[buffer(0)]],
                                              const device float* x [[buffer(1)]],  // (n_rows, dim)
                                              const device W* w [[buffer(2)]],      // (dim)
                                              device float* out [[buffer(3)]],      // (n_rows, dim); may be x
                                              uint tg [[threadgroup_position_in_grid]],
                                              uint lane [[thread_index_in_threadgroup]]) {
  const uint r = tg * 32 + lane;
  if (r >= p.n_rows) return;
  const device float* xr = x + ulong(r) * p.dim;
  device float* o = out + ulong(r) * p.dim;
  const bool vec = (p.flags & mkv_params::kRmsNormVec4) != 0;
  const uint n4 = p.dim / 4;
  float sum = 0.0f;
  for (uint l = 0; l < 32; ++l) {  // the GPU shape's lane l
    float ss = 0.0f;
    if (vec) {
      for (uint k = 0; k < mkv_params::kRmsNormVec; ++k) {
        const uint j = l + k * 32;
        const float4 v = j < n4 ? ((const device float4*)xr)[j] : float4(0.0f);
        ss += dot(v, v);
      }
    } else {
      for (uint j = l; j < p.dim; j += 32) ss += xr[j] * xr[j];
    }
    sum = l == 0 ? ss : sum + ss;
  }
  const float total = 0.0f + sum;
  const float inv = 1.0f / sqrt(total / float(p.dim) + p.eps);
  if (vec) {
    for (uint j = 0; j < n4; ++j)
      ((device float4*)o)[j] = ((const device float4*)xr)[j] * inv * (p.w_offset + weights4(w, j));
  } else {
    for (uint j = 0; j < p.dim; ++j) o[j] = xr[j] * inv * (p.w_offset + float(w[j]));
  }
}

MKV_KERNEL("rms_norm_f32_h", rms_norm_host<float>)
MKV_KERNEL("rms_norm_f16_h", rms_norm_host<half>)
#endif
