// One output of a matmul (every gemv and gemm kernel's epilogue) from its sum,
// as linear_params.h's flags say: plus the bias (kMatmulBias), through
// gelu_tanh (kMatmulGelu: activation.h's, the float function gelu_f32 runs),
// then added to what the output holds (kMatmulAccumulate: a fused residual
// add) or written.
#pragma once

#include "mkv_kernel.h"
#include "activation.h"
#include "linear_params.h"

inline float matmul_value(constant mkv_params::Matmul& p, const device float* bias, uint n, float sum) {
  const float v = sum + ((p.flags & mkv_params::kMatmulBias) ? bias[n] : 0.0f);
  return (p.flags & mkv_params::kMatmulGelu) ? ActGeluTanh::apply(v) : v;
}

inline void matmul_put(constant mkv_params::Matmul& p, const device float* bias, uint n, float sum,
                       device float& out) {
  const float v = matmul_value(p, bias, n, sum);
  out = (p.flags & mkv_params::kMatmulAccumulate) ? out + v : v;
}
