// SIMD-group functions and barriers for the host prelude.
//
// Each call is a rendezvous (lane_api.h): the lane parks in the executor until
// every live lane of its SIMD-group (or threadgroup, for threadgroup_barrier)
// arrives at the same call; the last one combines all inputs once. Reductions
// run in lane order; a GPU uses a tree, so float results may differ in the
// last bits.
#pragma once

#include "../lane_api.h"

#define MKV_HERE ::mkv::host::SourceLoc()

#include "../../prelude_common/mkv_common_simd_types.h"  // mem_flags, simd_vote

namespace metal {

inline void threadgroup_barrier(mem_flags, ::mkv::host::SourceLoc loc = MKV_HERE) {
  ::mkv::host::collective(::mkv::host::Collective::threadgroup_barrier, nullptr, nullptr,
                          nullptr, 0, loc);
}
inline void simdgroup_barrier(mem_flags, ::mkv::host::SourceLoc loc = MKV_HERE) {
  ::mkv::host::collective(::mkv::host::Collective::simdgroup_barrier, nullptr, nullptr,
                          nullptr, 0, loc);
}

namespace simd_detail {

using ::mkv::host::LaneSlots;
using ::mkv::host::kSimdWidth;

inline bool active(const LaneSlots& s, int lane) {
  return lane >= 0 && lane < kSimdWidth && ((s.active >> lane) & 1u);
}
template <class T>
const T& in(const LaneSlots& s, int lane) {
  return *static_cast<const T*>(s.in[lane]);
}
template <class T>
T& out(LaneSlots& s, int lane) {
  return *static_cast<T*>(s.out[lane]);
}

struct Add {
  static constexpr int identity = 0;
  template <class T> T operator()(T a, T b) const { return a + b; }
};
struct Mul {
  static constexpr int identity = 1;
  template <class T> T operator()(T a, T b) const { return a * b; }
};
struct Max { template <class T> T operator()(T a, T b) const { return metal::max(a, b); } };
struct Min { template <class T> T operator()(T a, T b) const { return metal::min(a, b); } };
struct And { template <class T> T operator()(T a, T b) const { return a & b; } };
struct Or { template <class T> T operator()(T a, T b) const { return a | b; } };
struct Xor { template <class T> T operator()(T a, T b) const { return a ^ b; } };

// Every active lane gets op folded over all active lanes, in lane order.
template <class T, class Op>
void reduce(LaneSlots& s) {
  bool first = true;
  T acc{};
  for (int i = 0; i < kSimdWidth; ++i) {
    if (!active(s, i)) continue;
    acc = first ? in<T>(s, i) : Op()(acc, in<T>(s, i));
    first = false;
  }
  for (int i = 0; i < kSimdWidth; ++i)
    if (active(s, i)) out<T>(s, i) = acc;
}

// Lane i gets op folded over active lanes < i (exclusive) or <= i (inclusive);
// the exclusive result of the first lane is the identity.
template <class T, class Op, bool Inclusive>
void prefix(LaneSlots& s) {
  T acc = T(Op::identity);
  for (int i = 0; i < kSimdWidth; ++i) {
    if (!active(s, i)) continue;
    const T value = in<T>(s, i);
    if (Inclusive) acc = Op()(acc, value);
    out<T>(s, i) = acc;
    if (!Inclusive) acc = Op()(acc, value);
  }
}

// Lane i reads lane source(i, arg[i]); a source of -1 keeps its own value.
// Reading an inactive lane is an error (the GPU would return garbage).
template <class T, int (*Source)(int lane, uint32_t arg)>
void permute(LaneSlots& s) {
  T values[kSimdWidth];
  for (int i = 0; i < kSimdWidth; ++i)
    if (active(s, i)) values[i] = in<T>(s, i);
  for (int i = 0; i < kSimdWidth; ++i) {
    if (!active(s, i)) continue;
    const int src = Source(i, s.arg[i]);
    if (src < 0) {
      out<T>(s, i) = values[i];
    } else if (!active(s, src)) {
      s.bad_reader = i;
      s.bad_source = src;
      return;
    } else {
      out<T>(s, i) = values[src];
    }
  }
}
inline int source_index(int, uint32_t lane) { return int(lane); }
inline int source_xor(int i, uint32_t mask) { return i ^ int(mask); }
inline int source_down(int i, uint32_t delta) {  // the upper delta lanes keep their value
  return i + int(delta) < kSimdWidth ? i + int(delta) : -1;
}
inline int source_up(int i, uint32_t delta) { return i - int(delta) >= 0 ? i - int(delta) : -1; }

template <class T>
void broadcast_first(LaneSlots& s) {
  int first = 0;
  while (!active(s, first)) ++first;
  for (int i = 0; i < kSimdWidth; ++i)
    if (active(s, i)) out<T>(s, i) = in<T>(s, first);
}

inline void ballot(LaneSlots& s) {
  uint64_t bits = 0;
  for (int i = 0; i < kSimdWidth; ++i)
    if (active(s, i) && in<bool>(s, i)) bits |= uint64_t(1) << i;
  for (int i = 0; i < kSimdWidth; ++i)
    if (active(s, i)) out<uint64_t>(s, i) = bits;
}

inline void is_first(LaneSlots& s) {
  bool seen = false;
  for (int i = 0; i < kSimdWidth; ++i) {
    if (!active(s, i)) continue;
    out<bool>(s, i) = !seen;
    seen = true;
  }
}

template <class T>
T run(::mkv::host::Collective op, ::mkv::host::CombineFn fn, T x, uint32_t arg,
      ::mkv::host::SourceLoc loc) {
  T result{};
  ::mkv::host::collective(op, fn, &x, &result, arg, loc);
  return result;
}

}  // namespace simd_detail

#define MKV_SIMD_REDUCTION(name, Op)                                                      \
  template <class T>                                                                      \
  T name(T x, ::mkv::host::SourceLoc loc = MKV_HERE) {                                    \
    return simd_detail::run(::mkv::host::Collective::name,                                \
                            &simd_detail::reduce<T, simd_detail::Op>, x, 0, loc);         \
  }
MKV_SIMD_REDUCTION(simd_sum, Add)
MKV_SIMD_REDUCTION(simd_product, Mul)
MKV_SIMD_REDUCTION(simd_max, Max)
MKV_SIMD_REDUCTION(simd_min, Min)
MKV_SIMD_REDUCTION(simd_and, And)
MKV_SIMD_REDUCTION(simd_or, Or)
MKV_SIMD_REDUCTION(simd_xor, Xor)
#undef MKV_SIMD_REDUCTION

#define MKV_SIMD_PREFIX(name, Op, inclusive)                                              \
  template <class T>                                                                      \
  T name(T x, ::mkv::host::SourceLoc loc = MKV_HERE) {                                    \
    return simd_detail::run(::mkv::host::Collective::name,                                \
                            &simd_detail::prefix<T, simd_detail::Op, inclusive>, x, 0, loc); \
  }
MKV_SIMD_PREFIX(simd_prefix_inclusive_sum, Add, true)
MKV_SIMD_PREFIX(simd_prefix_exclusive_sum, Add, false)
MKV_SIMD_PREFIX(simd_prefix_inclusive_product, Mul, true)
MKV_SIMD_PREFIX(simd_prefix_exclusive_product, Mul, false)
#undef MKV_SIMD_PREFIX

#define MKV_SIMD_PERMUTE(name, source)                                                    \
  template <class T>                                                                      \
  T name(T x, uint32_t arg, ::mkv::host::SourceLoc loc = MKV_HERE) {                      \
    return simd_detail::run(::mkv::host::Collective::name,                                \
                            &simd_detail::permute<T, &simd_detail::source>, x, arg, loc); \
  }
MKV_SIMD_PERMUTE(simd_shuffle, source_index)
MKV_SIMD_PERMUTE(simd_shuffle_xor, source_xor)
MKV_SIMD_PERMUTE(simd_shuffle_down, source_down)
MKV_SIMD_PERMUTE(simd_shuffle_up, source_up)
MKV_SIMD_PERMUTE(simd_broadcast, source_index)
#undef MKV_SIMD_PERMUTE

template <class T>
T simd_broadcast_first(T x, ::mkv::host::SourceLoc loc = MKV_HERE) {
  return simd_detail::run(::mkv::host::Collective::simd_broadcast_first,
                          &simd_detail::broadcast_first<T>, x, 0, loc);
}

inline simd_vote simd_ballot(bool predicate, ::mkv::host::SourceLoc loc = MKV_HERE) {
  uint64_t bits = 0;
  ::mkv::host::collective(::mkv::host::Collective::simd_ballot, &simd_detail::ballot,
                          &predicate, &bits, 0, loc);
  return simd_vote{bits};
}
inline bool simd_all(bool predicate, ::mkv::host::SourceLoc loc = MKV_HERE) {
  return simd_detail::run(::mkv::host::Collective::simd_all,
                          &simd_detail::reduce<uint32_t, simd_detail::And>, uint32_t(predicate),
                          0, loc) != 0;
}
inline bool simd_any(bool predicate, ::mkv::host::SourceLoc loc = MKV_HERE) {
  return simd_detail::run(::mkv::host::Collective::simd_any,
                          &simd_detail::reduce<uint32_t, simd_detail::Or>, uint32_t(predicate),
                          0, loc) != 0;
}
inline bool simd_is_first(::mkv::host::SourceLoc loc = MKV_HERE) {
  bool self = true, result = false;
  ::mkv::host::collective(::mkv::host::Collective::simd_is_first, &simd_detail::is_first,
                          &self, &result, 0, loc);
  return result;
}

}  // namespace metal
