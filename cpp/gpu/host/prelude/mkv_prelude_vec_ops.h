// Host prelude, part 1b: elementwise operators on MSL vectors.
//
// Included at the end of mkv_prelude_types.h. The operand rules and the
// operators are shared with the CUDA prelude (cpp/gpu/prelude_common/
// mkv_common_vec_operands.h, mkv_common_vec_ops.h); what is the host's own is
// map, which reads each operand element by element, and map_op, which runs an
// operator on the compiler's vectors where that gives the same results
// (mkv_prelude_native.h says where).
#pragma once

#include "../../prelude_common/mkv_common_vec_operands.h"

namespace metal {
namespace mkv_detail {

// r[i] = f(lane(x, i)...) for every element; the result element type is f's.
template <class F, class... X> inline auto map(F f, const X&... x) {
  using C = common<X...>;
  using E = typename C::elem;
  using R = decltype(f(lane<E>(x, 0)...));
  vec<R, C::size> r;
  for (int i = 0; i < C::size; ++i) r[i] = f(lane<E>(x, i)...);
  return r;
}

// May operator K run natively on N elements of E? (The rules and their
// reasons: mkv_prelude_native.h.)
template <vop K, class E, int N> constexpr bool native_op() {
  if (N == 3 || std::is_same<E, bool>::value || std::is_same<E, _Float16>::value) return false;
  constexpr bool f = std::is_floating_point<E>::value, i = std::is_integral<E>::value;
  switch (K) {
    case vop::add: case vop::sub: case vop::mul: case vop::cmp: case vop::neg: return f || i;
    case vop::div: return f;
    case vop::band: case vop::bor: case vop::bxor: case vop::bnot: return i;
    case vop::shl: case vop::shr: return i && sizeof(E) >= 4;
    default: return false;  // mod, logic (&& ||: bool operands)
  }
}
template <vop K, class E, int N> constexpr bool native_op_v = native_op<K, E, N>();

// An operand as the native vector of N elements of E: a vector's own storage,
// a swizzle or packed vector gathered first, a scalar broadcast.
template <class E, int N, class X> inline native_t<E, N> native_arg(const X& x) {
  if constexpr (std::is_same<X, vec<E, N>>::value) {
    return x.nv_;
  } else if constexpr (is_vec_like_v<X>) {
    return vec<E, N>(x).nv_;
  } else {
    return native_splat<E, N>(static_cast<E>(x));
  }
}

// Operator K over the operands: f applied to the native vectors when
// native_op_v allows it (a comparison's mask becomes bools 0/1), else map.
template <vop K, class F, class... X> inline auto map_op(F f, const X&... x) {
  using C = common<X...>;
  using E = typename C::elem;
  constexpr int N = C::size;
  if constexpr (native_op_v<K, E, N>) {
    using R = decltype(f(lane<E>(x, 0)...));
    vec<R, N> r;
    if constexpr (std::is_same<R, bool>::value) {
      r.nv_ = __builtin_convertvector(f(native_arg<E, N>(x)...), native_t<bool, N>) & 1;
    } else {
      r.nv_ = f(native_arg<E, N>(x)...);
    }
    return r;
  } else {
    return map(f, x...);
  }
}

}  // namespace mkv_detail
}  // namespace metal

#include "../../prelude_common/mkv_common_vec_ops.h"
