// Shared by both preludes, part 3 (start): MSL's atomic<T> object and its
// names. Included by cpp/gpu/host/prelude/mkv_prelude_atomic.h (GCC __atomic
// builtins) and cpp/gpu/cuda/prelude/mkv_cuda_atomic.h (CUDA's atomic
// intrinsics) after their memory_order, whose values differ, and exports
// both to global scope; the operations on these objects are each prelude's.
#pragma once

#include "mkv_common_types.h"

namespace metal {

// Like MSL, an atomic object is neither copyable nor initialized by
// construction (threadgroup atomics start undefined; initialize with
// atomic_store_explicit). Same size and alignment as T.
template <class T> struct atomic {
  static_assert(std::is_same<T, int>::value || std::is_same<T, uint>::value || std::is_same<T, ulong>::value ||
                    std::is_same<T, float>::value || std::is_same<T, bool>::value,
                "MSL atomics hold int, uint, ulong, float or bool");
  atomic() = default;
  atomic(const atomic&) = delete;
  atomic& operator=(const atomic&) = delete;

  alignas(sizeof(T)) T value_;  // touched only by the atomic_*_explicit functions
};
static_assert(sizeof(atomic<uint>) == 4 && alignof(atomic<uint>) == 4, "Metal layout");

typedef atomic<int> atomic_int;
typedef atomic<uint> atomic_uint;
typedef atomic<ulong> atomic_ulong;
typedef atomic<float> atomic_float;
typedef atomic<bool> atomic_bool;

namespace mkv_detail {
template <class T> using id_t = typename id<T>::type;
template <class T> constexpr bool is_int_atomic_v = std::is_integral<T>::value && !std::is_same<T, bool>::value;
}  // namespace mkv_detail

}  // namespace metal

// Global names, so MSL code may omit `metal::`.
using metal::atomic_bool;
using metal::atomic_float;
using metal::atomic_int;
using metal::atomic_uint;
using metal::atomic_ulong;
using metal::memory_order;
using metal::memory_order_acq_rel;
using metal::memory_order_acquire;
using metal::memory_order_relaxed;
using metal::memory_order_release;
using metal::memory_order_seq_cst;
