// CUDA prelude, part 1: MSL scalar and vector types for nvcc.
//
// The same types and layout as the host prelude (cpp/gpu/host/prelude/
// mkv_prelude_types.h), so structs shared with the GPU have the same size:
//   vec<T,2>: size = align = 2*sizeof(T); vec<T,3>, vec<T,4>: 4*sizeof(T);
//   packed_vec<T,N>: N elements, align = alignof(T).
// Swizzles (v.zyx, v.xy = ...) are proxy members in a union with the elements,
// the same set as the host's (every name of 2..4 components, xyzw and rgba
// spellings), generated here by the preprocessor (MKV_SWIZZLES).
//
// What differs from the host, and why:
//   * half is CUDA's __half. Its operators (defined here, cuda_fp16's own are
//     off) round every operation to half with the _rn intrinsics, which the
//     compiler never contracts into an fma: x * y + x rounds twice, as in numpy
//     and on the host. half mixed with float computes in float, as in MSL.
//   * Whole-vector memory access. MSL code converts or combines vectors that are
//     still in memory (float4(*(device half4*)p)); reading those element by
//     element through the reference compiles to one 16-bit load per half
//     (LDG.E.U16 x4) where Metal loads the vector once. Conversions, operators,
//     dot and copy assignment therefore copy a 4-, 8- or 16-byte vector through
//     one integer of its size (mkv_detail::whole): one LDG.64 / LDG.128 / STS.64.
//
// The parts that are the same logic as the host prelude's are in
// cpp/gpu/prelude_common/ (mkv_common_types.h, mkv_common_packed_vec.h, mkv_common_vec_names.h).
#pragma once

#define MKV_HD __host__ __device__ __forceinline__
#define MKV_D __device__ __forceinline__

// Qualifiers of the shared headers (cpp/gpu/prelude_common/).
#define MKV_FN MKV_HD
#define MKV_FN_DEVICE MKV_D

// ---- Scalars -------------------------------------------------------------------
typedef __half half;
#include "../../prelude_common/mkv_common_types.h"  // uint ..., namespace metal, vec_traits, swz

// half arithmetic. __half is a global class, so its operators are global too.
MKV_HD half operator+(half a, half b) { return __hadd_rn(a, b); }
MKV_HD half operator-(half a, half b) { return __hsub_rn(a, b); }
MKV_HD half operator*(half a, half b) { return __hmul_rn(a, b); }
// float's division is correctly rounded, and rounding that to half is too
// (24 >= 2 * 11 + 2 bits), so this is the correctly rounded half quotient.
MKV_HD half operator/(half a, half b) { return __float2half_rn(__half2float(a) / __half2float(b)); }
MKV_HD half operator-(half a) { return __hneg(a); }
MKV_HD half operator+(half a) { return a; }
MKV_HD half& operator+=(half& a, half b) { return a = a + b; }
MKV_HD half& operator-=(half& a, half b) { return a = a - b; }
MKV_HD half& operator*=(half& a, half b) { return a = a * b; }
MKV_HD half& operator/=(half& a, half b) { return a = a / b; }
MKV_HD half& operator++(half& a) { return a = a + half(1.0f); }
MKV_HD half& operator--(half& a) { return a = a - half(1.0f); }
MKV_HD half operator++(half& a, int) { const half old = a; ++a; return old; }
MKV_HD half operator--(half& a, int) { const half old = a; --a; return old; }
MKV_HD bool operator==(half a, half b) { return __heq(a, b); }
MKV_HD bool operator!=(half a, half b) { return __hneu(a, b); }  // true for NaN, as for float
MKV_HD bool operator<(half a, half b) { return __hlt(a, b); }
MKV_HD bool operator>(half a, half b) { return __hgt(a, b); }
MKV_HD bool operator<=(half a, half b) { return __hle(a, b); }
MKV_HD bool operator>=(half a, half b) { return __hge(a, b); }
// Mixed with float: float (MSL's usual arithmetic conversions); with an
// integer: half. Without these, h * 2.0f would be ambiguous (half has
// conversions both ways).
#define MKV_HALF_MIXED(op)                                                                    \
  MKV_HD float operator op(half a, float b) { return __half2float(a) op b; }                  \
  MKV_HD float operator op(float a, half b) { return a op __half2float(b); }                  \
  template <class I, std::enable_if_t<std::is_integral<I>::value, int> = 0>                  \
  MKV_HD half operator op(half a, I b) { return a op half(b); }                               \
  template <class I, std::enable_if_t<std::is_integral<I>::value, int> = 0>                  \
  MKV_HD half operator op(I a, half b) { return half(a) op b; }
MKV_HALF_MIXED(+) MKV_HALF_MIXED(-) MKV_HALF_MIXED(*) MKV_HALF_MIXED(/)
#undef MKV_HALF_MIXED
#define MKV_HALF_MIXED_CMP(op)                                                                \
  MKV_HD bool operator op(half a, float b) { return __half2float(a) op b; }                   \
  MKV_HD bool operator op(float a, half b) { return a op __half2float(b); }                   \
  template <class I, std::enable_if_t<std::is_integral<I>::value, int> = 0>                  \
  MKV_HD bool operator op(half a, I b) { return __half2float(a) op static_cast<float>(b); }   \
  template <class I, std::enable_if_t<std::is_integral<I>::value, int> = 0>                  \
  MKV_HD bool operator op(I a, half b) { return static_cast<float>(a) op __half2float(b); }
MKV_HALF_MIXED_CMP(==) MKV_HALF_MIXED_CMP(!=) MKV_HALF_MIXED_CMP(<) MKV_HALF_MIXED_CMP(>)
MKV_HALF_MIXED_CMP(<=) MKV_HALF_MIXED_CMP(>=)
#undef MKV_HALF_MIXED_CMP

// MSL half literals: 1.0h, 0.5h. Suffixes without '_' are reserved for the
// standard library, hence the silenced warnings (EDG's and the host compiler's).
// A floating literal operator takes long double, which device code treats as
// double (warning 20208 at every 1.0h); MSL has no long double, so the warning
// is off for the whole translation unit.
#pragma nv_diag_suppress 20208
#pragma nv_diag_suppress 2506  // a user-provided literal suffix must begin with "_"
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wliteral-suffix"
MKV_HD half operator"" h(long double v) { return __double2half(static_cast<double>(v)); }
MKV_HD half operator"" h(unsigned long long v) { return __float2half_rn(static_cast<float>(v)); }
#pragma GCC diagnostic pop
#pragma nv_diag_default 2506

namespace metal {
namespace mkv_detail {

// Copy of a 4-, 8- or 16-byte object through one integer (or CUDA's 16-byte
// ulonglong2) of its size: one memory instruction where an element-wise copy
// would take N. (uint4/uint2 are our own names here, see metal_stdlib.)
// Typed loads and stores only: a memcpy through void* loses the alignment and
// nvcc then copies byte by byte.
template <class W, class V> MKV_HD V whole_as(const V& v) {
  V o;
  *reinterpret_cast<W*>(&o) = *reinterpret_cast<const W*>(&v);
  return o;
}
template <class V> MKV_HD V whole(const V& v) {
  if constexpr (sizeof(V) == 16 && alignof(V) >= 16) {
    return whole_as<::ulonglong2>(v);
  } else if constexpr (sizeof(V) == 8 && alignof(V) >= 8) {
    return whole_as<unsigned long long>(v);
  } else if constexpr (sizeof(V) == 4 && alignof(V) >= 4) {
    return whole_as<unsigned>(v);
  } else {
    return v;
  }
}
template <class V> MKV_HD void assign_whole(V& dst, const V& src) {
  if constexpr (sizeof(V) == 16 && alignof(V) >= 16) {
    *reinterpret_cast<::ulonglong2*>(&dst) = *reinterpret_cast<const ::ulonglong2*>(&src);
  } else if constexpr (sizeof(V) == 8 && alignof(V) >= 8) {
    *reinterpret_cast<unsigned long long*>(&dst) = *reinterpret_cast<const unsigned long long*>(&src);
  } else if constexpr (sizeof(V) == 4 && alignof(V) >= 4) {
    *reinterpret_cast<unsigned*>(&dst) = *reinterpret_cast<const unsigned*>(&src);
  } else {
    for (int i = 0; i < V::kStorage; ++i) dst.data_[i] = src.data_[i];
  }
}

// The swizzle members of an N-vector, `swz<T, kStorage, i...> xyz, rgb;` for
// every name of 2..4 components (the host prelude's gen_swizzles.py writes the
// same list). MKV_EACHk_N(M, args...) calls M(args..., i, x, r) for each
// component i < N; there are four copies because a macro cannot expand itself.
#define MKV_EACH1_2(M, ...) M(__VA_ARGS__, 0, x, r) M(__VA_ARGS__, 1, y, g)
#define MKV_EACH1_3(M, ...) MKV_EACH1_2(M, __VA_ARGS__) M(__VA_ARGS__, 2, z, b)
#define MKV_EACH1_4(M, ...) MKV_EACH1_3(M, __VA_ARGS__) M(__VA_ARGS__, 3, w, a)
#define MKV_EACH2_2(M, ...) M(__VA_ARGS__, 0, x, r) M(__VA_ARGS__, 1, y, g)
#define MKV_EACH2_3(M, ...) MKV_EACH2_2(M, __VA_ARGS__) M(__VA_ARGS__, 2, z, b)
#define MKV_EACH2_4(M, ...) MKV_EACH2_3(M, __VA_ARGS__) M(__VA_ARGS__, 3, w, a)
#define MKV_EACH3_2(M, ...) M(__VA_ARGS__, 0, x, r) M(__VA_ARGS__, 1, y, g)
#define MKV_EACH3_3(M, ...) MKV_EACH3_2(M, __VA_ARGS__) M(__VA_ARGS__, 2, z, b)
#define MKV_EACH3_4(M, ...) MKV_EACH3_3(M, __VA_ARGS__) M(__VA_ARGS__, 3, w, a)
#define MKV_EACH4_2(M, ...) M(__VA_ARGS__, 0, x, r) M(__VA_ARGS__, 1, y, g)
#define MKV_EACH4_3(M, ...) MKV_EACH4_2(M, __VA_ARGS__) M(__VA_ARGS__, 2, z, b)
#define MKV_EACH4_4(M, ...) MKV_EACH4_3(M, __VA_ARGS__) M(__VA_ARGS__, 3, w, a)
#define MKV_SWZ2(N, i, a, A, j, b, B) swz<T, kStorage, i, j> a##b, A##B;
#define MKV_SWZ2_1(N, i, a, A) MKV_EACH2_##N(MKV_SWZ2, N, i, a, A)
#define MKV_SWZ3(N, i, a, A, j, b, B, k, c, C) swz<T, kStorage, i, j, k> a##b##c, A##B##C;
#define MKV_SWZ3_2(N, i, a, A, j, b, B) MKV_EACH3_##N(MKV_SWZ3, N, i, a, A, j, b, B)
#define MKV_SWZ3_1(N, i, a, A) MKV_EACH2_##N(MKV_SWZ3_2, N, i, a, A)
#define MKV_SWZ4(N, i, a, A, j, b, B, k, c, C, l, d, D) swz<T, kStorage, i, j, k, l> a##b##c##d, A##B##C##D;
#define MKV_SWZ4_3(N, i, a, A, j, b, B, k, c, C) MKV_EACH4_##N(MKV_SWZ4, N, i, a, A, j, b, B, k, c, C)
#define MKV_SWZ4_2(N, i, a, A, j, b, B) MKV_EACH3_##N(MKV_SWZ4_3, N, i, a, A, j, b, B)
#define MKV_SWZ4_1(N, i, a, A) MKV_EACH2_##N(MKV_SWZ4_2, N, i, a, A)
#define MKV_SWIZZLES(N) MKV_EACH1_##N(MKV_SWZ2_1, N) MKV_EACH1_##N(MKV_SWZ3_1, N) MKV_EACH1_##N(MKV_SWZ4_1, N)

// Storage of vec<T,N>: the element array, the named members (.x/.r ...) and
// every swizzle proxy in one anonymous union, all at offset 0.
template <class T, int N> struct vec_storage;
template <class T> struct alignas(2 * sizeof(T)) vec_storage<T, 2> {
  static constexpr int kStorage = 2;
  union {
    T data_[2];
    struct { T x, y; };
    struct { T r, g; };
    MKV_SWIZZLES(2)
  };
};
template <class T> struct alignas(4 * sizeof(T)) vec_storage<T, 3> {
  static constexpr int kStorage = 4;  // Metal pads 3-vectors to 4 elements
  union {
    T data_[4];
    struct { T x, y, z; };
    struct { T r, g, b; };
    MKV_SWIZZLES(3)
  };
};
template <class T> struct alignas(4 * sizeof(T)) vec_storage<T, 4> {
  static constexpr int kStorage = 4;
  union {
    T data_[4];
    struct { T x, y, z, w; };
    struct { T r, g, b, a; };
    MKV_SWIZZLES(4)
  };
};

// An operand as a value: vectors read whole, proxies and packed vectors
// converted, scalars as they are.
template <class X> struct is_vec_type : std::false_type {};
template <class T, int N> struct is_vec_type<vec<T, N>> : std::true_type {};
template <class X> MKV_HD auto value(const X& x) {
  if constexpr (is_vec_type<X>::value) {
    return whole(x);
  } else if constexpr (is_vec_like_v<X>) {
    return vec<typename vec_traits<X>::elem, vec_traits<X>::size>(x);
  } else {
    return x;
  }
}

}  // namespace mkv_detail

// MSL vector. The copy constructor and destructor are trivial (registers,
// __shared__ arrays without construction); the copy assignment is
// user-provided (the swizzle proxies delete the union's) and copies whole.
template <class T, int N> struct vec : mkv_detail::vec_storage<T, N> {
  static_assert(N >= 2 && N <= 4, "MSL vectors have 2, 3 or 4 components");
  static_assert(mkv_detail::is_scalar_v<T>, "vector element must be a scalar type");
  using base = mkv_detail::vec_storage<T, N>;
  using base::data_;
  using base::kStorage;
  using value_type = T;

  vec() = default;  // uninitialized, like MSL
  vec(const vec&) = default;
  MKV_HD vec& operator=(const vec& o) {
    mkv_detail::assign_whole(*this, o);
    return *this;
  }

  // Broadcast, implicit so `float4 v = 0.0f;` works as in MSL.
  template <class S, std::enable_if_t<mkv_detail::is_scalar_v<S>, int> = 0>
  MKV_HD vec(S s) {
    for (int i = 0; i < N; ++i) data_[i] = static_cast<T>(s);
  }

  // Concatenation: float4(a, b, c, d), float4(float2, float, float), float4(float3, float) ...
  template <class A0, class A1, class... As,
            std::enable_if_t<mkv_detail::lanes_v<A0> + mkv_detail::lanes_v<A1> +
                                     (0 + ... + mkv_detail::lanes_v<As>) == N,
                             int> = 0>
  MKV_HD vec(const A0& a0, const A1& a1, const As&... as) {
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
  MKV_HD explicit vec(const V& v0) {
    const auto v = mkv_detail::value(v0);
    for (int i = 0; i < N; ++i) data_[i] = static_cast<T>(v[i]);
  }

  MKV_HD T& operator[](int i) { return data_[i]; }
  MKV_HD const T& operator[](int i) const { return data_[i]; }

 private:
  template <class X> MKV_HD void put(int& k, const X& x) {
    if constexpr (mkv_detail::is_vec_like_v<X>) {
      static_assert(std::is_same<typename mkv_detail::vec_traits<X>::elem, T>::value,
                    "MSL: vector constructor arguments must have the same element type; convert explicitly");
      const auto v = mkv_detail::value(x);
      for (int i = 0; i < mkv_detail::vec_traits<X>::size; ++i) data_[k++] = v[i];
    } else {
      data_[k++] = static_cast<T>(x);
    }
  }
};
}  // namespace metal

#include "../../prelude_common/mkv_common_packed_vec.h"

// The vector types are named mkv_float4 ...: CUDA's own float4, uint3 ... are
// global structs that CUDA's generated host code names unqualified, so a
// metal::uint3 would be ambiguous there after `using namespace metal;`.
// metal_stdlib defines each MSL name as a macro for ours (float4 -> mkv_float4),
// which the shared names header below goes through. charN holds `signed char`
// (MSL char is signed), since nvcc's device char follows the host's, which is
// unsigned on arm64.
#define MKV_CHAR signed char
#include "../../prelude_common/mkv_common_vec_names.h"  // mkv_float4 ..., packed_float4 ..., Metal's layout
#undef MKV_CHAR

namespace metal {

// as_type<T>(x): the bits of a same-size value (float <-> uint, half2 <-> uint).
template <class To, class From> MKV_HD To as_type(const From& from) {
  using Src = std::conditional_t<mkv_detail::is_vec_like_v<From>,
                                 vec<typename mkv_detail::vec_traits<From>::elem, mkv_detail::vec_traits<From>::size>,
                                 From>;
  static_assert(mkv_detail::is_operand_v<To>, "as_type: target must be a scalar or vector");
  static_assert(sizeof(To) == sizeof(Src), "MSL as_type: source and target must have the same size");
  const Src src = mkv_detail::value(from);
  To to;
  memcpy(static_cast<void*>(&to), static_cast<const void*>(&src), sizeof(To));
  return to;
}

}  // namespace metal
