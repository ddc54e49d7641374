// Gate activations of GLU feed-forwards, shared by the elementwise kernels
// (swiglu_f32, geglu_f32) and the fused gemv_swiglu_* / gemv_geglu_*
// (matmul.metal), so both paths compute the same float function.
#pragma once

#include "mkv_kernel.h"  // metal_stdlib, using namespace metal

// silu(g) = g / (1 + e^-g); e^-g overflows to inf for g < -88, giving -0.
struct ActSilu {
  static float apply(float g) { return g / (1.0f + exp(-g)); }
};

// gelu_pytorch_tanh(g) = 0.5 g (1 + tanh(u)), u = sqrt(2/pi) (g + 0.044715 g³),
// computed as g / (1 + e^(-2u)) (the same function: 0.5 (1 + tanh(u)) is
// sigmoid(2u)), which avoids the cancellation in 1 + tanh(u) for negative g.
struct ActGeluTanh {
  static float apply(float g) {
    const float u = 0.7978845608028654f * (g + 0.044715f * g * g * g);
    return g / (1.0f + exp(-2.0f * u));
  }
};
