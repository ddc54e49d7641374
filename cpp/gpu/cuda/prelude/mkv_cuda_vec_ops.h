// CUDA prelude, part 1b: elementwise operators on MSL vectors, with the host
// prelude's rules (cpp/gpu/host/prelude/mkv_prelude_vec_ops.h):
//   - two vector operands must have the same element type and width;
//   - a scalar operand converts to the vector's element type (half4 * 2.0f is half4);
//   - results are computed per element and converted back to the element type;
//   - comparisons and && || ! give boolN.
// Every operand is read whole first (mkv_detail::value), see mkv_cuda_types.h.
#pragma once

namespace metal {
namespace mkv_detail {

template <class... X> struct first_vec { using type = void; };
template <class X, class... R> struct first_vec<X, R...> {
  using type = std::conditional_t<is_vec_like_v<X>, X, typename first_vec<R...>::type>;
};

// Element type and width of a call: those of the first vector-like operand,
// which all other vector-like operands must share.
template <class... X> struct common {
  using V = typename first_vec<X...>::type;
  static_assert(!std::is_void<V>::value, "at least one operand must be a vector");
  using elem = typename vec_traits<V>::elem;
  static constexpr int size = vec_traits<V>::size;
  static constexpr bool agree =
      ((!is_vec_like_v<X> || (vec_traits<X>::size == size &&
                              std::is_same<typename vec_traits<X>::elem, elem>::value)) && ...);
  static_assert(agree,
                "MSL: vector operands must have the same element type and width; convert explicitly "
                "(e.g. float4(h)) or swizzle");
  static_assert(!std::is_integral<elem>::value ||
                    ((is_vec_like_v<X> || !(std::is_floating_point<X>::value || std::is_same<X, half>::value)) && ...),
                "MSL: a floating-point scalar does not convert implicitly to an integer vector's element type");
};

template <class... X>
using enable_vec_op = std::enable_if_t<(is_vec_like_v<X> || ...) && (is_operand_v<X> && ...), int>;

// Element i of a value (vector or scalar), as E.
template <class E, class X> MKV_HD E lane(const X& x, int i) {
  if constexpr (is_vec_like_v<X>) {
    return x[i];
  } else {
    (void)i;
    return static_cast<E>(x);
  }
}

// r[i] = f(lane(x, i)...) for every element; the result element type is f's.
template <class F, class A> MKV_HD auto map(F f, const A& a0) {
  using C = common<A>;
  using E = typename C::elem;
  const auto a = value(a0);
  using R = decltype(f(lane<E>(a, 0)));
  vec<R, C::size> r;
  for (int i = 0; i < C::size; ++i) r[i] = f(lane<E>(a, i));
  return r;
}
template <class F, class A, class B> MKV_HD auto map(F f, const A& a0, const B& b0) {
  using C = common<A, B>;
  using E = typename C::elem;
  const auto a = value(a0);
  const auto b = value(b0);
  using R = decltype(f(lane<E>(a, 0), lane<E>(b, 0)));
  vec<R, C::size> r;
  for (int i = 0; i < C::size; ++i) r[i] = f(lane<E>(a, i), lane<E>(b, i));
  return r;
}
template <class F, class A, class B, class D> MKV_HD auto map(F f, const A& a0, const B& b0, const D& d0) {
  using C = common<A, B, D>;
  using E = typename C::elem;
  const auto a = value(a0);
  const auto b = value(b0);
  const auto d = value(d0);
  using R = decltype(f(lane<E>(a, 0), lane<E>(b, 0), lane<E>(d, 0)));
  vec<R, C::size> r;
  for (int i = 0; i < C::size; ++i) r[i] = f(lane<E>(a, i), lane<E>(b, i), lane<E>(d, i));
  return r;
}

}  // namespace mkv_detail

// Arithmetic and bitwise: the operands' element type. (x op y) promotes small
// integers to int; the cast brings it back.
#define MKV_VEC_ARITH(op)                                                             \
  template <class A, class B, mkv_detail::enable_vec_op<A, B> = 0>                    \
  MKV_HD auto operator op(const A& a, const B& b) {                                   \
    return mkv_detail::map([](auto x, auto y) { return static_cast<decltype(x)>(x op y); }, a, b); \
  }
MKV_VEC_ARITH(+)
MKV_VEC_ARITH(-)
MKV_VEC_ARITH(*)
MKV_VEC_ARITH(/)
MKV_VEC_ARITH(%)
MKV_VEC_ARITH(&)
MKV_VEC_ARITH(|)
MKV_VEC_ARITH(^)
MKV_VEC_ARITH(<<)
MKV_VEC_ARITH(>>)
#undef MKV_VEC_ARITH

// Comparisons and logical and/or: boolN (both sides evaluated, as for vectors).
#define MKV_VEC_BOOL(op)                                                              \
  template <class A, class B, mkv_detail::enable_vec_op<A, B> = 0>                    \
  MKV_HD auto operator op(const A& a, const B& b) {                                   \
    return mkv_detail::map([](auto x, auto y) -> bool { return x op y; }, a, b);      \
  }
MKV_VEC_BOOL(==)
MKV_VEC_BOOL(!=)
MKV_VEC_BOOL(<)
MKV_VEC_BOOL(<=)
MKV_VEC_BOOL(>)
MKV_VEC_BOOL(>=)
MKV_VEC_BOOL(&&)
MKV_VEC_BOOL(||)
#undef MKV_VEC_BOOL

// Compound assignment for vectors, swizzle proxies (only the named components)
// and packed vectors: l = l op u.
#define MKV_VEC_COMPOUND(op)                                                          \
  template <class L, class U,                                                         \
            std::enable_if_t<mkv_detail::is_vec_like_v<L> && mkv_detail::is_operand_v<U>, int> = 0> \
  MKV_HD L& operator op##=(L& l, const U& u) {                                        \
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

template <class A, mkv_detail::enable_vec_op<A> = 0> MKV_HD auto operator+(const A& a) {
  return mkv_detail::map([](auto x) { return x; }, a);
}
template <class A, mkv_detail::enable_vec_op<A> = 0> MKV_HD auto operator-(const A& a) {
  return mkv_detail::map([](auto x) { return static_cast<decltype(x)>(-x); }, a);
}
template <class A, mkv_detail::enable_vec_op<A> = 0> MKV_HD auto operator~(const A& a) {
  static_assert(std::is_integral<typename mkv_detail::vec_traits<A>::elem>::value, "MSL: ~ needs an integer vector");
  return mkv_detail::map([](auto x) { return static_cast<decltype(x)>(~x); }, a);
}
template <class A, mkv_detail::enable_vec_op<A> = 0> MKV_HD auto operator!(const A& a) {
  return mkv_detail::map([](auto x) -> bool { return !x; }, a);
}

}  // namespace metal
