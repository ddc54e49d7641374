// MSL check prelude, part 3: SIMD-group and quad-group functions, barriers,
// atomics. Declarations only (the check is -fsyntax-only). mem_flags repeats
// cpp/gpu/prelude_common/mkv_common_simd_types.h on purpose: this prelude
// models Apple's declarations, so it takes nothing from the executors' preludes.
#pragma once

namespace metal {

// ---- Barriers ---------------------------------------------------------------
enum class mem_flags : uint {
  mem_none = 0,
  mem_device = 1,
  mem_threadgroup = 2,
  mem_texture = 4,
  mem_threadgroup_imageblock = 8,
  mem_object_data = 16,
};
constexpr mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(uint(a) | uint(b)); }
void threadgroup_barrier(mem_flags flags);
void simdgroup_barrier(mem_flags flags);

// ---- SIMD-group and quad-group functions -------------------------------------
// Reductions and scans take any integer or float scalar or vector; shuffles
// and broadcasts the same (MSL cannot shuffle bool); lane arguments are ushort.
struct simd_vote {
  typedef ulong vote_t;
  constexpr simd_vote() : bits() {}
  explicit constexpr simd_vote(vote_t v) : bits(v) {}
  explicit constexpr operator vote_t() const { return bits; }
  bool all() const;
  bool any() const;

 private:
  vote_t bits;
};

#define __MSL_GROUP_FUNCTIONS(g)                                                                     \
  template <class T> __MSL_IF(__MSL_ARITH(T), T) g##_sum(T data);                                    \
  template <class T> __MSL_IF(__MSL_ARITH(T), T) g##_product(T data);                                \
  template <class T> __MSL_IF(__MSL_ARITH(T), T) g##_max(T data);                                    \
  template <class T> __MSL_IF(__MSL_ARITH(T), T) g##_min(T data);                                    \
  template <class T> __MSL_IF(__MSL_ARITH(T), T) g##_prefix_inclusive_sum(T data);                   \
  template <class T> __MSL_IF(__MSL_ARITH(T), T) g##_prefix_exclusive_sum(T data);                   \
  template <class T> __MSL_IF(__MSL_ARITH(T), T) g##_prefix_inclusive_product(T data);               \
  template <class T> __MSL_IF(__MSL_ARITH(T), T) g##_prefix_exclusive_product(T data);               \
  template <class T> __MSL_IF(__MSL_INT(T), T) g##_and(T data);                                      \
  template <class T> __MSL_IF(__MSL_INT(T), T) g##_or(T data);                                       \
  template <class T> __MSL_IF(__MSL_INT(T), T) g##_xor(T data);                                      \
  template <class T> __MSL_IF(__MSL_ARITH(T), T) g##_broadcast(T data, ushort lane);                 \
  template <class T> __MSL_IF(__MSL_ARITH(T), T) g##_broadcast_first(T data);                        \
  template <class T> __MSL_IF(__MSL_ARITH(T), T) g##_shuffle(T data, ushort lane);                   \
  template <class T> __MSL_IF(__MSL_ARITH(T), T) g##_shuffle_down(T data, ushort delta);             \
  template <class T> __MSL_IF(__MSL_ARITH(T), T) g##_shuffle_up(T data, ushort delta);               \
  template <class T> __MSL_IF(__MSL_ARITH(T), T) g##_shuffle_xor(T data, ushort mask);               \
  template <class T> __MSL_IF(__MSL_ARITH(T), T) g##_shuffle_rotate_down(T data, ushort delta);      \
  template <class T> __MSL_IF(__MSL_ARITH(T), T) g##_shuffle_rotate_up(T data, ushort delta);        \
  template <class T> __MSL_IF(__MSL_ARITH(T), T) g##_shuffle_and_fill_down(T data, T filling, ushort delta); \
  template <class T>                                                                                 \
  __MSL_IF(__MSL_ARITH(T), T) g##_shuffle_and_fill_down(T data, T filling, ushort delta, ushort modulo);   \
  template <class T> __MSL_IF(__MSL_ARITH(T), T) g##_shuffle_and_fill_up(T data, T filling, ushort delta); \
  template <class T>                                                                                 \
  __MSL_IF(__MSL_ARITH(T), T) g##_shuffle_and_fill_up(T data, T filling, ushort delta, ushort modulo);     \
  bool g##_all(bool expr);                                                                           \
  bool g##_any(bool expr);                                                                           \
  bool g##_is_first();                                                                               \
  bool g##_is_helper_thread();
__MSL_GROUP_FUNCTIONS(simd)
__MSL_GROUP_FUNCTIONS(quad)
#undef __MSL_GROUP_FUNCTIONS
simd_vote simd_ballot(bool expr);
simd_vote simd_active_threads_mask();

// ---- Atomics ----------------------------------------------------------------
// atomic<T> lives in device or threadgroup memory and is reached only through
// the functions below (no operators, no copies), as in MSL. Only relaxed
// ordering exists.
enum memory_order { memory_order_relaxed = 0 };
template <class T> struct atomic {
  atomic() = default;
  atomic(const atomic&) = delete;
  atomic& operator=(const atomic&) = delete;

 private:
  T value;
};
// The names go through macros (metal_stdlib) because clang's OpenCL mode
// predeclares atomic_int, atomic_uint and atomic_float globally.
typedef atomic<int> __msl_atomic_int;
typedef atomic<uint> __msl_atomic_uint;
typedef atomic<bool> __msl_atomic_bool;
typedef atomic<float> __msl_atomic_float;
typedef atomic<ulong> __msl_atomic_ulong;

#define __MSL_ATOMIC_FUNCTIONS(AS)                                                                   \
  template <class T> void atomic_store_explicit(volatile AS atomic<T>* object,                      \
                                                typename __msl::identity<T>::type desired,          \
                                                memory_order order);                                \
  template <class T> T atomic_load_explicit(const volatile AS atomic<T>* object, memory_order order); \
  template <class T> T atomic_exchange_explicit(volatile AS atomic<T>* object,                      \
                                                typename __msl::identity<T>::type desired,          \
                                                memory_order order);                                \
  template <class T> bool atomic_compare_exchange_weak_explicit(                                    \
      volatile AS atomic<T>* object, __private T* expected, typename __msl::identity<T>::type desired, \
      memory_order success, memory_order failure);                                                   \
  __MSL_ATOMIC_RMW(AS, add) __MSL_ATOMIC_RMW(AS, sub) __MSL_ATOMIC_RMW(AS, and)                     \
  __MSL_ATOMIC_RMW(AS, or) __MSL_ATOMIC_RMW(AS, xor) __MSL_ATOMIC_RMW(AS, min) __MSL_ATOMIC_RMW(AS, max)
#define __MSL_ATOMIC_RMW(AS, op)                                                                     \
  template <class T> T atomic_fetch_##op##_explicit(volatile AS atomic<T>* object,                  \
                                                    typename __msl::identity<T>::type operand,      \
                                                    memory_order order);
__MSL_ATOMIC_FUNCTIONS(__global)
__MSL_ATOMIC_FUNCTIONS(__local)
#undef __MSL_ATOMIC_FUNCTIONS
#undef __MSL_ATOMIC_RMW

}  // namespace metal
