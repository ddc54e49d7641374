// CUDA prelude, part 2: the MSL math, geometric, relational and integer
// functions, in namespace metal and aliased into metal::fast / metal::precise.
//
// CUDA declares float overloads at global scope (exp(float), max(float, float),
// min(uint, uint), ...), and MSL code calls exp(x) unqualified after
// `using namespace metal;`: a second metal::exp(float) would make that call
// ambiguous. So metal:: re-exports CUDA's global functions (one entity) and
// adds only what CUDA lacks: half and vector overloads, and the MSL-only
// functions (fract, saturate, sign, step, mix, smoothstep, powr, clamp, min3 ...).
// half functions compute in float and round the result once, as on the host.
//
// Precision is CUDA's precise library unless the build says -use_fast_math
// (it should not: docs/METAL_BACKEND.md). fast:: and precise:: name the same
// functions, as on the host, but fast::exp2 on a float (the hardware's: end of file).
//
// The functions that are the same logic as the host prelude's (vector
// abs/min/max/clamp, min3 ..., length ... cross, all/any, the integer functions
// but popcount/clz/ctz/mulhi, the vector integer forms, fast::/precise::) and
// the constants are in cpp/gpu/prelude_common/mkv_common_math_*.h.
#pragma once

// ---- Constants: the ones spelled with CUDA bit patterns here (the rest are shared)
#ifndef HUGE_VALF
#define HUGE_VALF (__int_as_float(0x7f800000))
#endif
#ifndef INFINITY
#define INFINITY (__int_as_float(0x7f800000))
#endif
#ifndef NAN
#define NAN (__int_as_float(0x7fffffff))
#endif
#include "../../prelude_common/mkv_common_math_head.h"

namespace metal {
namespace mkv_detail {
MKV_HD float h2f(half h) { return __half2float(h); }
MKV_HD half f2h(float f) { return __float2half_rn(f); }
// Hermite interpolation of x between the edges.
MKV_HD float smoothstep(float edge0, float edge1, float x) {
  const float t = fminf(fmaxf((x - edge0) / (edge1 - edge0), 0.0f), 1.0f);
  return t * t * (3.0f - 2.0f * t);
}
}  // namespace mkv_detail

// ---- Float functions ---------------------------------------------------------
// MKV_CUDA1(name): CUDA's global float overload plus half and vector ones.
// MKV_MSL1(name, expr): MSL-only, defined here for float, half and vectors.
#define MKV_VEC1(name)                                                                  \
  MKV_HD half name(half h) { return mkv_detail::f2h(name(mkv_detail::h2f(h))); }        \
  template <class V, mkv_detail::enable_float_op<V> = 0> MKV_HD auto name(const V& v) { \
    return mkv_detail::map([](auto e) { return name(e); }, v);                          \
  }
#define MKV_VEC2(name)                                                                  \
  MKV_HD half name(half a, half b) {                                                    \
    return mkv_detail::f2h(name(mkv_detail::h2f(a), mkv_detail::h2f(b)));               \
  }                                                                                     \
  template <class A, class B, mkv_detail::enable_float_op<A, B> = 0>                    \
  MKV_HD auto name(const A& a, const B& b) {                                            \
    return mkv_detail::map([](auto x, auto y) { return name(x, y); }, a, b);            \
  }
#define MKV_VEC3(name)                                                                  \
  MKV_HD half name(half a, half b, half c) {                                            \
    return mkv_detail::f2h(name(mkv_detail::h2f(a), mkv_detail::h2f(b), mkv_detail::h2f(c))); \
  }                                                                                     \
  template <class A, class B, class C, mkv_detail::enable_float_op<A, B, C> = 0>        \
  MKV_HD auto name(const A& a, const B& b, const C& c) {                                \
    return mkv_detail::map([](auto x, auto y, auto z) { return name(x, y, z); }, a, b, c); \
  }
#define MKV_CUDA1(name) using ::name; MKV_VEC1(name)
#define MKV_CUDA2(name) using ::name; MKV_VEC2(name)
#define MKV_CUDA3(name) using ::name; MKV_VEC3(name)
#define MKV_MSL1(name, expr) MKV_HD float name(float x) { return expr; } MKV_VEC1(name)
#define MKV_MSL2(name, expr) MKV_HD float name(float x, float y) { return expr; } MKV_VEC2(name)
#define MKV_MSL3(name, expr) MKV_HD float name(float x, float y, float z) { return expr; } MKV_VEC3(name)

MKV_CUDA1(fabs) MKV_CUDA1(floor) MKV_CUDA1(ceil) MKV_CUDA1(round) MKV_CUDA1(rint) MKV_CUDA1(trunc)
MKV_CUDA1(sqrt) MKV_CUDA1(rsqrt) MKV_CUDA1(exp) MKV_CUDA1(exp2) MKV_CUDA1(exp10) MKV_CUDA1(log)
MKV_CUDA1(log2) MKV_CUDA1(log10) MKV_CUDA1(sin) MKV_CUDA1(cos) MKV_CUDA1(tan) MKV_CUDA1(asin)
MKV_CUDA1(acos) MKV_CUDA1(atan) MKV_CUDA1(sinh) MKV_CUDA1(cosh) MKV_CUDA1(tanh) MKV_CUDA1(asinh)
MKV_CUDA1(acosh) MKV_CUDA1(atanh)
MKV_MSL1(fract, fminf(x - floorf(x), 0x1.fffffep-1f))  // MSL clamps to < 1
MKV_MSL1(saturate, fminf(fmaxf(x, 0.0f), 1.0f))
// MSL sign: +-1 for nonzero, the zero itself for +-0, 0 for NaN.
MKV_MSL1(sign, x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : (x == 0.0f ? x : 0.0f)))

// fmin/fmax (and float min/max) return the other operand when one is NaN.
MKV_CUDA2(fmin) MKV_CUDA2(fmax) MKV_CUDA2(fmod) MKV_CUDA2(pow) MKV_CUDA2(atan2)
MKV_CUDA2(copysign) MKV_CUDA2(fdim)
MKV_MSL2(powr, powf(x, y))  // MSL: x >= 0 only
MKV_MSL2(step, y < x ? 0.0f : 1.0f)  // step(edge, x)

MKV_CUDA3(fma)
MKV_MSL3(mix, x + (y - x) * z)  // mix(x, y, a)
MKV_MSL3(smoothstep, mkv_detail::smoothstep(x, y, z))  // smoothstep(edge0, edge1, x)

// ---- abs, min, max, clamp: float, half, every integer type, vectors -----------
using ::abs;
using ::min;
using ::max;
MKV_HD half abs(half x) { return __habs(x); }
MKV_HD half min(half x, half y) { return __hmin(x, y); }  // NaN: the other operand, like fminf
MKV_HD half max(half x, half y) { return __hmax(x, y); }
// MSL: undefined if lo > hi; this gives hi.
MKV_HD float clamp(float x, float lo, float hi) { return fminf(fmaxf(x, lo), hi); }
MKV_HD half clamp(half x, half lo, half hi) { return min(max(x, lo), hi); }
template <class T, mkv_detail::enable_int<T> = 0> MKV_HD T clamp(T x, T lo, T hi) {
  return x < lo ? lo : (hi < x ? hi : x);
}
// CUDA's integer min/max cover int, uint, long, ulong, long long; short and
// char promote to int there, so these keep MSL's result type.
#define MKV_SMALL_INT(T)                                                              \
  MKV_HD T min(T x, T y) { return y < x ? y : x; }                                    \
  MKV_HD T max(T x, T y) { return x < y ? y : x; }                                    \
  MKV_HD T abs(T x) { return static_cast<T>(x < 0 ? -x : x); }
MKV_SMALL_INT(short) MKV_SMALL_INT(signed char)
#undef MKV_SMALL_INT
MKV_HD ushort min(ushort x, ushort y) { return y < x ? y : x; }
MKV_HD ushort max(ushort x, ushort y) { return x < y ? y : x; }
MKV_HD uchar min(uchar x, uchar y) { return y < x ? y : x; }
MKV_HD uchar max(uchar x, uchar y) { return x < y ? y : x; }
MKV_HD uint abs(uint x) { return x; }

// ---- Geometric: dot (the rest are shared); half accumulates in float -----------
template <class A, class B, mkv_detail::enable_float_op<A, B> = 0> MKV_HD auto dot(const A& a0, const B& b0) {
  static_assert(mkv_detail::is_vec_like_v<A> && mkv_detail::is_vec_like_v<B>, "dot takes two vectors");
  using C = mkv_detail::common<A, B>;
  const auto a = mkv_detail::value(a0);
  const auto b = mkv_detail::value(b0);
  float s = 0.0f;
  for (int i = 0; i < C::size; ++i) s += static_cast<float>(a[i]) * static_cast<float>(b[i]);
  return static_cast<typename C::elem>(s);
}

// ---- Integer functions on CUDA intrinsics (the rest are shared) ----------------
template <class T, mkv_detail::enable_int<T> = 0> MKV_D T popcount(T x) {
  return static_cast<T>(__popcll(static_cast<unsigned long long>(static_cast<mkv_detail::uint_of<T>>(x))));
}
// clz/ctz of 0 is the bit width, as in MSL.
template <class T, mkv_detail::enable_int<T> = 0> MKV_D T clz(T x) {
  const unsigned long long u = static_cast<mkv_detail::uint_of<T>>(x);
  return static_cast<T>(__clzll(static_cast<long long>(u)) - (64 - mkv_detail::bits_v<T>));
}
template <class T, mkv_detail::enable_int<T> = 0> MKV_D T ctz(T x) {
  const unsigned long long u = static_cast<mkv_detail::uint_of<T>>(x);
  return static_cast<T>(u == 0 ? mkv_detail::bits_v<T> : __ffsll(static_cast<long long>(u)) - 1);
}
// High half of the full-width product.
template <class T, mkv_detail::enable_int<T> = 0> MKV_D T mulhi(T x, T y) {
  if constexpr (sizeof(T) == 8) {
    return std::is_signed<T>::value ? static_cast<T>(__mul64hi(static_cast<long long>(x), static_cast<long long>(y)))
                                    : static_cast<T>(__umul64hi(static_cast<unsigned long long>(x),
                                                                static_cast<unsigned long long>(y)));
  } else {
    using W = std::conditional_t<std::is_signed<T>::value, int64_t, uint64_t>;
    return static_cast<T>((W(x) * W(y)) >> mkv_detail::bits_v<T>);
  }
}
}  // namespace metal

#include "../../prelude_common/mkv_common_math_ops.h"

namespace metal {

// ---- Relational: bool for scalars, boolN for vectors ----------------------------
#define MKV_PRED(name)                                                                \
  using ::name;                                                                       \
  MKV_HD bool name(half h) { return name(mkv_detail::h2f(h)); }                       \
  template <class V, mkv_detail::enable_float_op<V> = 0> MKV_HD auto name(const V& v) { \
    return mkv_detail::map([](auto e) -> bool { return name(e); }, v);                \
  }
MKV_PRED(isnan) MKV_PRED(isinf) MKV_PRED(isfinite) MKV_PRED(signbit)
#undef MKV_PRED
// isnormal must look at the half itself: a subnormal half is a normal float.
// The float one is the standard library's (CUDA has none; a second one here
// would be ambiguous), a constexpr host function: device code may call it
// only under nvcc's --expt-relaxed-constexpr (the build passes it).
using ::isnormal;
MKV_HD bool isnormal(half h) {
  const uint e = (__half_as_ushort(h) >> 10) & 0x1fu;
  return e != 0 && e != 0x1fu;
}
template <class V, mkv_detail::enable_float_op<V> = 0> MKV_HD auto isnormal(const V& v) {
  return mkv_detail::map([](auto e) -> bool { return isnormal(e); }, v);
}

// select(a, b, c) = c ? b : a, per element when c is a bool vector.
template <class A, class B, class C, mkv_detail::enable_vec_op<A, B> = 0>
MKV_HD auto select(const A& a0, const B& b0, const C& c0) {
  using K = mkv_detail::common<A, B>;
  using E = typename K::elem;
  static_assert(std::is_same<typename mkv_detail::vec_traits<C>::elem, bool>::value &&
                    (!mkv_detail::is_vec_like_v<C> || mkv_detail::vec_traits<C>::size == K::size),
                "select: condition must be bool or a bool vector of the same width");
  const auto a = mkv_detail::value(a0);
  const auto b = mkv_detail::value(b0);
  const auto c = mkv_detail::value(c0);
  vec<E, K::size> r;
  for (int i = 0; i < K::size; ++i)
    r[i] = mkv_detail::lane<bool>(c, i) ? mkv_detail::lane<E>(b, i) : mkv_detail::lane<E>(a, i);
  return r;
}

#undef MKV_VEC1
#undef MKV_VEC2
#undef MKV_VEC3
#undef MKV_CUDA1
#undef MKV_CUDA2
#undef MKV_CUDA3
#undef MKV_MSL1
#undef MKV_MSL2
#undef MKV_MSL3

}  // namespace metal

#define MKV_PRELUDE_OWN_FAST_EXP2 1
#include "../../prelude_common/mkv_common_math_fast_precise.h"

// metal::fast::exp2 on a float: the hardware's exp2 (ex2.approx.ftz, one
// MUFU.EX2: within 2 ulp, results below 2^-126 flushed to 0), as Metal's fast
// variant trades accuracy for speed; precise exp2 spends four more
// instructions on the subnormal range. Kernels ask for it where a result is
// rounded to half next (attention's probabilities). Other types: precise.
namespace metal {
namespace fast {
MKV_D float exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
template <class T> MKV_D auto exp2(const T& x) -> decltype(metal::exp2(x)) { return metal::exp2(x); }
}  // namespace fast
}  // namespace metal
