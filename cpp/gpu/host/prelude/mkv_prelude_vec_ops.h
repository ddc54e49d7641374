// Host prelude, part 1b: elementwise operators on MSL vectors.
//
// Included at the end of mkv_prelude_types.h. The operand rules and the
// operators are shared with the CUDA prelude (cpp/gpu/prelude_common/
// mkv_common_vec_operands.h, mkv_common_vec_ops.h); what is the host's own is
// map, which reads each operand element by element.
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

}  // namespace mkv_detail
}  // namespace metal

#include "../../prelude_common/mkv_common_vec_ops.h"
