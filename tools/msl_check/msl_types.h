// MSL check prelude, part 1: scalar, vector, bool-vector and packed types, the
// lane-counting vector constructors, type traits, numeric limits, constants.
//
// Compiled only by clang in C++-for-OpenCL mode (tools/check_msl.py), never by
// the engine. Vectors are clang ext_vector types, so swizzles (v.xy, v.wzyx,
// s.zx = v.yy), v[i], vector-scalar arithmetic and the ban on implicit
// conversions between vector types are clang's own, as in Apple's compiler.
#pragma once

// ---- Scalars: MSL's sizes (long is 64-bit; char is signed) -----------------
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
typedef char int8_t;
typedef uchar uint8_t;
typedef short int16_t;
typedef ushort uint16_t;
typedef int int32_t;
typedef uint uint32_t;
typedef long int64_t;
typedef ulong uint64_t;
typedef ulong size_t;
typedef long ptrdiff_t;
typedef long intptr_t;
typedef ulong uintptr_t;

namespace __msl {  // the prelude's own helpers; a reserved name no kernel uses

template <bool B, class T = void> struct enable_if {};
template <class T> struct enable_if<true, T> { typedef T type; };
template <class T> struct identity { typedef T type; };
template <class A, class B> struct same { enum { value = 0 }; };
template <class A> struct same<A, A> { enum { value = 1 }; };

// Scalar kinds. Deduced template arguments never carry an address space
// (clang drops it for by-value parameters), so these see plain types.
template <class T> struct scalar { enum { is_int = 0, is_fp = 0, is_bool = 0, is_signed = 0 }; };
#define __MSL_INT(T, S) template <> struct scalar<T> { enum { is_int = 1, is_fp = 0, is_bool = 0, is_signed = S }; };
__MSL_INT(char, 1)
__MSL_INT(signed char, 1)
__MSL_INT(uchar, 0)
__MSL_INT(short, 1)
__MSL_INT(ushort, 0)
__MSL_INT(int, 1)
__MSL_INT(uint, 0)
__MSL_INT(long, 1)
__MSL_INT(ulong, 0)
#undef __MSL_INT
template <> struct scalar<half> { enum { is_int = 0, is_fp = 1, is_bool = 0, is_signed = 1 }; };
template <> struct scalar<float> { enum { is_int = 0, is_fp = 1, is_bool = 0, is_signed = 1 }; };
template <> struct scalar<bool> { enum { is_int = 0, is_fp = 0, is_bool = 1, is_signed = 0 }; };

// Vector shape of T: lanes (0 for a scalar or anything else) and element type.
template <class T> struct vec { enum { lanes = 0 }; typedef T elem; };
template <class T, int N> struct vec<T __attribute__((ext_vector_type(N)))> {
  enum { lanes = N };
  typedef T elem;
};

// Argument categories of the MSL library functions: a scalar or a vector
// (2, 3 or 4 lanes) of the given element kind.
template <class T> struct kind {
  typedef typename vec<T>::elem E;
  enum {
    fp = scalar<E>::is_fp,
    integer = scalar<E>::is_int,
    arith = scalar<E>::is_fp || scalar<E>::is_int,
    fp_vector = vec<T>::lanes > 1 && scalar<E>::is_fp,
  };
};

template <class T, int N> struct make_vec { typedef T type __attribute__((ext_vector_type(N))); };
template <class T> struct make_vec<T, 1> { typedef T type; };

}  // namespace __msl

// ---- Vectors (2, 3, 4 lanes; a 3-vector is padded to 4, as in MSL) --------
#define __MSL_VECTORS(T)                                    \
  typedef T T##2 __attribute__((ext_vector_type(2)));       \
  typedef T T##3 __attribute__((ext_vector_type(3)));       \
  typedef T T##4 __attribute__((ext_vector_type(4)));       \
  typedef T packed_##T##2 __attribute__((ext_vector_type(2), aligned(sizeof(T)))); \
  typedef T packed_##T##4 __attribute__((ext_vector_type(4), aligned(sizeof(T))));
__MSL_VECTORS(char)
__MSL_VECTORS(uchar)
__MSL_VECTORS(short)
__MSL_VECTORS(ushort)
__MSL_VECTORS(int)
__MSL_VECTORS(uint)
__MSL_VECTORS(long)
__MSL_VECTORS(ulong)
__MSL_VECTORS(half)
__MSL_VECTORS(float)
#undef __MSL_VECTORS

// Packed 3-vectors: 3 elements with no padding (packed_float3 is 12 bytes).
// A packed 2- or 4-vector above is the vector type itself with the element's
// alignment, which has MSL's size and alignment.
#define __MSL_PACKED3(T)                                                     \
  struct packed_##T##3 {                                                     \
    T x, y, z;                                                               \
    packed_##T##3() = default;                                               \
    constexpr packed_##T##3(T a, T b, T c) : x(a), y(b), z(c) {}             \
    packed_##T##3(T##3 v);                                                   \
    operator T##3() const;                                                   \
    operator T##3() const __constant;                                        \
    T operator[](int i) const;                                               \
    T operator[](int i) const __constant;                                    \
  };
__MSL_PACKED3(char)
__MSL_PACKED3(uchar)
__MSL_PACKED3(short)
__MSL_PACKED3(ushort)
__MSL_PACKED3(int)
__MSL_PACKED3(uint)
__MSL_PACKED3(half)
__MSL_PACKED3(float)
#undef __MSL_PACKED3

// ---- Bool vectors ----------------------------------------------------------
// clang's OpenCL mode has no bool ext_vector, so boolN is a small class with
// MSL's size. Comparisons of vectors (v > 0.5f) give clang's integer lane
// masks, which convert to boolN; lanes are read as b.x .. b.w.
namespace __msl {
template <class M, int N>
using lane_mask = typename enable_if<vec<M>::lanes == N && scalar<typename vec<M>::elem>::is_int, int>::type;
}
struct alignas(2) bool2 {
  bool x, y;
  constexpr bool2() : x(), y() {}
  constexpr bool2(bool v) : x(v), y(v) {}
  constexpr bool2(bool a, bool b) : x(a), y(b) {}
  template <class M, __msl::lane_mask<M, 2> = 0> bool2(M mask);
};
struct alignas(4) bool3 {
  bool x, y, z;
  constexpr bool3() : x(), y(), z() {}
  constexpr bool3(bool v) : x(v), y(v), z(v) {}
  constexpr bool3(bool a, bool b, bool c) : x(a), y(b), z(c) {}
  template <class M, __msl::lane_mask<M, 3> = 0> bool3(M mask);
};
struct alignas(4) bool4 {
  bool x, y, z, w;
  constexpr bool4() : x(), y(), z(), w() {}
  constexpr bool4(bool v) : x(v), y(v), z(v), w(v) {}
  constexpr bool4(bool a, bool b, bool c, bool d) : x(a), y(b), z(c), w(d) {}
  template <class M, __msl::lane_mask<M, 4> = 0> bool4(M mask);
};
static_assert(sizeof(bool2) == 2 && sizeof(bool3) == 4 && sizeof(bool4) == 4, "MSL bool vector sizes");

namespace __msl {
template <int N> struct bool_vec;
template <> struct bool_vec<1> { typedef bool type; };
template <> struct bool_vec<2> { typedef bool2 type; };
template <> struct bool_vec<3> { typedef bool3 type; };
template <> struct bool_vec<4> { typedef bool4 type; };
// The boolN matching T's lanes (bool for a scalar): select's mask, isnan's result.
template <class T> using bool_of = typename bool_vec<(vec<T>::lanes > 0 ? vec<T>::lanes : 1)>::type;
}  // namespace __msl

// ---- Vector constructors that count lanes ----------------------------------
// float4(...) is spelled through a function-like macro (defined at the end of
// metal_stdlib, after this file), so `float4 v` stays the type while
// `float4(a, b)` becomes __msl_vector<float4>(a, b): zero arguments; one
// scalar (splat); one vector with the same lane count (conversion); or
// scalars and vectors whose lanes add up to exactly N. float4(float3) and
// float4(float3, float2) do not compile, as in MSL.
namespace __msl {
template <class A> struct arg_lanes {  // lanes an argument contributes; -64 if it cannot be one
  enum { value = kind<A>::arith ? (vec<A>::lanes ? vec<A>::lanes : 1) : -64 };
};
template <class V, class... A> struct lanes_add_up {
  enum {
    n = vec<V>::lanes,
    value = sizeof...(A) == 0 ||
            (sizeof...(A) == 1 && (... && (arg_lanes<A>::value == 1 || arg_lanes<A>::value == n))) ||
            (sizeof...(A) > 1 && (... && (arg_lanes<A>::value > 0)) && (0 + ... + arg_lanes<A>::value) == n),
  };
};

// A constant-expression body (clang cannot read vector lanes in constant
// evaluation, so lanes are moved with __builtin_shufflevector): a program-scope
// `constant float4 k = float4(...)` needs one.
template <class E> using vec4 = typename make_vec<E, 4>::type;
template <class E, class A> constexpr vec4<E> widen(A a) {  // a's lanes first, then filler
  if constexpr (vec<A>::lanes == 0) {
    return (vec4<E>)(E)a;
  } else {
    typedef typename make_vec<E, vec<A>::lanes>::type C;
    const C c = __builtin_convertvector(a, C);
    if constexpr (vec<A>::lanes == 2) return __builtin_shufflevector(c, c, 0, 1, 0, 1);
    else if constexpr (vec<A>::lanes == 3) return __builtin_shufflevector(c, c, 0, 1, 2, 0);
    else return c;
  }
}
template <int O, int L, class E4> constexpr E4 place(E4 acc, E4 w) {  // lanes O .. O+L-1 of acc := w[0 .. L-1]
  return __builtin_shufflevector(acc, w, (0 >= O && 0 < O + L) ? 4 + 0 - O : 0, (1 >= O && 1 < O + L) ? 4 + 1 - O : 1,
                                 (2 >= O && 2 < O + L) ? 4 + 2 - O : 2, (3 >= O && 3 < O + L) ? 4 + 3 - O : 3);
}
template <int O, class E4> constexpr E4 fill(E4 acc) { return acc; }
template <int O, class E4, class A0, class... R> constexpr E4 fill(E4 acc, A0 a0, R... rest) {
  constexpr int L = arg_lanes<A0>::value;
  return fill<O + L>(place<O, L>(acc, widen<typename vec<E4>::elem>(a0)), rest...);
}
template <class V, class E4> constexpr V narrow(E4 v) {
  if constexpr (vec<V>::lanes == 2) return __builtin_shufflevector(v, v, 0, 1);
  else if constexpr (vec<V>::lanes == 3) return __builtin_shufflevector(v, v, 0, 1, 2);
  else return v;
}
}  // namespace __msl

namespace __msl {
template <class V> constexpr V build() { return (V)(typename vec<V>::elem)0; }
template <class V, class A> constexpr V build(A a) {
  if constexpr (vec<A>::lanes == 0) return (V)(typename vec<V>::elem)a;  // splat
  else return __builtin_convertvector(a, V);
}
template <class V, class A0, class A1, class... R> constexpr V build(A0 a0, A1 a1, R... rest) {
  typedef typename vec<V>::elem E;
  return narrow<V>(fill<0>(vec4<E>((E)0), a0, a1, rest...));
}
}  // namespace __msl

template <class V, class... A, typename __msl::enable_if<__msl::lanes_add_up<V, A...>::value, int>::type = 0>
constexpr V __msl_vector(A... a) {
  return __msl::build<V>(a...);
}

namespace metal {
using ::__msl_vector;  // metal::float4(x) expands to metal::__msl_vector<float4>(x)
template <class T, int N> using vec = T __attribute__((ext_vector_type(N)));
}  // namespace metal

// ---- Type traits (metal_type_traits), the common subset --------------------
namespace metal {
template <bool B, class T = void> using enable_if = __msl::enable_if<B, T>;
template <bool B, class T = void> using enable_if_t = typename __msl::enable_if<B, T>::type;
template <class A, class B> struct is_same { static constexpr __constant bool value = __msl::same<A, B>::value; };
template <class A, class B> __constant constexpr bool is_same_v = __msl::same<A, B>::value;
template <bool B, class T, class F> struct conditional { typedef T type; };
template <class T, class F> struct conditional<false, T, F> { typedef F type; };
template <bool B, class T, class F> using conditional_t = typename conditional<B, T, F>::type;
template <class T> struct is_floating_point { static constexpr __constant bool value = __msl::scalar<T>::is_fp; };
template <class T> __constant constexpr bool is_floating_point_v = __msl::scalar<T>::is_fp;
template <class T> struct is_integral {
  static constexpr __constant bool value = __msl::scalar<T>::is_int || __msl::scalar<T>::is_bool;
};
template <class T> __constant constexpr bool is_integral_v = is_integral<T>::value;
template <class T> struct is_arithmetic {
  static constexpr __constant bool value = __msl::scalar<T>::is_fp || is_integral<T>::value;
};
template <class T> __constant constexpr bool is_arithmetic_v = is_arithmetic<T>::value;
template <class T> struct is_signed { static constexpr __constant bool value = __msl::scalar<T>::is_signed; };
template <class T> __constant constexpr bool is_signed_v = is_signed<T>::value;
template <class T> struct is_unsigned {
  static constexpr __constant bool value = __msl::scalar<T>::is_int && !__msl::scalar<T>::is_signed;
};
template <class T> __constant constexpr bool is_unsigned_v = is_unsigned<T>::value;
template <class T> struct is_vector { static constexpr __constant bool value = __msl::vec<T>::lanes > 0; };
template <class T> __constant constexpr bool is_vector_v = is_vector<T>::value;
template <class T> struct vec_elements { static constexpr __constant int value = __msl::vec<T>::lanes; };
}  // namespace metal

// ---- Numeric limits (metal_limits) and constants (metal_math) --------------
namespace metal {
template <class T> struct numeric_limits;
#define __MSL_LIMITS(T, LO, HI, LOWEST, EPS, INF)                     \
  template <> struct numeric_limits<T> {                              \
    static constexpr __constant bool is_specialized = true;          \
    static constexpr T min() { return LO; }                          \
    static constexpr T max() { return HI; }                          \
    static constexpr T lowest() { return LOWEST; }                   \
    static constexpr T epsilon() { return EPS; }                     \
    static constexpr T infinity() { return INF; }                    \
    static constexpr T quiet_NaN() { return INF; }                   \
  };
__MSL_LIMITS(float, 0x1p-126f, 0x1.fffffep127f, -0x1.fffffep127f, 0x1p-23f, __builtin_inff())
__MSL_LIMITS(half, (half)0x1p-14f, (half)65504.0f, (half)-65504.0f, (half)0x1p-10f, (half)__builtin_inff())
__MSL_LIMITS(char, (char)-128, (char)127, (char)-128, (char)0, (char)0)
__MSL_LIMITS(uchar, (uchar)0, (uchar)255, (uchar)0, (uchar)0, (uchar)0)
__MSL_LIMITS(short, (short)-32768, (short)32767, (short)-32768, (short)0, (short)0)
__MSL_LIMITS(ushort, (ushort)0, (ushort)65535, (ushort)0, (ushort)0, (ushort)0)
__MSL_LIMITS(int, -2147483647 - 1, 2147483647, -2147483647 - 1, 0, 0)
__MSL_LIMITS(uint, 0u, 4294967295u, 0u, 0u, 0u)
__MSL_LIMITS(long, -9223372036854775807L - 1, 9223372036854775807L, -9223372036854775807L - 1, 0L, 0L)
__MSL_LIMITS(ulong, 0ul, 18446744073709551615ul, 0ul, 0ul, 0ul)
#undef __MSL_LIMITS
}  // namespace metal

#define INFINITY __builtin_inff()
#define NAN __builtin_nanf("")
#define HUGE_VALF __builtin_huge_valf()
#define HUGE_VALH ((half)__builtin_huge_valf())
#define MAXFLOAT 0x1.fffffep127f
#define FLT_MAX 0x1.fffffep127f
#define FLT_MIN 0x1p-126f
#define FLT_EPSILON 0x1p-23f
#define HALF_MAX ((half)65504.0f)
#define HALF_MIN ((half)0x1p-14f)
#define HALF_EPSILON ((half)0x1p-10f)
#define CHAR_BIT 8
#define SCHAR_MAX 127
#define SCHAR_MIN (-128)
#define UCHAR_MAX 255
#define SHRT_MAX 32767
#define SHRT_MIN (-32768)
#define USHRT_MAX 65535
#define INT_MAX 2147483647
#define INT_MIN (-2147483647 - 1)
#define UINT_MAX 4294967295u
#define LONG_MAX 9223372036854775807L
#define LONG_MIN (-9223372036854775807L - 1)
#define ULONG_MAX 18446744073709551615ul
#define M_E_F 2.71828182845904523536f
#define M_LOG2E_F 1.44269504088896340736f
#define M_LOG10E_F 0.434294481903251827651f
#define M_LN2_F 0.693147180559945309417f
#define M_LN10_F 2.30258509299404568402f
#define M_PI_F 3.14159265358979323846f
#define M_PI_2_F 1.57079632679489661923f
#define M_PI_4_F 0.785398163397448309616f
#define M_1_PI_F 0.318309886183790671538f
#define M_2_PI_F 0.636619772367581343076f
#define M_2_SQRTPI_F 1.12837916709551257390f
#define M_SQRT2_F 1.41421356237309504880f
#define M_SQRT1_2_F 0.707106781186547524401f
