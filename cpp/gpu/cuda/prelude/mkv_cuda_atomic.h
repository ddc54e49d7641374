// CUDA prelude, part 4: MSL atomics on CUDA's atomic intrinsics, for device
// and threadgroup (__shared__) memory alike (generic addresses).
//
// Memory orders: memory_order_relaxed (the only one MSL allows for most
// operations, and the only one metal/ uses) is the intrinsics' own order
// (relaxed, device scope). The stronger ones add __threadfence() before
// (release) and/or after (acquire) the operation: correct, not the cheapest.
//
// Operations by element type, as in MSL and the host prelude:
//   int, uint, ulong: load, store, exchange, compare_exchange_weak, fetch_add/sub/
//                     min/max/and/or/xor
//   float:            load, store, exchange, compare_exchange_weak, fetch_add/sub
//   bool:             load, store (CUDA has no 1-byte read-modify-write)
#pragma once

namespace metal {

enum memory_order {
  memory_order_relaxed,
  memory_order_acquire,
  memory_order_release,
  memory_order_acq_rel,
  memory_order_seq_cst,
};

}  // namespace metal

#include "../../prelude_common/mkv_common_atomic_types.h"  // atomic<T>, atomic_int ...

namespace metal {
namespace mkv_detail {

// The intrinsics take int*, unsigned*, unsigned long long*, float*.
template <class T> struct cuda_atomic { using type = T; };
template <> struct cuda_atomic<ulong> { using type = unsigned long long; };
template <class T> MKV_D typename cuda_atomic<T>::type* addr(const volatile atomic<T>* obj) {
  return reinterpret_cast<typename cuda_atomic<T>::type*>(const_cast<T*>(&obj->value_));
}
template <class T> MKV_D typename cuda_atomic<T>::type arg(T v) { return static_cast<typename cuda_atomic<T>::type>(v); }

MKV_D void fence_before(memory_order order) {
  if (order == memory_order_release || order == memory_order_acq_rel || order == memory_order_seq_cst)
    __threadfence();
}
MKV_D void fence_after(memory_order order) {
  if (order == memory_order_acquire || order == memory_order_acq_rel || order == memory_order_seq_cst)
    __threadfence();
}
}  // namespace mkv_detail

template <class T> MKV_D T atomic_load_explicit(const volatile atomic<T>* obj, memory_order order) {
  const T v = obj->value_;  // a volatile load: never cached in a register
  mkv_detail::fence_after(order);
  return v;
}

template <class T>
MKV_D void atomic_store_explicit(volatile atomic<T>* obj, mkv_detail::id_t<T> desired, memory_order order) {
  mkv_detail::fence_before(order);
  obj->value_ = desired;
}

template <class T>
MKV_D T atomic_exchange_explicit(volatile atomic<T>* obj, mkv_detail::id_t<T> desired, memory_order order) {
  static_assert(!std::is_same<T, bool>::value, "atomic_bool exchange: CUDA has no 1-byte atomics");
  mkv_detail::fence_before(order);
  const T old = T(atomicExch(mkv_detail::addr(obj), mkv_detail::arg<T>(desired)));
  mkv_detail::fence_after(order);
  return old;
}

// On failure *expected receives the current value (never fails spuriously here).
template <class T>
MKV_D bool atomic_compare_exchange_weak_explicit(volatile atomic<T>* obj, mkv_detail::id_t<T>* expected,
                                                 mkv_detail::id_t<T> desired, memory_order success,
                                                 memory_order failure) {
  static_assert(!std::is_same<T, bool>::value, "atomic_bool compare-exchange: CUDA has no 1-byte atomics");
  mkv_detail::fence_before(success);
  bool ok;
  if constexpr (std::is_same<T, float>::value) {
    const int want = __float_as_int(*expected);
    const int old = atomicCAS(reinterpret_cast<int*>(mkv_detail::addr(obj)), want, __float_as_int(desired));
    ok = old == want;
    *expected = __int_as_float(old);
  } else {
    const auto want = mkv_detail::arg<T>(*expected);
    const auto old = atomicCAS(mkv_detail::addr(obj), want, mkv_detail::arg<T>(desired));
    ok = old == want;
    *expected = T(old);
  }
  mkv_detail::fence_after(ok ? success : failure);
  return ok;
}

template <class T>
MKV_D T atomic_fetch_add_explicit(volatile atomic<T>* obj, mkv_detail::id_t<T> operand, memory_order order) {
  static_assert(mkv_detail::is_int_atomic_v<T> || std::is_same<T, float>::value,
                "MSL: fetch_add needs an int, uint, ulong or float atomic");
  mkv_detail::fence_before(order);
  const T old = T(atomicAdd(mkv_detail::addr(obj), mkv_detail::arg<T>(operand)));
  mkv_detail::fence_after(order);
  return old;
}

template <class T>
MKV_D T atomic_fetch_sub_explicit(volatile atomic<T>* obj, mkv_detail::id_t<T> operand, memory_order order) {
  static_assert(mkv_detail::is_int_atomic_v<T> || std::is_same<T, float>::value,
                "MSL: fetch_sub needs an int, uint, ulong or float atomic");
  mkv_detail::fence_before(order);
  T old;
  if constexpr (std::is_same<T, int>::value || std::is_same<T, uint>::value)
    old = T(atomicSub(mkv_detail::addr(obj), operand));
  else  // float, ulong: add the negation (wraps for ulong, as subtraction does)
    old = T(atomicAdd(mkv_detail::addr(obj), mkv_detail::arg<T>(T(0) - operand)));
  mkv_detail::fence_after(order);
  return old;
}

#define MKV_ATOMIC_INT_RMW(name, intrinsic)                                                      \
  template <class T>                                                                             \
  MKV_D T name(volatile atomic<T>* obj, mkv_detail::id_t<T> operand, memory_order order) {       \
    static_assert(mkv_detail::is_int_atomic_v<T>, "MSL: " #name " needs an integer atomic");     \
    mkv_detail::fence_before(order);                                                             \
    const T old = T(intrinsic(mkv_detail::addr(obj), mkv_detail::arg<T>(operand)));              \
    mkv_detail::fence_after(order);                                                              \
    return old;                                                                                  \
  }
MKV_ATOMIC_INT_RMW(atomic_fetch_min_explicit, atomicMin)
MKV_ATOMIC_INT_RMW(atomic_fetch_max_explicit, atomicMax)
MKV_ATOMIC_INT_RMW(atomic_fetch_and_explicit, atomicAnd)
MKV_ATOMIC_INT_RMW(atomic_fetch_or_explicit, atomicOr)
MKV_ATOMIC_INT_RMW(atomic_fetch_xor_explicit, atomicXor)
#undef MKV_ATOMIC_INT_RMW

}  // namespace metal
