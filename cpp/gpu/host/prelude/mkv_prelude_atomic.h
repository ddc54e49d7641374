// Host prelude, part 3: MSL atomics on GCC __atomic builtins.
//
// These are real atomics: threadgroups run on several OS threads at once, so
// device atomics race across threads (lanes of one threadgroup are fibers on
// one thread, so threadgroup atomics never actually race, but stay atomic).
//
// MSL writes `device atomic_uint* p` / `threadgroup atomic_int* p`; on the
// host the address-space words are empty macros, so the functions take plain
// pointers. They take `volatile atomic<T>*` so both the volatile and the
// non-volatile spellings MSL allows deduce T. The operand parameters are
// non-deduced (mkv_detail::id), so atomic_fetch_add_explicit(p, 1, ...) on an
// atomic_uint converts 1 to uint as in MSL.
//
// Operations by element type, as in MSL:
//   int, uint:    load, store, exchange, compare_exchange_weak, fetch_add/sub/
//                 min/max/and/or/xor
//   ulong:        the same (MSL restricts 64-bit atomics further by GPU family)
//   float:        load, store, exchange, compare_exchange_weak, fetch_add/sub
//                 (add/sub by compare-exchange loop: x86 has no float RMW)
//   bool:         load, store, exchange, compare_exchange_weak
#pragma once

#include "mkv_prelude_types.h"

namespace metal {

// The values are GCC's __ATOMIC_* constants, so they pass straight through.
enum memory_order {
  memory_order_relaxed = __ATOMIC_RELAXED,
  memory_order_acquire = __ATOMIC_ACQUIRE,
  memory_order_release = __ATOMIC_RELEASE,
  memory_order_acq_rel = __ATOMIC_ACQ_REL,
  memory_order_seq_cst = __ATOMIC_SEQ_CST,
};

}  // namespace metal

#include "../../prelude_common/mkv_common_atomic_types.h"  // atomic<T>, atomic_int ...

namespace metal {
namespace mkv_detail {

// GCC rejects a failure order that is stronger than the success order or has
// release semantics (a failed exchange stores nothing); weaken it instead.
constexpr int failure_order(memory_order success, memory_order failure) {
  const int f = int(failure) < int(success) ? int(failure) : int(success);
  return f == __ATOMIC_RELEASE ? __ATOMIC_RELAXED : f == __ATOMIC_ACQ_REL ? __ATOMIC_ACQUIRE : f;
}

// Read-modify-write by compare-exchange loop, for operations x86 lacks
// (float add, min/max). Returns the old value.
template <class T, class F> inline T rmw_loop(volatile atomic<T>* obj, F f, memory_order order) {
  T expected;
  __atomic_load(&obj->value_, &expected, __ATOMIC_RELAXED);
  T desired = f(expected);
  while (!__atomic_compare_exchange(&obj->value_, &expected, &desired, true, int(order), __ATOMIC_RELAXED))
    desired = f(expected);
  return expected;
}
}  // namespace mkv_detail

template <class T>
inline T atomic_load_explicit(const volatile atomic<T>* obj, memory_order order) {
  T v;
  __atomic_load(&obj->value_, &v, int(order));
  return v;
}

template <class T>
inline void atomic_store_explicit(volatile atomic<T>* obj, mkv_detail::id_t<T> desired, memory_order order) {
  __atomic_store(&obj->value_, &desired, int(order));
}

template <class T>
inline T atomic_exchange_explicit(volatile atomic<T>* obj, mkv_detail::id_t<T> desired, memory_order order) {
  T old;
  __atomic_exchange(&obj->value_, &desired, &old, int(order));
  return old;
}

// On failure *expected receives the current value. May fail spuriously.
template <class T>
inline bool atomic_compare_exchange_weak_explicit(volatile atomic<T>* obj, mkv_detail::id_t<T>* expected,
                                                  mkv_detail::id_t<T> desired, memory_order success,
                                                  memory_order failure) {
  return __atomic_compare_exchange(&obj->value_, expected, &desired, true, int(success),
                                   mkv_detail::failure_order(success, failure));
}

template <class T>
inline T atomic_fetch_add_explicit(volatile atomic<T>* obj, mkv_detail::id_t<T> operand, memory_order order) {
  if constexpr (std::is_same<T, float>::value) {
    return mkv_detail::rmw_loop(obj, [operand](float v) { return v + operand; }, order);
  } else {
    static_assert(mkv_detail::is_int_atomic_v<T>, "MSL: fetch_add needs an int, uint, ulong or float atomic");
    return __atomic_fetch_add(&obj->value_, operand, int(order));
  }
}

template <class T>
inline T atomic_fetch_sub_explicit(volatile atomic<T>* obj, mkv_detail::id_t<T> operand, memory_order order) {
  if constexpr (std::is_same<T, float>::value) {
    return mkv_detail::rmw_loop(obj, [operand](float v) { return v - operand; }, order);
  } else {
    static_assert(mkv_detail::is_int_atomic_v<T>, "MSL: fetch_sub needs an int, uint, ulong or float atomic");
    return __atomic_fetch_sub(&obj->value_, operand, int(order));
  }
}

template <class T>
inline T atomic_fetch_min_explicit(volatile atomic<T>* obj, mkv_detail::id_t<T> operand, memory_order order) {
  static_assert(mkv_detail::is_int_atomic_v<T>, "MSL: fetch_min needs an integer atomic");
  return mkv_detail::rmw_loop(obj, [operand](T v) { return operand < v ? operand : v; }, order);
}

template <class T>
inline T atomic_fetch_max_explicit(volatile atomic<T>* obj, mkv_detail::id_t<T> operand, memory_order order) {
  static_assert(mkv_detail::is_int_atomic_v<T>, "MSL: fetch_max needs an integer atomic");
  return mkv_detail::rmw_loop(obj, [operand](T v) { return v < operand ? operand : v; }, order);
}

#define MKV_ATOMIC_BITWISE(name, builtin)                                                           \
  template <class T>                                                                                \
  inline T name(volatile atomic<T>* obj, mkv_detail::id_t<T> operand, memory_order order) {        \
    static_assert(mkv_detail::is_int_atomic_v<T>, "MSL: " #name " needs an integer atomic");        \
    return builtin(&obj->value_, operand, int(order));                                              \
  }
MKV_ATOMIC_BITWISE(atomic_fetch_and_explicit, __atomic_fetch_and)
MKV_ATOMIC_BITWISE(atomic_fetch_or_explicit, __atomic_fetch_or)
MKV_ATOMIC_BITWISE(atomic_fetch_xor_explicit, __atomic_fetch_xor)
#undef MKV_ATOMIC_BITWISE

}  // namespace metal
