// Shared by both preludes, part 1: MSL scalar names, the vector traits and the
// swizzle proxy. Included by cpp/gpu/host/prelude/mkv_prelude_types.h and
// cpp/gpu/cuda/prelude/mkv_cuda_types.h after each has declared `half` (the
// host's _Float16, CUDA's __half) and the qualifier macros:
//   MKV_FN         a function callable from kernel code (host: inline;
//                  CUDA: __host__ __device__ __forceinline__)
//   MKV_FN_DEVICE  one that wraps a device intrinsic (host: inline; CUDA:
//                  __device__ __forceinline__)
// What the two preludes do differently (half, vector storage and copies) stays
// in their own headers.
#pragma once

#if !defined(MKV_FN) || !defined(MKV_FN_DEVICE)
#error "define MKV_FN and MKV_FN_DEVICE (a prelude's types header does) before including prelude_common"
#endif

// ---- Scalars ---------------------------------------------------------------
// glibc's <sys/types.h> declares uint/ushort/ulong the same way; repeating a
// typedef with the same type is allowed, so either include order works.
typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
typedef unsigned long ulong;
static_assert(sizeof(long) == 8 && sizeof(ulong) == 8, "MSL long/ulong are 64-bit; LP64 hosts only");
static_assert(sizeof(half) == 2, "half must be 16-bit");

namespace metal {

using ::half;
using ::uint;
using ::ushort;
using ::uchar;
using ::ulong;
using ::size_t;
using ::ptrdiff_t;
using ::int8_t;
using ::int16_t;
using ::int32_t;
using ::int64_t;
using ::uint8_t;
using ::uint16_t;
using ::uint32_t;
using ::uint64_t;

template <class T, int N> struct vec;

namespace mkv_detail {  // not "detail": kernels' own names must not collide

template <class T> struct id { using type = T; };

// Arithmetic types plus half (libstdc++ 12 does not count _Float16 as
// arithmetic; CUDA's __half is a class).
template <class T> constexpr bool is_scalar_v = std::is_arithmetic<T>::value || std::is_same<T, half>::value;
template <class T> constexpr bool is_float_v = std::is_same<T, float>::value || std::is_same<T, half>::value;

// vec_traits<V>: is V vector-like (vec, swizzle proxy, packed vector), and if so
// its element type and width. Operators and math functions accept any
// vector-like operand, because template argument deduction ignores the
// proxy -> vec conversion.
template <class V> struct vec_traits {
  static constexpr bool is_vec = false;
  static constexpr int size = 1;
  using elem = V;
};

template <class V> constexpr bool is_vec_like_v = vec_traits<std::remove_cv_t<V>>::is_vec;
template <class X> constexpr bool is_operand_v = is_vec_like_v<X> || is_scalar_v<X>;

// Lanes contributed by one constructor argument; 1000 makes sums fail for non-operands.
template <class X> constexpr int lanes_v = is_vec_like_v<X> ? vec_traits<X>::size : (is_scalar_v<X> ? 1 : 1000);

template <int... I> MKV_FN constexpr bool distinct() {
  constexpr int idx[] = {I...};
  for (unsigned a = 0; a < sizeof...(I); ++a)
    for (unsigned b = a + 1; b < sizeof...(I); ++b)
      if (idx[a] == idx[b]) return false;
  return true;
}

// Swizzle proxy: a union member overlaying the owning vector's storage, so
// `v.zyx` needs no pointer and no copy until it is read. S is the storage
// length (4 for 3-vectors), I... the selected components. Each prelude's
// vec_storage declares the members (host: gen_swizzles.py; CUDA: MKV_SWIZZLES).
template <class T, int S, int... I> struct swz {
  static constexpr int N = sizeof...(I);
  using vec_type = vec<T, N>;
  T d[S];

  swz() = default;
  swz(const swz&) = default;  // keeps the owning union's copy constructor trivial

  MKV_FN operator vec_type() const { return vec_type(d[I]...); }

  MKV_FN constexpr T operator[](int i) const {
    constexpr int idx[] = {I...};
    return d[idx[i]];
  }

  // Assignment writes only the named components, from a vector, another
  // proxy or a scalar (broadcast) of the same element type. It goes through a
  // vec_type copy so overlapping swizzles (v.xy = v.yx) read before writing.
  // The same-type copy assignment must be user-provided: the implicit one
  // would copy the whole storage.
  //
  // Compile time: each vector type has up to 336 proxies, and g++ resolves
  // each proxy's copy assignment while completing the owning union. A
  // template operator= or conversion-function template here doubles the
  // prelude's compile time, which is why `c ? v.xy : v.zw` (two different
  // proxy types) is not supported: write `c ? float2(v.xy) : float2(v.zw)`.
  MKV_FN swz& operator=(const swz& o) { return assign(vec_type(o)); }
  MKV_FN swz& operator=(const vec_type& v) { return assign(v); }

 private:
  MKV_FN swz& assign(const vec_type v) {  // by value: v may alias our storage (v.wzyx = v)
    static_assert(distinct<I...>(), "MSL: a swizzle that repeats a component (v.xx) is not assignable");
    constexpr int idx[] = {I...};
    for (int k = 0; k < N; ++k) d[idx[k]] = v[k];
    return *this;
  }
};

template <class T, int S, int... I> struct vec_traits<swz<T, S, I...>> {
  static constexpr bool is_vec = true;
  static constexpr int size = sizeof...(I);
  using elem = T;
};

}  // namespace mkv_detail
}  // namespace metal
