// Shared by both preludes, part 1b (end): elementwise operators on MSL vectors.
// Included by cpp/gpu/host/prelude/mkv_prelude_vec_ops.h and
// cpp/gpu/cuda/prelude/mkv_cuda_vec_ops.h after their mkv_detail::map; needs
// MKV_FN (see mkv_common_types.h).
//
// Every operator is a template over "operands" (vector-likes and scalars) with
// at least one vector-like, so swizzle proxies and packed vectors work on
// either side without conversions (deduction would not consider them). Rules,
// as in MSL:
//   - two vector operands must have the same element type and width;
//   - a scalar operand converts to the vector's element type
//     (half4 * 2.0f is half4, uint2 + 1 is uint2);
//   - results are computed per element and converted back to the element
//     type (uchar4 + uchar4 wraps; half4 ops round to half per element);
//   - comparisons and && || ! give boolN.
// Each operator goes through the prelude's map_op<vop>, which may compute it
// on native vectors (the host's mkv_prelude_native.h) or per element (map).
#pragma once

#include "mkv_common_vec_operands.h"

namespace metal {

// Arithmetic and bitwise: result has the operands' element type. (x op y)
// promotes small integers and half to int/float; the cast brings it back.
#define MKV_VEC_ARITH(op, kind)                                                       \
  template <class A, class B, mkv_detail::enable_vec_op<A, B> = 0>                    \
  MKV_FN auto operator op(const A& a, const B& b) {                                   \
    return mkv_detail::map_op<mkv_detail::vop::kind>(                                 \
        [](auto x, auto y) { return static_cast<decltype(x)>(x op y); }, a, b);       \
  }
MKV_VEC_ARITH(+, add)
MKV_VEC_ARITH(-, sub)
MKV_VEC_ARITH(*, mul)
MKV_VEC_ARITH(/, div)
MKV_VEC_ARITH(%, mod)
MKV_VEC_ARITH(&, band)
MKV_VEC_ARITH(|, bor)
MKV_VEC_ARITH(^, bxor)
MKV_VEC_ARITH(<<, shl)
MKV_VEC_ARITH(>>, shr)
#undef MKV_VEC_ARITH

// Comparisons and logical and/or: boolN. && and || evaluate both sides, as
// they must for vectors. (No `-> bool` on the lambda: on native vectors a
// comparison gives a mask, which map_op turns into bools.)
#define MKV_VEC_BOOL(op, kind)                                                        \
  template <class A, class B, mkv_detail::enable_vec_op<A, B> = 0>                    \
  MKV_FN auto operator op(const A& a, const B& b) {                                   \
    return mkv_detail::map_op<mkv_detail::vop::kind>([](auto x, auto y) { return x op y; }, a, b); \
  }
MKV_VEC_BOOL(==, cmp)
MKV_VEC_BOOL(!=, cmp)
MKV_VEC_BOOL(<, cmp)
MKV_VEC_BOOL(<=, cmp)
MKV_VEC_BOOL(>, cmp)
MKV_VEC_BOOL(>=, cmp)
MKV_VEC_BOOL(&&, logic)
MKV_VEC_BOOL(||, logic)
#undef MKV_VEC_BOOL

// Compound assignment for vectors, swizzle proxies (assigns only the named
// components) and packed vectors: l = l op u.
#define MKV_VEC_COMPOUND(op)                                                          \
  template <class L, class U,                                                         \
            std::enable_if_t<mkv_detail::is_vec_like_v<L> && mkv_detail::is_operand_v<U>, int> = 0> \
  MKV_FN L& operator op##=(L& l, const U& u) {                                        \
    l = l op u;                                                                       \
    return l;                                                                         \
  }
MKV_VEC_COMPOUND(+)
MKV_VEC_COMPOUND(-)
MKV_VEC_COMPOUND(*)
MKV_VEC_COMPOUND(/)
MKV_VEC_COMPOUND(%)
MKV_VEC_COMPOUND(&)
MKV_VEC_COMPOUND(|)
MKV_VEC_COMPOUND(^)
MKV_VEC_COMPOUND(<<)
MKV_VEC_COMPOUND(>>)
#undef MKV_VEC_COMPOUND

template <class A, mkv_detail::enable_vec_op<A> = 0> MKV_FN auto operator+(const A& a) {
  return mkv_detail::map([](auto x) { return x; }, a);
}
template <class A, mkv_detail::enable_vec_op<A> = 0> MKV_FN auto operator-(const A& a) {
  return mkv_detail::map_op<mkv_detail::vop::neg>([](auto x) { return static_cast<decltype(x)>(-x); }, a);
}
template <class A, mkv_detail::enable_vec_op<A> = 0> MKV_FN auto operator~(const A& a) {
  static_assert(std::is_integral<typename mkv_detail::vec_traits<A>::elem>::value, "MSL: ~ needs an integer vector");
  return mkv_detail::map_op<mkv_detail::vop::bnot>([](auto x) { return static_cast<decltype(x)>(~x); }, a);
}
template <class A, mkv_detail::enable_vec_op<A> = 0> MKV_FN auto operator!(const A& a) {
  return mkv_detail::map([](auto x) -> bool { return !x; }, a);
}

}  // namespace metal
