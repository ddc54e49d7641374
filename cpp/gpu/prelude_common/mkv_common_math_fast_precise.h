// Shared by both preludes, part 2 (end): metal::fast and metal::precise name
// the same functions as metal:: (libm's and CUDA's precise functions are
// within about an ulp, tighter than Metal's fast variants), but for a prelude
// that defines MKV_PRELUDE_OWN_FAST_EXP2 and its own fast::exp2 (the CUDA
// device: the hardware's exp2, as Metal's fast variant is). Included at the end
// of cpp/gpu/host/prelude/mkv_prelude_math.h and cpp/gpu/cuda/prelude/
// mkv_cuda_math.h: the using-declarations must come after every overload.
#pragma once

#define MKV_FAST_PRECISE_NAMES                                                        \
  using metal::abs; using metal::fabs; using metal::floor; using metal::ceil;          \
  using metal::round; using metal::rint; using metal::trunc; using metal::fract;       \
  using metal::sqrt; using metal::rsqrt; using metal::exp;                             \
  using metal::exp10; using metal::log; using metal::log2; using metal::log10;         \
  using metal::sin; using metal::cos; using metal::tan; using metal::asin;             \
  using metal::acos; using metal::atan; using metal::sinh; using metal::cosh;          \
  using metal::tanh; using metal::asinh; using metal::acosh; using metal::atanh;       \
  using metal::saturate; using metal::sign; using metal::fmin; using metal::fmax;      \
  using metal::min; using metal::max; using metal::clamp; using metal::fmod;           \
  using metal::pow; using metal::powr; using metal::atan2; using metal::copysign;      \
  using metal::fdim; using metal::step; using metal::fma; using metal::mix;            \
  using metal::smoothstep; using metal::dot; using metal::length;                      \
  using metal::length_squared; using metal::distance; using metal::normalize;          \
  using metal::cross; using metal::fmin3; using metal::fmax3; using metal::fmedian3;
namespace metal {
namespace fast {
MKV_FAST_PRECISE_NAMES
#if !defined(MKV_PRELUDE_OWN_FAST_EXP2)
using metal::exp2;
#endif
}  // namespace fast
namespace precise { MKV_FAST_PRECISE_NAMES using metal::exp2; }
}  // namespace metal
#undef MKV_FAST_PRECISE_NAMES
