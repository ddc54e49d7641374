// CUDA prelude, part 1b: elementwise operators on MSL vectors. The operand
// rules and the operators are shared with the host prelude
// (cpp/gpu/prelude_common/mkv_common_vec_operands.h, mkv_common_vec_ops.h);
// what is CUDA's own is map, which reads every operand whole first
// (mkv_detail::value, see mkv_cuda_types.h).
#pragma once

#include "../../prelude_common/mkv_common_vec_operands.h"

namespace metal {
namespace mkv_detail {

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

// Every operator runs per element (nvcc's vector loads are the wide part).
template <vop K, class F, class... X> MKV_HD auto map_op(F f, const X&... x) { return map(f, x...); }

}  // namespace mkv_detail
}  // namespace metal

#include "../../prelude_common/mkv_common_vec_ops.h"
