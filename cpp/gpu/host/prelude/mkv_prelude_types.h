// Host prelude, part 1: MSL scalar and vector types, compiled as C++17 by g++.
//
// Lets .metal kernel source compile on the CPU (see DESIGN.md, "Why a host
// executor"). Everything lives in namespace metal; the type names are also
// exported to global scope because MSL code writes `float4`, `half`, `uint`
// without `metal::`.
//
// Layout matches Metal, so structs shared with the GPU have the same size:
//   vec<T,2>: 2 elements, size = align = 2*sizeof(T)      (float2: 8/8)
//   vec<T,3>: 3 elements padded to 4, size = align = 4*sizeof(T) (float3: 16/16)
//   vec<T,4>: 4 elements, size = align = 4*sizeof(T)      (float4: 16/16, half4: 8/8)
//   packed_vec<T,N>: N elements, no padding, align = alignof(T) (packed_float3: 12/4)
//
// No header that declares global math functions may be included here (see
// mkv_prelude_math.h), so only <cstddef>, <cstdint>, <type_traits>.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

// ---- Scalars ---------------------------------------------------------------
// glibc's <sys/types.h> declares uint/ushort/ulong the same way; repeating a
// typedef with the same type is allowed, so either include order works.
typedef _Float16 half;  // every _Float16 operation rounds to half (a GPU may fuse)
typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
typedef unsigned long ulong;
static_assert(sizeof(long) == 8 && sizeof(ulong) == 8, "MSL long/ulong are 64-bit; LP64 hosts only");
static_assert(sizeof(half) == 2, "half must be 16-bit");

// MSL half literals: 1.0h, 0.5h. Suffixes without '_' are reserved for the
// standard library, hence the silenced warning; uses of the literal are fine.
#pragma GCC diagnostic push
#if defined(__clang__)
#pragma GCC diagnostic ignored "-Wuser-defined-literals"
#else
#pragma GCC diagnostic ignored "-Wliteral-suffix"
#endif
constexpr half operator"" h(long double v) { return static_cast<half>(v); }
constexpr half operator"" h(unsigned long long v) { return static_cast<half>(v); }
#pragma GCC diagnostic pop

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

// Arithmetic types plus half (libstdc++ 12 does not count _Float16 as arithmetic).
template <class T>
constexpr bool is_scalar_v = std::is_arithmetic<T>::value || std::is_same<T, _Float16>::value;

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

template <int... I> constexpr bool distinct() {
  constexpr int idx[] = {I...};
  for (unsigned a = 0; a < sizeof...(I); ++a)
    for (unsigned b = a + 1; b < sizeof...(I); ++b)
      if (idx[a] == idx[b]) return false;
  return true;
}

struct zero_t {};

// Swizzle proxy: a union member overlaying the owning vector's storage, so
// `v.zyx` needs no pointer and no copy until it is read. S is the storage
// length (4 for 3-vectors), I... the selected components.
template <class T, int S, int... I> struct swz {
  static constexpr int N = sizeof...(I);
  using vec_type = vec<T, N>;
  T d[S];

  swz() = default;
  swz(const swz&) = default;  // keeps the owning union's copy constructor trivial

  operator vec_type() const { return vec_type(d[I]...); }

  constexpr T operator[](int i) const {
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
  swz& operator=(const swz& o) { return assign(vec_type(o)); }
  swz& operator=(const vec_type& v) { return assign(v); }

 private:
  swz& assign(const vec_type v) {  // by value: v may alias our storage (v.wzyx = v)
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

// Storage of vec<T,N>: one anonymous union holding the element array, the
// named members (.x/.r ...; real lvalues, &v.x works) and every swizzle
// proxy (generated by gen_swizzles.py). All members start at offset 0.
// Reading a member other than the last one written is union type punning,
// which GCC defines; all overlapping accesses are of the same type T.
// It is a base class so that vec<T,N> below is written once for all widths.
template <class T, int N> struct vec_storage;

template <class T> struct alignas(2 * sizeof(T)) vec_storage<T, 2> {
  static constexpr int kStorage = 2;
  union {
    T data_[2];
    struct { T x, y; };
    struct { T r, g; };
#define MKV_SWIZZLE_N 2
#include "mkv_prelude_swizzles.inc"
#undef MKV_SWIZZLE_N
  };
  vec_storage() = default;
  constexpr explicit vec_storage(zero_t) : data_{} {}
};

template <class T> struct alignas(4 * sizeof(T)) vec_storage<T, 3> {
  static constexpr int kStorage = 4;  // Metal pads 3-vectors to 4 elements
  union {
    T data_[4];
    struct { T x, y, z; };
    struct { T r, g, b; };
#define MKV_SWIZZLE_N 3
#include "mkv_prelude_swizzles.inc"
#undef MKV_SWIZZLE_N
  };
  vec_storage() = default;
  constexpr explicit vec_storage(zero_t) : data_{} {}
};

template <class T> struct alignas(4 * sizeof(T)) vec_storage<T, 4> {
  static constexpr int kStorage = 4;
  union {
    T data_[4];
    struct { T x, y, z, w; };
    struct { T r, g, b, a; };
#define MKV_SWIZZLE_N 4
#include "mkv_prelude_swizzles.inc"
#undef MKV_SWIZZLE_N
  };
  vec_storage() = default;
  constexpr explicit vec_storage(zero_t) : data_{} {}
};

}  // namespace mkv_detail

// MSL vector. Not trivially copyable (the copy assignment is user-provided,
// because the union's implicit one is deleted by the swizzle proxies), but the
// copy constructor and destructor are trivial, so vectors still pass in
// registers and threadgroup arrays of them need no construction.
template <class T, int N> struct vec : mkv_detail::vec_storage<T, N> {
  static_assert(N >= 2 && N <= 4, "MSL vectors have 2, 3 or 4 components");
  static_assert(mkv_detail::is_scalar_v<T>, "vector element must be a scalar type");
  using base = mkv_detail::vec_storage<T, N>;
  using base::data_;
  using value_type = T;

  vec() = default;  // uninitialized, like MSL; `float4 v = {};` zero-fills
  vec(const vec&) = default;
  constexpr vec& operator=(const vec& o) {
    for (int i = 0; i < N; ++i) data_[i] = o.data_[i];
    return *this;
  }

  // Broadcast, implicit so `float4 v = 0.0f;` and `v.xy = 1.0f;` work as in MSL.
  template <class S, std::enable_if_t<mkv_detail::is_scalar_v<S>, int> = 0>
  constexpr vec(S s) : base(mkv_detail::zero_t{}) {
    for (int i = 0; i < N; ++i) data_[i] = static_cast<T>(s);
  }

  // Concatenation: float4(a, b, c, d), float4(float2, float, float),
  // float4(float3, float), float4(float2, float2), float3(float2, float).
  // Scalars convert to T; vector arguments must already have element type T.
  template <class A0, class A1, class... As,
            std::enable_if_t<mkv_detail::lanes_v<A0> + mkv_detail::lanes_v<A1> +
                                     (0 + ... + mkv_detail::lanes_v<As>) == N,
                             int> = 0>
  constexpr vec(const A0& a0, const A1& a1, const As&... as) : base(mkv_detail::zero_t{}) {
    int k = 0;
    put(k, a0);
    put(k, a1);
    (put(k, as), ...);
  }

  // Element-type conversion is explicit in MSL: float4(half4), uint2(int2).
  template <class V,
            std::enable_if_t<mkv_detail::is_vec_like_v<V> && mkv_detail::vec_traits<V>::size == N &&
                                 !std::is_same<typename mkv_detail::vec_traits<V>::elem, T>::value,
                             int> = 0>
  constexpr explicit vec(const V& v) : base(mkv_detail::zero_t{}) {
    for (int i = 0; i < N; ++i) data_[i] = static_cast<T>(v[i]);
  }

  constexpr T& operator[](int i) { return data_[i]; }
  constexpr const T& operator[](int i) const { return data_[i]; }

  // Binary and compound-assignment operators are free templates in
  // mkv_prelude_vec_ops.h, found by ADL (fewer members per instantiation).

 private:
  template <class X> constexpr void put(int& k, const X& x) {
    if constexpr (mkv_detail::is_vec_like_v<X>) {
      static_assert(std::is_same<typename mkv_detail::vec_traits<X>::elem, T>::value,
                    "MSL: vector constructor arguments must have the same element type; convert explicitly");
      for (int i = 0; i < mkv_detail::vec_traits<X>::size; ++i) data_[k++] = x[i];
    } else {
      data_[k++] = static_cast<T>(x);
    }
  }
};

// MSL packed vectors: no padding, element alignment (packed_float3 is 12
// bytes, 4-aligned), for tightly packed buffer data. They convert implicitly
// to and from vec<T,N> and take part in arithmetic, but have no swizzles.
namespace mkv_detail {
template <class T, int N> struct packed_storage;
template <class T> struct packed_storage<T, 2> {
  union { T data_[2]; struct { T x, y; }; struct { T r, g; }; };
};
template <class T> struct packed_storage<T, 3> {
  union { T data_[3]; struct { T x, y, z; }; struct { T r, g, b; }; };
};
template <class T> struct packed_storage<T, 4> {
  union { T data_[4]; struct { T x, y, z, w; }; struct { T r, g, b, a; }; };
};

template <class T, int N> struct packed_vec : packed_storage<T, N> {
  using packed_storage<T, N>::data_;
  packed_vec() = default;
  packed_vec(const vec<T, N>& v) {
    for (int i = 0; i < N; ++i) data_[i] = v[i];
  }
  template <class A0, class A1, class... As>
  packed_vec(const A0& a0, const A1& a1, const As&... as) : packed_vec(vec<T, N>(a0, a1, as...)) {}
  operator vec<T, N>() const {
    vec<T, N> v;
    for (int i = 0; i < N; ++i) v[i] = data_[i];
    return v;
  }
  T& operator[](int i) { return data_[i]; }
  const T& operator[](int i) const { return data_[i]; }
};

template <class T, int N> struct vec_traits<vec<T, N>> {
  static constexpr bool is_vec = true;
  static constexpr int size = N;
  using elem = T;
};
template <class T, int N> struct vec_traits<packed_vec<T, N>> {
  static constexpr bool is_vec = true;
  static constexpr int size = N;
  using elem = T;
};
}  // namespace mkv_detail

#define MKV_VEC_TYPEDEFS(T, name)                                              \
  typedef vec<T, 2> name##2;                                                   \
  typedef vec<T, 3> name##3;                                                   \
  typedef vec<T, 4> name##4;
#define MKV_PACKED_TYPEDEFS(T, name)                                           \
  typedef mkv_detail::packed_vec<T, 2> packed_##name##2;                       \
  typedef mkv_detail::packed_vec<T, 3> packed_##name##3;                       \
  typedef mkv_detail::packed_vec<T, 4> packed_##name##4;
// char vectors use plain char like MSL scalar `char`; MSL char is signed, so
// build with -fsigned-char on hosts where char is unsigned (arm64 Linux).
MKV_VEC_TYPEDEFS(float, float) MKV_PACKED_TYPEDEFS(float, float)
MKV_VEC_TYPEDEFS(half, half) MKV_PACKED_TYPEDEFS(half, half)
MKV_VEC_TYPEDEFS(int, int) MKV_PACKED_TYPEDEFS(int, int)
MKV_VEC_TYPEDEFS(uint, uint) MKV_PACKED_TYPEDEFS(uint, uint)
MKV_VEC_TYPEDEFS(short, short) MKV_PACKED_TYPEDEFS(short, short)
MKV_VEC_TYPEDEFS(ushort, ushort) MKV_PACKED_TYPEDEFS(ushort, ushort)
MKV_VEC_TYPEDEFS(char, char) MKV_PACKED_TYPEDEFS(char, char)
MKV_VEC_TYPEDEFS(uchar, uchar) MKV_PACKED_TYPEDEFS(uchar, uchar)
MKV_VEC_TYPEDEFS(long, long)
MKV_VEC_TYPEDEFS(ulong, ulong)
MKV_VEC_TYPEDEFS(bool, bool)
#undef MKV_PACKED_TYPEDEFS
#undef MKV_VEC_TYPEDEFS

static_assert(sizeof(float2) == 8 && alignof(float2) == 8, "Metal layout");
static_assert(sizeof(float3) == 16 && alignof(float3) == 16, "Metal layout: 3-vectors padded to 4");
static_assert(sizeof(float4) == 16 && alignof(float4) == 16, "Metal layout");
static_assert(sizeof(half3) == 8 && sizeof(half4) == 8 && alignof(half4) == 8, "Metal layout");
static_assert(sizeof(uchar3) == 4 && sizeof(bool4) == 4, "Metal layout");
static_assert(sizeof(packed_float3) == 12 && alignof(packed_float3) == 4, "Metal layout");
static_assert(std::is_trivially_default_constructible<float4>::value &&
                  std::is_trivially_copy_constructible<float4>::value &&
                  std::is_trivially_destructible<float4>::value,
              "vectors must pass in registers and live in threadgroup arrays");

// as_type<T>(x): reinterpret the bits of a same-size value (float <-> uint,
// half2 <-> uint, float4 <-> uint4). A swizzle reinterprets the vector it
// names, not its owner's storage.
template <class To, class From> inline To as_type(const From& from) {
  using Src = std::conditional_t<mkv_detail::is_vec_like_v<From>,
                                 vec<typename mkv_detail::vec_traits<From>::elem, mkv_detail::vec_traits<From>::size>,
                                 From>;
  static_assert(mkv_detail::is_operand_v<To>, "as_type: target must be a scalar or vector");
  static_assert(sizeof(To) == sizeof(Src), "MSL as_type: source and target must have the same size");
  const Src src = from;
  To to;
  __builtin_memcpy(static_cast<void*>(&to), static_cast<const void*>(&src), sizeof(To));
  return to;
}

}  // namespace metal

// Global names, so MSL code may omit `metal::` (it usually also says `using
// namespace metal;`; both routes name the same type, so no ambiguity).
#define MKV_EXPORT_VEC(name) using metal::name##2; using metal::name##3; using metal::name##4;
#define MKV_EXPORT_PACKED(name) \
  using metal::packed_##name##2; using metal::packed_##name##3; using metal::packed_##name##4;
MKV_EXPORT_VEC(float) MKV_EXPORT_PACKED(float)
MKV_EXPORT_VEC(half) MKV_EXPORT_PACKED(half)
MKV_EXPORT_VEC(int) MKV_EXPORT_PACKED(int)
MKV_EXPORT_VEC(uint) MKV_EXPORT_PACKED(uint)
MKV_EXPORT_VEC(short) MKV_EXPORT_PACKED(short)
MKV_EXPORT_VEC(ushort) MKV_EXPORT_PACKED(ushort)
MKV_EXPORT_VEC(char) MKV_EXPORT_PACKED(char)
MKV_EXPORT_VEC(uchar) MKV_EXPORT_PACKED(uchar)
MKV_EXPORT_VEC(long)
MKV_EXPORT_VEC(ulong)
MKV_EXPORT_VEC(bool)
#undef MKV_EXPORT_PACKED
#undef MKV_EXPORT_VEC

#include "mkv_prelude_vec_ops.h"
