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
// functions, as on the host.
#pragma once

#ifndef MAXFLOAT
#define MAXFLOAT FLT_MAX
#endif
#ifndef HUGE_VALF
#define HUGE_VALF (__int_as_float(0x7f800000))
#endif
#ifndef INFINITY
#define INFINITY (__int_as_float(0x7f800000))
#endif
#ifndef NAN
#define NAN (__int_as_float(0x7fffffff))
#endif
#define HALF_MAX (half(65504.0f))
#define HALF_MIN (half(6.103515625e-05f))  // smallest normal, 2^-14
#define HALF_EPSILON (half(9.765625e-04f))  // 2^-10
#define MAXHALF HALF_MAX
#define HUGE_VALH (half(INFINITY))
#define M_E_F 2.718281828459045f
#define M_LOG2E_F 1.442695040888963f
#define M_LOG10E_F 0.434294481903252f
#define M_LN2_F 0.693147180559945f
#define M_LN10_F 2.302585092994046f
#define M_PI_F 3.141592653589793f
#define M_PI_2_F 1.570796326794897f
#define M_PI_4_F 0.785398163397448f
#define M_1_PI_F 0.318309886183791f
#define M_2_PI_F 0.636619772367581f
#define M_2_SQRTPI_F 1.128379167095513f
#define M_SQRT2_F 1.414213562373095f
#define M_SQRT1_2_F 0.707106781186548f
#define M_E_H (half(M_E_F))
#define M_LOG2E_H (half(M_LOG2E_F))
#define M_LN2_H (half(M_LN2_F))
#define M_PI_H (half(M_PI_F))
#define M_PI_2_H (half(M_PI_2_F))
#define M_SQRT2_H (half(M_SQRT2_F))
#define M_SQRT1_2_H (half(M_SQRT1_2_F))

namespace metal {
namespace mkv_detail {
template <class... X>
using enable_float_op =
    std::enable_if_t<(is_vec_like_v<X> || ...) && (is_operand_v<X> && ...) &&
                         is_float_v<typename vec_traits<typename first_vec<X...>::type>::elem>,
                     int>;
template <class V>
using enable_int_vec =
    std::enable_if_t<is_vec_like_v<V> && std::is_integral<typename vec_traits<V>::elem>::value, int>;
template <class T>
using enable_int = std::enable_if_t<std::is_integral<T>::value && !std::is_same<T, bool>::value, int>;
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

template <class V, mkv_detail::enable_vec_op<V> = 0> MKV_HD auto abs(const V& v) {
  return mkv_detail::map([](auto e) { return abs(e); }, v);
}
template <class A, class B, mkv_detail::enable_vec_op<A, B> = 0> MKV_HD auto min(const A& a, const B& b) {
  return mkv_detail::map([](auto x, auto y) { return min(x, y); }, a, b);
}
template <class A, class B, mkv_detail::enable_vec_op<A, B> = 0> MKV_HD auto max(const A& a, const B& b) {
  return mkv_detail::map([](auto x, auto y) { return max(x, y); }, a, b);
}
template <class A, class B, class C, mkv_detail::enable_vec_op<A, B, C> = 0>
MKV_HD auto clamp(const A& x, const B& lo, const C& hi) {
  return mkv_detail::map([](auto v, auto l, auto h) { return clamp(v, l, h); }, x, lo, hi);
}

// Three-operand forms (MSL 2.1): float ones prefer numbers over NaN like fmin.
#define MKV_MATH3_ANY(name, expr)                                                     \
  template <class T, std::enable_if_t<mkv_detail::is_scalar_v<T>, int> = 0>           \
  MKV_HD T name(T x, T y, T z) { return expr; }                                       \
  template <class A, class B, class C, mkv_detail::enable_vec_op<A, B, C> = 0>        \
  MKV_HD auto name(const A& a, const B& b, const C& c) {                              \
    return mkv_detail::map([](auto x, auto y, auto z) { return name(x, y, z); }, a, b, c); \
  }
MKV_MATH3_ANY(min3, min(min(x, y), z))
MKV_MATH3_ANY(max3, max(max(x, y), z))
MKV_MATH3_ANY(median3, max(min(x, y), min(max(x, y), z)))
MKV_MATH3_ANY(fmin3, fmin(fmin(x, y), z))
MKV_MATH3_ANY(fmax3, fmax(fmax(x, y), z))
MKV_MATH3_ANY(fmedian3, fmax(fmin(x, y), fmin(fmax(x, y), z)))
#undef MKV_MATH3_ANY

// ---- Geometric: vectors of float or half; half accumulates in float -----------
template <class A, class B, mkv_detail::enable_float_op<A, B> = 0> MKV_HD auto dot(const A& a0, const B& b0) {
  static_assert(mkv_detail::is_vec_like_v<A> && mkv_detail::is_vec_like_v<B>, "dot takes two vectors");
  using C = mkv_detail::common<A, B>;
  const auto a = mkv_detail::value(a0);
  const auto b = mkv_detail::value(b0);
  float s = 0.0f;
  for (int i = 0; i < C::size; ++i) s += static_cast<float>(a[i]) * static_cast<float>(b[i]);
  return static_cast<typename C::elem>(s);
}
template <class V, mkv_detail::enable_float_op<V> = 0> MKV_HD auto length_squared(const V& v) { return dot(v, v); }
template <class V, mkv_detail::enable_float_op<V> = 0> MKV_HD auto length(const V& v) { return sqrt(dot(v, v)); }
template <class A, class B, mkv_detail::enable_float_op<A, B> = 0> MKV_HD auto distance(const A& a, const B& b) {
  return length(a - b);
}
template <class V, mkv_detail::enable_float_op<V> = 0> MKV_HD auto normalize(const V& v) {
  return v * rsqrt(dot(v, v));
}
template <class A, class B, mkv_detail::enable_float_op<A, B> = 0> MKV_HD auto cross(const A& a, const B& b) {
  static_assert(mkv_detail::common<A, B>::size == 3, "cross takes two 3-vectors");
  using V = vec<typename mkv_detail::common<A, B>::elem, 3>;
  const V x = a, y = b;
  return V(x.y * y.z - x.z * y.y, x.z * y.x - x.x * y.z, x.x * y.y - x.y * y.x);
}

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

MKV_HD bool all(bool b) { return b; }
MKV_HD bool any(bool b) { return b; }
template <class V, std::enable_if_t<mkv_detail::is_vec_like_v<V>, int> = 0> MKV_HD bool all(const V& v) {
  static_assert(std::is_same<typename mkv_detail::vec_traits<V>::elem, bool>::value, "all() takes a bool vector");
  for (int i = 0; i < mkv_detail::vec_traits<V>::size; ++i)
    if (!v[i]) return false;
  return true;
}
template <class V, std::enable_if_t<mkv_detail::is_vec_like_v<V>, int> = 0> MKV_HD bool any(const V& v) {
  static_assert(std::is_same<typename mkv_detail::vec_traits<V>::elem, bool>::value, "any() takes a bool vector");
  for (int i = 0; i < mkv_detail::vec_traits<V>::size; ++i)
    if (v[i]) return true;
  return false;
}

// select(a, b, c) = c ? b : a, per element when c is a bool vector.
template <class T, std::enable_if_t<mkv_detail::is_scalar_v<T>, int> = 0> MKV_HD T select(T a, T b, bool c) {
  return c ? b : a;
}
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

// ---- Integer functions: scalars of any integer type and their vectors -----------
namespace mkv_detail {
template <class T> using uint_of = std::make_unsigned_t<T>;
template <class T> constexpr int bits_v = int(sizeof(T) * CHAR_BIT);
}  // namespace mkv_detail

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
// |x - y| without overflow.
template <class T, mkv_detail::enable_int<T> = 0> MKV_HD T absdiff(T x, T y) {
  using U = mkv_detail::uint_of<T>;
  return static_cast<T>(x > y ? U(U(x) - U(y)) : U(U(y) - U(x)));
}
// Rotate left by n mod the bit width.
template <class T, mkv_detail::enable_int<T> = 0> MKV_HD T rotate(T x, T n) {
  using U = mkv_detail::uint_of<T>;
  constexpr int W = mkv_detail::bits_v<T>;
  const int s = int(U(n) % W);
  return s == 0 ? x : static_cast<T>(U(U(U(x) << s) | U(U(x) >> (W - s))));
}
// bits [offset, offset+bits) of x, sign-extended for signed T; 0 when bits == 0.
template <class T, mkv_detail::enable_int<T> = 0> MKV_HD T extract_bits(T x, uint offset, uint bits) {
  uint64_t u = uint64_t(static_cast<mkv_detail::uint_of<T>>(x)) >> offset;
  if (bits >= 64) return static_cast<T>(u);
  u &= (uint64_t(1) << bits) - 1;
  if (std::is_signed<T>::value && bits > 0 && ((u >> (bits - 1)) & 1)) u |= ~uint64_t(0) << bits;
  return static_cast<T>(u);
}
// base with bits [offset, offset+bits) replaced by the low bits of insert.
template <class T, mkv_detail::enable_int<T> = 0> MKV_HD T insert_bits(T base, T insert, uint offset, uint bits) {
  const uint64_t field = bits >= 64 ? ~uint64_t(0) : (uint64_t(1) << bits) - 1;
  const uint64_t mask = field << offset;
  const uint64_t b = static_cast<mkv_detail::uint_of<T>>(base), i = static_cast<mkv_detail::uint_of<T>>(insert);
  return static_cast<T>((b & ~mask) | ((i << offset) & mask));
}
#define MKV_INT1(name)                                                                \
  template <class V, mkv_detail::enable_int_vec<V> = 0> MKV_D auto name(const V& v) { \
    return mkv_detail::map([](auto e) { return name(e); }, v);                        \
  }
#define MKV_INT2(name)                                                                \
  template <class A, class B, mkv_detail::enable_vec_op<A, B> = 0>                    \
  MKV_D auto name(const A& a, const B& b) {                                           \
    return mkv_detail::map([](auto x, auto y) { return name(x, y); }, a, b);          \
  }
MKV_INT1(popcount) MKV_INT1(clz) MKV_INT1(ctz)
MKV_INT2(mulhi) MKV_INT2(absdiff) MKV_INT2(rotate)
#undef MKV_INT1
#undef MKV_INT2

#undef MKV_VEC1
#undef MKV_VEC2
#undef MKV_VEC3
#undef MKV_CUDA1
#undef MKV_CUDA2
#undef MKV_CUDA3
#undef MKV_MSL1
#undef MKV_MSL2
#undef MKV_MSL3

// ---- fast:: and precise:: -------------------------------------------------------
// The same functions; the using-declarations must come after every overload.
#define MKV_FAST_PRECISE_NAMES                                                        \
  using metal::abs; using metal::fabs; using metal::floor; using metal::ceil;          \
  using metal::round; using metal::rint; using metal::trunc; using metal::fract;       \
  using metal::sqrt; using metal::rsqrt; using metal::exp; using metal::exp2;          \
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
namespace fast { MKV_FAST_PRECISE_NAMES }
namespace precise { MKV_FAST_PRECISE_NAMES }
#undef MKV_FAST_PRECISE_NAMES

}  // namespace metal
