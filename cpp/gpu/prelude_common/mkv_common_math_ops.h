// Shared by both preludes, part 2 (middle): the MSL math, geometric, relational
// and integer functions that are the same logic on the host and under CUDA.
// Included by cpp/gpu/host/prelude/mkv_prelude_math.h and
// cpp/gpu/cuda/prelude/mkv_cuda_math.h after their scalar float functions,
// abs/min/max/clamp, dot and popcount/clz/ctz/mulhi (which differ: builtins vs
// CUDA's library and intrinsics): the templates here call those unqualified
// with scalars or with mkv_detail proxies, which argument-dependent lookup
// would not find, so they must be declared first. Needs MKV_FN and
// MKV_FN_DEVICE (see mkv_common_types.h).
#pragma once

#include "mkv_common_math_head.h"

namespace metal {

// ---- abs, min, max, clamp of vectors (elementwise) ----------------------------
template <class V, mkv_detail::enable_vec_op<V> = 0> MKV_FN auto abs(const V& v) {
  return mkv_detail::map([](auto e) { return abs(e); }, v);
}
template <class A, class B, mkv_detail::enable_vec_op<A, B> = 0> MKV_FN auto min(const A& a, const B& b) {
  return mkv_detail::map([](auto x, auto y) { return min(x, y); }, a, b);
}
template <class A, class B, mkv_detail::enable_vec_op<A, B> = 0> MKV_FN auto max(const A& a, const B& b) {
  return mkv_detail::map([](auto x, auto y) { return max(x, y); }, a, b);
}
template <class A, class B, class C, mkv_detail::enable_vec_op<A, B, C> = 0>
MKV_FN auto clamp(const A& x, const B& lo, const C& hi) {
  return mkv_detail::map([](auto v, auto l, auto h) { return clamp(v, l, h); }, x, lo, hi);
}

// Three-operand forms (MSL 2.1): float ones prefer numbers over NaN like fmin.
#define MKV_MATH3_ANY(name, expr)                                                     \
  template <class T, std::enable_if_t<mkv_detail::is_scalar_v<T>, int> = 0>           \
  MKV_FN T name(T x, T y, T z) { return expr; }                                       \
  template <class A, class B, class C, mkv_detail::enable_vec_op<A, B, C> = 0>        \
  MKV_FN auto name(const A& a, const B& b, const C& c) {                              \
    return mkv_detail::map([](auto x, auto y, auto z) { return name(x, y, z); }, a, b, c); \
  }
MKV_MATH3_ANY(min3, min(min(x, y), z))
MKV_MATH3_ANY(max3, max(max(x, y), z))
MKV_MATH3_ANY(median3, max(min(x, y), min(max(x, y), z)))
MKV_MATH3_ANY(fmin3, fmin(fmin(x, y), z))
MKV_MATH3_ANY(fmax3, fmax(fmax(x, y), z))
MKV_MATH3_ANY(fmedian3, fmax(fmin(x, y), fmin(fmax(x, y), z)))
#undef MKV_MATH3_ANY

// ---- Geometric: vectors of float or half (dot is each prelude's) -------------
template <class V, mkv_detail::enable_float_op<V> = 0> MKV_FN auto length_squared(const V& v) { return dot(v, v); }
template <class V, mkv_detail::enable_float_op<V> = 0> MKV_FN auto length(const V& v) { return sqrt(dot(v, v)); }
template <class A, class B, mkv_detail::enable_float_op<A, B> = 0> MKV_FN auto distance(const A& a, const B& b) {
  return length(a - b);
}
template <class V, mkv_detail::enable_float_op<V> = 0> MKV_FN auto normalize(const V& v) {
  return v * rsqrt(dot(v, v));
}
template <class A, class B, mkv_detail::enable_float_op<A, B> = 0> MKV_FN auto cross(const A& a, const B& b) {
  static_assert(mkv_detail::common<A, B>::size == 3, "cross takes two 3-vectors");
  using V = vec<typename mkv_detail::common<A, B>::elem, 3>;
  const V x = a, y = b;
  return V(x.y * y.z - x.z * y.y, x.z * y.x - x.x * y.z, x.x * y.y - x.y * y.x);
}

// ---- Relational: all, any, scalar select (the predicates are each prelude's) --
MKV_FN bool all(bool b) { return b; }
MKV_FN bool any(bool b) { return b; }
template <class V, std::enable_if_t<mkv_detail::is_vec_like_v<V>, int> = 0> MKV_FN bool all(const V& v) {
  static_assert(std::is_same<typename mkv_detail::vec_traits<V>::elem, bool>::value, "all() takes a bool vector");
  for (int i = 0; i < mkv_detail::vec_traits<V>::size; ++i)
    if (!v[i]) return false;
  return true;
}
template <class V, std::enable_if_t<mkv_detail::is_vec_like_v<V>, int> = 0> MKV_FN bool any(const V& v) {
  static_assert(std::is_same<typename mkv_detail::vec_traits<V>::elem, bool>::value, "any() takes a bool vector");
  for (int i = 0; i < mkv_detail::vec_traits<V>::size; ++i)
    if (v[i]) return true;
  return false;
}

// select(a, b, c) = c ? b : a (the vector form is each prelude's).
template <class T, std::enable_if_t<mkv_detail::is_scalar_v<T>, int> = 0> MKV_FN T select(T a, T b, bool c) {
  return c ? b : a;
}

// ---- Integer functions: scalars of any integer type and their vectors ------
// |x - y| without overflow.
template <class T, mkv_detail::enable_int<T> = 0> MKV_FN T absdiff(T x, T y) {
  using U = mkv_detail::uint_of<T>;
  return static_cast<T>(x > y ? U(U(x) - U(y)) : U(U(y) - U(x)));
}
// Rotate left by n mod the bit width.
template <class T, mkv_detail::enable_int<T> = 0> MKV_FN T rotate(T x, T n) {
  using U = mkv_detail::uint_of<T>;
  constexpr int W = mkv_detail::bits_v<T>;
  const int s = int(U(n) % W);
  return s == 0 ? x : static_cast<T>(U(U(U(x) << s) | U(U(x) >> (W - s))));
}
// bits [offset, offset+bits) of x, sign-extended for signed T; 0 when bits == 0.
template <class T, mkv_detail::enable_int<T> = 0> MKV_FN T extract_bits(T x, uint offset, uint bits) {
  uint64_t u = uint64_t(static_cast<mkv_detail::uint_of<T>>(x)) >> offset;
  if (bits >= 64) return static_cast<T>(u);
  u &= (uint64_t(1) << bits) - 1;
  if (std::is_signed<T>::value && bits > 0 && ((u >> (bits - 1)) & 1)) u |= ~uint64_t(0) << bits;
  return static_cast<T>(u);
}
// base with bits [offset, offset+bits) replaced by the low bits of insert.
template <class T, mkv_detail::enable_int<T> = 0> MKV_FN T insert_bits(T base, T insert, uint offset, uint bits) {
  const uint64_t field = bits >= 64 ? ~uint64_t(0) : (uint64_t(1) << bits) - 1;
  const uint64_t mask = field << offset;
  const uint64_t b = static_cast<mkv_detail::uint_of<T>>(base), i = static_cast<mkv_detail::uint_of<T>>(insert);
  return static_cast<T>((b & ~mask) | ((i << offset) & mask));
}

// Vector forms, device-only under CUDA (popcount, clz, ctz, mulhi are intrinsics there).
#define MKV_INT1(name)                                                                \
  template <class V, mkv_detail::enable_int_vec<V> = 0> MKV_FN_DEVICE auto name(const V& v) { \
    return mkv_detail::map([](auto e) { return name(e); }, v);                        \
  }
#define MKV_INT2(name)                                                                \
  template <class A, class B, mkv_detail::enable_vec_op<A, B> = 0>                    \
  MKV_FN_DEVICE auto name(const A& a, const B& b) {                                   \
    return mkv_detail::map([](auto x, auto y) { return name(x, y); }, a, b);          \
  }
MKV_INT1(popcount)
MKV_INT1(clz)
MKV_INT1(ctz)
MKV_INT2(mulhi)
MKV_INT2(absdiff)
MKV_INT2(rotate)
#undef MKV_INT1
#undef MKV_INT2
template <class V, mkv_detail::enable_int_vec<V> = 0> MKV_FN auto extract_bits(const V& v, uint offset, uint bits) {
  return mkv_detail::map([=](auto e) { return extract_bits(e, offset, bits); }, v);
}
template <class A, class B, mkv_detail::enable_vec_op<A, B> = 0>
MKV_FN auto insert_bits(const A& base, const B& insert, uint offset, uint bits) {
  return mkv_detail::map([=](auto b, auto i) { return insert_bits(b, i, offset, bits); }, base, insert);
}

}  // namespace metal
