// Host prelude, part 2: the MSL math, geometric, relational and integer
// functions, in namespace metal and aliased into metal::fast / metal::precise.
//
// Why __builtin_*: <cmath>/<math.h> would declare ::exp(double) etc. at
// global scope, and MSL code calls exp(x) unqualified after `using namespace
// metal;` -- both would be found and the call would be ambiguous. The
// builtins still call libm for the hard cases (link with -lm, as every C++
// program does).
//
// Shapes: every function takes float or half scalars, or vectors of them
// (elementwise); two- and three-argument functions also accept a scalar for
// any argument when another is a vector (clamp(v, 0.0f, 1.0f)). half
// functions compute in float and round the result to half once.
// fast:: and precise:: name the same implementations (libm's float functions
// are within about an ulp, tighter than Metal's fast variants).
//
// Build notes: with -mfma g++ contracts a*b+c into fma by default (as a GPU
// may); add -ffp-contract=off if host results must not depend on -march.
// -fno-math-errno lets sqrt compile to one instruction (MSL has no errno).
//
// Deliberately absent: erf/erfc (Metal has none; kernels that need GELU-erf
// define their own approximation -- defining metal::erf here would make such a
// kernel's unqualified erf(x) ambiguous), sincos/frexp/modf (out-parameters),
// ldexp/ilogb/nextafter, sinpi/cospi/tanpi, reflect/refract/faceforward,
// reverse_bits, the saturating and 24-bit integer functions, pack/unpack,
// matrices. A kernel using one fails to compile here, never silently.
//
// The functions that are the same logic as the CUDA prelude's (vector
// abs/min/max/clamp, min3 ..., length ... cross, all/any, the integer functions
// but popcount/clz/ctz/mulhi, the vector integer forms, fast::/precise::) and
// the constants are in cpp/gpu/prelude_common/mkv_common_math_*.h.
#pragma once

#include <cfloat>   // FLT_MAX, FLT_MIN, FLT_EPSILON ... (macros only)
#include <climits>  // INT_MAX, UINT_MAX, CHAR_BIT ... (macros only)

#include "mkv_prelude_types.h"

// ---- Constants: the ones spelled with builtins here (the rest are shared) ----
#ifndef HUGE_VALF
#define HUGE_VALF (__builtin_huge_valf())
#endif
#ifndef INFINITY
#define INFINITY (__builtin_inff())
#endif
#ifndef NAN
#define NAN (__builtin_nanf(""))
#endif
#include "../../prelude_common/mkv_common_math_head.h"

namespace metal {
namespace mkv_detail {
// Hermite interpolation of x between the edges.
inline float smoothstep(float edge0, float edge1, float x) {
  const float t = __builtin_fminf(__builtin_fmaxf((x - edge0) / (edge1 - edge0), 0.0f), 1.0f);
  return t * t * (3.0f - 2.0f * t);
}
}  // namespace mkv_detail

// ---- Float functions: scalar float (the definition), half (via float) and
// vector (elementwise) overloads, from one line each ------------------------
#define MKV_MATH1(name, expr)                                                         \
  inline float name(float x) { return expr; }                                         \
  inline half name(half h) { return static_cast<half>(name(static_cast<float>(h))); } \
  template <class V, mkv_detail::enable_float_op<V> = 0> inline auto name(const V& v) { \
    return mkv_detail::map([](auto e) { return name(e); }, v);                        \
  }
#define MKV_MATH2(name, expr)                                                         \
  inline float name(float x, float y) { return expr; }                                \
  inline half name(half a, half b) {                                                  \
    return static_cast<half>(name(static_cast<float>(a), static_cast<float>(b)));     \
  }                                                                                   \
  template <class A, class B, mkv_detail::enable_float_op<A, B> = 0>                  \
  inline auto name(const A& a, const B& b) {                                          \
    return mkv_detail::map([](auto x, auto y) { return name(x, y); }, a, b);          \
  }
#define MKV_MATH3(name, expr)                                                         \
  inline float name(float x, float y, float z) { return expr; }                       \
  inline half name(half a, half b, half c) {                                          \
    return static_cast<half>(name(static_cast<float>(a), static_cast<float>(b), static_cast<float>(c))); \
  }                                                                                   \
  template <class A, class B, class C, mkv_detail::enable_float_op<A, B, C> = 0>      \
  inline auto name(const A& a, const B& b, const C& c) {                              \
    return mkv_detail::map([](auto x, auto y, auto z) { return name(x, y, z); }, a, b, c); \
  }

MKV_MATH1(fabs, __builtin_fabsf(x))
MKV_MATH1(floor, __builtin_floorf(x))
MKV_MATH1(ceil, __builtin_ceilf(x))
MKV_MATH1(round, __builtin_roundf(x))  // halfway cases away from zero
MKV_MATH1(rint, __builtin_rintf(x))    // halfway cases to even
MKV_MATH1(trunc, __builtin_truncf(x))
MKV_MATH1(fract, __builtin_fminf(x - __builtin_floorf(x), 0x1.fffffep-1f))  // MSL clamps to < 1
MKV_MATH1(sqrt, __builtin_sqrtf(x))
MKV_MATH1(rsqrt, 1.0f / __builtin_sqrtf(x))
MKV_MATH1(exp, __builtin_expf(x))
MKV_MATH1(exp2, __builtin_exp2f(x))
MKV_MATH1(exp10, __builtin_powf(10.0f, x))
MKV_MATH1(log, __builtin_logf(x))
MKV_MATH1(log2, __builtin_log2f(x))
MKV_MATH1(log10, __builtin_log10f(x))
MKV_MATH1(sin, __builtin_sinf(x))
MKV_MATH1(cos, __builtin_cosf(x))
MKV_MATH1(tan, __builtin_tanf(x))
MKV_MATH1(asin, __builtin_asinf(x))
MKV_MATH1(acos, __builtin_acosf(x))
MKV_MATH1(atan, __builtin_atanf(x))
MKV_MATH1(sinh, __builtin_sinhf(x))
MKV_MATH1(cosh, __builtin_coshf(x))
MKV_MATH1(tanh, __builtin_tanhf(x))
MKV_MATH1(asinh, __builtin_asinhf(x))
MKV_MATH1(acosh, __builtin_acoshf(x))
MKV_MATH1(atanh, __builtin_atanhf(x))
MKV_MATH1(saturate, __builtin_fminf(__builtin_fmaxf(x, 0.0f), 1.0f))
// MSL sign: +-1 for nonzero, the zero itself for +-0, 0 for NaN.
MKV_MATH1(sign, x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : (x == 0.0f ? x : 0.0f)))

// fmin/fmax (and float min/max) return the other operand when one is NaN.
MKV_MATH2(fmin, __builtin_fminf(x, y))
MKV_MATH2(fmax, __builtin_fmaxf(x, y))
MKV_MATH2(fmod, __builtin_fmodf(x, y))
MKV_MATH2(pow, __builtin_powf(x, y))
MKV_MATH2(powr, __builtin_powf(x, y))  // MSL: x >= 0 only
MKV_MATH2(atan2, __builtin_atan2f(x, y))
MKV_MATH2(copysign, __builtin_copysignf(x, y))
MKV_MATH2(fdim, __builtin_fdimf(x, y))
MKV_MATH2(step, y < x ? 0.0f : 1.0f)  // step(edge, x)

MKV_MATH3(fma, __builtin_fmaf(x, y, z))
MKV_MATH3(mix, x + (y - x) * z)  // mix(x, y, a)
MKV_MATH3(smoothstep, mkv_detail::smoothstep(x, y, z))  // smoothstep(edge0, edge1, x)

// ---- abs, min, max, clamp: float, half, every integer type, vectors --------
inline float abs(float x) { return __builtin_fabsf(x); }
inline half abs(half x) { return static_cast<half>(__builtin_fabsf(static_cast<float>(x))); }
inline float min(float x, float y) { return __builtin_fminf(x, y); }
inline half min(half x, half y) { return static_cast<half>(__builtin_fminf(x, y)); }
inline float max(float x, float y) { return __builtin_fmaxf(x, y); }
inline half max(half x, half y) { return static_cast<half>(__builtin_fmaxf(x, y)); }
// MSL: undefined if lo > hi; this gives hi.
inline float clamp(float x, float lo, float hi) { return __builtin_fminf(__builtin_fmaxf(x, lo), hi); }
inline half clamp(half x, half lo, half hi) { return static_cast<half>(clamp(float(x), float(lo), float(hi))); }

// abs(INT_MIN) is INT_MIN (two's complement wrap, as on the GPU; we build with -fwrapv).
template <class T, mkv_detail::enable_int<T> = 0> inline T abs(T x) {
  if constexpr (std::is_signed<T>::value) return x < 0 ? static_cast<T>(-x) : x;
  return x;
}
template <class T, mkv_detail::enable_int<T> = 0> inline T min(T x, T y) { return y < x ? y : x; }
template <class T, mkv_detail::enable_int<T> = 0> inline T max(T x, T y) { return x < y ? y : x; }
template <class T, mkv_detail::enable_int<T> = 0> inline T clamp(T x, T lo, T hi) { return min(max(x, lo), hi); }

// ---- Geometric: dot (the rest are shared); half accumulates in float ------
template <class A, class B, mkv_detail::enable_float_op<A, B> = 0> inline auto dot(const A& a, const B& b) {
  static_assert(mkv_detail::is_vec_like_v<A> && mkv_detail::is_vec_like_v<B>, "dot takes two vectors");
  using C = mkv_detail::common<A, B>;
  float s = 0.0f;
  if constexpr (std::is_same<typename C::elem, float>::value && C::size != 3) {
    // The products in one native multiply, summed in the same order.
    const auto p = mkv_detail::native_arg<float, C::size>(a) * mkv_detail::native_arg<float, C::size>(b);
    for (int i = 0; i < C::size; ++i) s += p[i];
  } else {
    for (int i = 0; i < C::size; ++i) s += static_cast<float>(a[i]) * static_cast<float>(b[i]);
  }
  return static_cast<typename C::elem>(s);
}

// ---- Integer functions the builtins compute (the rest are shared) ----------
template <class T, mkv_detail::enable_int<T> = 0> inline T popcount(T x) {
  return static_cast<T>(__builtin_popcountll(static_cast<mkv_detail::uint_of<T>>(x)));
}
// clz/ctz of 0 is the bit width (the builtins leave it undefined).
template <class T, mkv_detail::enable_int<T> = 0> inline T clz(T x) {
  const auto u = static_cast<mkv_detail::uint_of<T>>(x);
  return static_cast<T>(u == 0 ? mkv_detail::bits_v<T> : __builtin_clzll(u) - (64 - mkv_detail::bits_v<T>));
}
template <class T, mkv_detail::enable_int<T> = 0> inline T ctz(T x) {
  const auto u = static_cast<mkv_detail::uint_of<T>>(x);
  return static_cast<T>(u == 0 ? mkv_detail::bits_v<T> : __builtin_ctzll(u));
}
// High half of the full-width product.
template <class T, mkv_detail::enable_int<T> = 0> inline T mulhi(T x, T y) {
  if constexpr (sizeof(T) == 8) {
    using W = std::conditional_t<std::is_signed<T>::value, __int128, unsigned __int128>;
    return static_cast<T>((W(x) * W(y)) >> 64);
  } else {
    using W = std::conditional_t<std::is_signed<T>::value, int64_t, uint64_t>;
    return static_cast<T>((W(x) * W(y)) >> mkv_detail::bits_v<T>);
  }
}
}  // namespace metal

#include "../../prelude_common/mkv_common_math_ops.h"

namespace metal {

// ---- Relational: bool for scalars, boolN for vectors ------------------------
#define MKV_PRED(name, expr)                                                          \
  inline bool name(float x) { return expr; }                                          \
  inline bool name(half h) { return name(static_cast<float>(h)); }                    \
  template <class V, mkv_detail::enable_float_op<V> = 0> inline auto name(const V& v) { \
    return mkv_detail::map([](auto e) { return name(e); }, v);                        \
  }
MKV_PRED(isnan, __builtin_isnan(x))
MKV_PRED(isinf, __builtin_isinf(x))
MKV_PRED(isfinite, __builtin_isfinite(x))
MKV_PRED(signbit, __builtin_signbit(x))
#undef MKV_PRED
// isnormal is the one predicate that must look at the half itself: a
// subnormal half is a normal float.
inline bool isnormal(float x) { return __builtin_isnormal(x); }
inline bool isnormal(half h) {
  const uint e = (as_type<ushort>(h) >> 10) & 0x1fu;
  return e != 0 && e != 0x1fu;
}
template <class V, mkv_detail::enable_float_op<V> = 0> inline auto isnormal(const V& v) {
  return mkv_detail::map([](auto e) { return isnormal(e); }, v);
}

// select(a, b, c) = c ? b : a, per element when c is a bool vector.
template <class A, class B, class C, mkv_detail::enable_vec_op<A, B> = 0>
inline auto select(const A& a, const B& b, const C& c) {
  using K = mkv_detail::common<A, B>;
  using E = typename K::elem;
  static_assert(std::is_same<typename mkv_detail::vec_traits<C>::elem, bool>::value &&
                    (!mkv_detail::is_vec_like_v<C> || mkv_detail::vec_traits<C>::size == K::size),
                "select: condition must be bool or a bool vector of the same width");
  vec<E, K::size> r;
  for (int i = 0; i < K::size; ++i)
    r[i] = mkv_detail::lane<bool>(c, i) ? mkv_detail::lane<E>(b, i) : mkv_detail::lane<E>(a, i);
  return r;
}

}  // namespace metal

#include "../../prelude_common/mkv_common_math_fast_precise.h"
