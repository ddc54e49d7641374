// CUDA prelude, part 3: barriers and SIMD-group functions. A SIMD-group is a
// warp of 32 lanes (lane = linear thread index % 32, as Metal numbers them).
//
// The contract, on every device: every lane of a SIMD-group that exists calls
// the same simd_* function together -- no lane has returned early, none skips
// the call in a branch. The host executor rejects a kernel that breaks it
// (naming the lanes). The last SIMD-group of a threadgroup whose size is not a
// multiple of 32 has fewer lanes: the functions here work over the lanes that
// exist (warp_mask(), from blockDim), full-warp __shfl_*_sync / __reduce_*_sync
// and butterflies for a whole warp, an exact serial gather over the lanes for a
// partial one. The mask is computed, not read with __activemask(): after a
// divergent branch the lanes of a warp need not have reconverged, and a
// *_sync call with the full set of lanes is what makes them meet.
//
// threadgroup_barrier is __syncthreads (it orders shared and global memory
// among the block's threads, which covers every mem_flags), simdgroup_barrier
// is __syncwarp.
#pragma once

#include "../../prelude_common/mkv_common_simd_types.h"  // mem_flags, simd_vote

namespace metal {

MKV_D void threadgroup_barrier(mem_flags) { __syncthreads(); }
MKV_D void simdgroup_barrier(mem_flags) { __syncwarp(); }

namespace simd_detail {

constexpr unsigned kFull = 0xffffffffu;

MKV_D uint lane_id() {
  uint lane;
  asm("mov.u32 %0, %%laneid;" : "=r"(lane));
  return lane;
}

// The lanes of this thread's SIMD-group that exist: all 32 but in the last
// group of a threadgroup whose size is not a multiple of 32.
MKV_D unsigned warp_mask() {
  const uint n = blockDim.x * blockDim.y * blockDim.z;
  const uint linear = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const uint lanes = n - (linear & ~31u);
  return lanes >= 32 ? kFull : (1u << lanes) - 1u;
}

// The four warp shuffles, on the types __shfl_*_sync takes.
struct Index { int arg; template <class U> MKV_D U operator()(U v) const { return __shfl_sync(kFull, v, arg); } };
struct Xor { int arg; template <class U> MKV_D U operator()(U v) const { return __shfl_xor_sync(kFull, v, arg); } };
struct Down { int arg; template <class U> MKV_D U operator()(U v) const { return __shfl_down_sync(kFull, v, unsigned(arg)); } };
struct Up { int arg; template <class U> MKV_D U operator()(U v) const { return __shfl_up_sync(kFull, v, unsigned(arg)); } };
// The same over the lanes of `mask` (a partial SIMD-group).
struct MaskedIndex { int arg; unsigned mask; template <class U> MKV_D U operator()(U v) const { return __shfl_sync(mask, v, arg); } };
struct MaskedXor { int arg; unsigned mask; template <class U> MKV_D U operator()(U v) const { return __shfl_xor_sync(mask, v, arg); } };
struct MaskedDown { int arg; unsigned mask; template <class U> MKV_D U operator()(U v) const { return __shfl_down_sync(mask, v, unsigned(arg)); } };
struct MaskedUp { int arg; unsigned mask; template <class U> MKV_D U operator()(U v) const { return __shfl_up_sync(mask, v, unsigned(arg)); } };

template <class T> constexpr bool native_shfl_v =
    std::is_same<T, int>::value || std::is_same<T, unsigned>::value || std::is_same<T, float>::value ||
    std::is_same<T, long>::value || std::is_same<T, unsigned long>::value || std::is_same<T, long long>::value ||
    std::is_same<T, unsigned long long>::value || std::is_same<T, half>::value;

// Any scalar or vector: native types directly, vectors of 1- and 2-byte
// elements as 32-bit words (half2 is one shuffle, half4 two), other vectors
// element by element, small integers and bool widened to int.
template <class T, class S> MKV_D T shuffle(const T& v, S s) {
  using mkv_detail::vec_traits;
  if constexpr (native_shfl_v<T>) {
    return s(v);
  } else if constexpr (mkv_detail::is_vec_like_v<T>) {
    using E = typename vec_traits<T>::elem;
    if constexpr (sizeof(E) < 4 && sizeof(T) % 4 == 0) {
      unsigned w[sizeof(T) / 4];
      memcpy(w, static_cast<const void*>(&v), sizeof(T));
      for (unsigned i = 0; i < sizeof(T) / 4; ++i) w[i] = s(w[i]);
      T r;
      memcpy(static_cast<void*>(&r), w, sizeof(T));
      return r;
    } else {
      T r;
      for (int i = 0; i < vec_traits<T>::size; ++i) r[i] = shuffle(static_cast<E>(v[i]), s);
      return r;
    }
  } else {
    static_assert(std::is_integral<T>::value, "simd shuffle: a scalar or vector type");
    return static_cast<T>(s(static_cast<int>(v)));
  }
}

struct Add { template <class T> MKV_D T operator()(T a, T b) const { return a + b; } };
struct Mul { template <class T> MKV_D T operator()(T a, T b) const { return a * b; } };
struct Max { template <class T> MKV_D T operator()(T a, T b) const { return metal::max(a, b); } };
struct Min { template <class T> MKV_D T operator()(T a, T b) const { return metal::min(a, b); } };
struct And { template <class T> MKV_D T operator()(T a, T b) const { return a & b; } };
struct Or { template <class T> MKV_D T operator()(T a, T b) const { return a | b; } };
struct BitXor { template <class T> MKV_D T operator()(T a, T b) const { return a ^ b; } };

// The active lanes in order, x_first op ... op x_last, for lanes <= `upto`
// (31: all): the exact path of a partial SIMD-group. 32 shuffles; rare.
template <class Op, class T> MKV_D T gather(T x, unsigned mask, uint upto) {
  T acc = x;
  bool first = true;
  for (int src = 0; src < 32; ++src) {
    if (!((mask >> src) & 1u)) continue;
    const T y = shuffle(x, MaskedIndex{src, mask});  // every active lane takes part in each shuffle
    if (uint(src) <= upto) {
      acc = first ? y : Op()(acc, y);
      first = false;
    }
  }
  return acc;
}

// Butterfly: every lane ends with the same bits (each step is commutative).
template <class Op, class T> MKV_D T butterfly(T x) {
  const unsigned mask = warp_mask();
  if (mask != kFull) return gather<Op>(x, mask, 31);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = Op()(x, shuffle(x, Xor{o}));
  return x;
}

// Inclusive scan, lanes in order: x_0 op x_1 op ... op x_lane.
template <class Op, class T> MKV_D T scan(T x) {
  const uint lane = lane_id();
  const unsigned mask = warp_mask();
  if (mask != kFull) return gather<Op>(x, mask, lane);
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T y = shuffle(x, Up{o});
    if (lane >= uint(o)) x = Op()(y, x);
  }
  return x;
}

// Exclusive scan: the inclusive result of the active lanes strictly below;
// `identity` for the first.
template <class Op, class T> MKV_D T exclusive_scan(T x, T identity) {
  const unsigned mask = warp_mask();
  const uint lane = lane_id();
  if (mask != kFull) {
    const unsigned below = mask & ((1u << lane) - 1u);
    const T inc = gather<Op>(x, mask, below ? uint(31 - __clz(below)) : 0u);
    return below ? inc : identity;
  }
  const T up = shuffle(scan<Op>(x), Up{1});
  return lane == 0 ? identity : up;
}

template <class T> constexpr bool is_int32_v = std::is_same<T, int>::value || std::is_same<T, unsigned>::value;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
constexpr bool kHasRedux = true;  // __reduce_*_sync
#else
constexpr bool kHasRedux = false;
#endif

}  // namespace simd_detail

// ---- Reductions ------------------------------------------------------------------
// 32-bit integers use sm_80's __reduce_*_sync (one instruction).
#define MKV_SIMD_REDUCE(name, Op, intrinsic)                                           \
  template <class T> MKV_D T name(T x) {                                              \
    if constexpr (simd_detail::is_int32_v<T> && simd_detail::kHasRedux)               \
      return intrinsic(simd_detail::warp_mask(), x);                                            \
    else                                                                              \
      return simd_detail::butterfly<simd_detail::Op>(x);                              \
  }
MKV_SIMD_REDUCE(simd_sum, Add, __reduce_add_sync)
MKV_SIMD_REDUCE(simd_max, Max, __reduce_max_sync)
MKV_SIMD_REDUCE(simd_min, Min, __reduce_min_sync)
#undef MKV_SIMD_REDUCE
template <class T> MKV_D T simd_product(T x) { return simd_detail::butterfly<simd_detail::Mul>(x); }
// __reduce_{and,or,xor}_sync take unsigned only.
#define MKV_SIMD_BITWISE(name, Op, intrinsic)                                          \
  template <class T> MKV_D T name(T x) {                                              \
    static_assert(std::is_integral<typename mkv_detail::vec_traits<T>::elem>::value,  \
                  "MSL: " #name " needs an integer type");                            \
    if constexpr (simd_detail::is_int32_v<T> && simd_detail::kHasRedux)               \
      return T(intrinsic(simd_detail::warp_mask(), unsigned(x)));                               \
    else                                                                              \
      return simd_detail::butterfly<simd_detail::Op>(x);                              \
  }
MKV_SIMD_BITWISE(simd_and, And, __reduce_and_sync)
MKV_SIMD_BITWISE(simd_or, Or, __reduce_or_sync)
MKV_SIMD_BITWISE(simd_xor, BitXor, __reduce_xor_sync)
#undef MKV_SIMD_BITWISE

// ---- Scans -----------------------------------------------------------------------
template <class T> MKV_D T simd_prefix_inclusive_sum(T x) { return simd_detail::scan<simd_detail::Add>(x); }
template <class T> MKV_D T simd_prefix_inclusive_product(T x) { return simd_detail::scan<simd_detail::Mul>(x); }
template <class T> MKV_D T simd_prefix_exclusive_sum(T x) {
  return simd_detail::exclusive_scan<simd_detail::Add>(x, T(0));
}
template <class T> MKV_D T simd_prefix_exclusive_product(T x) {
  return simd_detail::exclusive_scan<simd_detail::Mul>(x, T(1));
}

// ---- Permutations ------------------------------------------------------------------
// shuffle_down/up: lanes whose source is past the warp keep their own value. Over
// the active lanes (a source lane that is not active gives an undefined value,
// as in Metal).
template <class T> MKV_D T simd_shuffle(T x, ushort lane) {
  return simd_detail::shuffle(x, simd_detail::MaskedIndex{lane, simd_detail::warp_mask()});
}
template <class T> MKV_D T simd_broadcast(T x, ushort lane) { return simd_shuffle(x, lane); }
template <class T> MKV_D T simd_shuffle_xor(T x, ushort mask) {
  return simd_detail::shuffle(x, simd_detail::MaskedXor{mask, simd_detail::warp_mask()});
}
template <class T> MKV_D T simd_shuffle_down(T x, ushort delta) {
  return simd_detail::shuffle(x, simd_detail::MaskedDown{delta, simd_detail::warp_mask()});
}
template <class T> MKV_D T simd_shuffle_up(T x, ushort delta) {
  return simd_detail::shuffle(x, simd_detail::MaskedUp{delta, simd_detail::warp_mask()});
}

// ---- Votes: over the lanes active at the call -----------------------------------------
MKV_D bool simd_all(bool p) { return __all_sync(simd_detail::warp_mask(), p); }
MKV_D bool simd_any(bool p) { return __any_sync(simd_detail::warp_mask(), p); }
MKV_D simd_vote simd_ballot(bool p) { return simd_vote{__ballot_sync(simd_detail::warp_mask(), p)}; }
MKV_D bool simd_is_first() { return simd_detail::lane_id() == uint(__ffs(simd_detail::warp_mask()) - 1); }
template <class T> MKV_D T simd_broadcast_first(T x) {
  const unsigned m = simd_detail::warp_mask();
  const int first = __ffs(m) - 1;
  if constexpr (simd_detail::native_shfl_v<T>) {
    return __shfl_sync(m, x, first);
  } else {
    T r;
    unsigned w[(sizeof(T) + 3) / 4] = {};
    memcpy(w, static_cast<const void*>(&x), sizeof(T));
    for (unsigned i = 0; i < (sizeof(T) + 3) / 4; ++i) w[i] = __shfl_sync(m, w[i], first);
    memcpy(static_cast<void*>(&r), w, sizeof(T));
    return r;
  }
}

}  // namespace metal
