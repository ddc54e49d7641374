// Shared by both preludes, part 1b (start): how the operands of a vector
// operator or math function combine. Included by cpp/gpu/host/prelude/
// mkv_prelude_vec_ops.h and cpp/gpu/cuda/prelude/mkv_cuda_vec_ops.h before
// their mkv_detail::map (the host reads operands element by element, CUDA reads
// each whole first); mkv_common_vec_ops.h, after map, defines the operators.
// Needs MKV_FN (see mkv_common_types.h).
#pragma once

#include "mkv_common_types.h"

namespace metal {
namespace mkv_detail {

// The MSL vector operators, for each prelude's map_op<vop>.
enum class vop : unsigned char { add, sub, mul, div, mod, band, bor, bxor, shl, shr, cmp, logic, neg, bnot };

template <class... X> struct first_vec { using type = void; };
template <class X, class... R> struct first_vec<X, R...> {
  using type = std::conditional_t<is_vec_like_v<X>, X, typename first_vec<R...>::type>;
};

// Element type and width of an operator or math-function call: those of the
// first vector-like operand, which all other vector-like operands must share.
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
  // int4 * 2.5f would truncate the scalar; clang's vector rules reject it too.
  static_assert(!std::is_integral<elem>::value ||
                    ((is_vec_like_v<X> || !(std::is_floating_point<X>::value || std::is_same<X, half>::value)) && ...),
                "MSL: a floating-point scalar does not convert implicitly to an integer vector's element type");
};

template <class... X>
using enable_vec_op = std::enable_if_t<(is_vec_like_v<X> || ...) && (is_operand_v<X> && ...), int>;

// Element i of a vector-like, or a scalar converted to E.
template <class E, class X> MKV_FN constexpr E lane(const X& x, int i) {
  if constexpr (is_vec_like_v<X>) {
    return x[i];
  } else {
    (void)i;
    return static_cast<E>(x);
  }
}

}  // namespace mkv_detail
}  // namespace metal
