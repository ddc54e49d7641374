// MSL check prelude, part 2: math, common, integer, geometric and relational
// functions, as_type and select, in namespace metal (and metal::fast,
// metal::precise). Declarations only: the check is -fsyntax-only.
//
// Every function is a template whose arguments must all deduce to one type T,
// so min(uint, int), max(float, 0) or pow(float4, float) do not compile, as
// in Apple's library, which has no mixed-type overloads. T is constrained to
// the element kinds MSL allows: exp(int) or simd_sum(bool) do not compile.
#pragma once

#define __MSL_IF(cond, R) typename __msl::enable_if<(cond), R>::type
#define __MSL_FP(T) (__msl::kind<T>::fp)
#define __MSL_INT(T) (__msl::kind<T>::integer)
#define __MSL_ARITH(T) (__msl::kind<T>::arith)
#define __MSL_FPVEC(T) (__msl::kind<T>::fp_vector)

namespace __msl {
template <class T> using elem_of = typename vec<T>::elem;
// intN with T's lane count (ldexp's exponent, frexp's).
template <class T> using int_of = typename make_vec<int, (vec<T>::lanes ? vec<T>::lanes : 1)>::type;
}  // namespace __msl

// ---- float and half (scalars and vectors) ----------------------------------
#define __MSL_MATH1(f) template <class T> __MSL_IF(__MSL_FP(T), T) f(T x);
#define __MSL_MATH2(f) template <class T> __MSL_IF(__MSL_FP(T), T) f(T x, T y);
#define __MSL_MATH3(f) template <class T> __MSL_IF(__MSL_FP(T), T) f(T x, T y, T z);
#define __MSL_MATH_ALL                                                                          \
  __MSL_MATH1(acos) __MSL_MATH1(acosh) __MSL_MATH1(asin) __MSL_MATH1(asinh) __MSL_MATH1(atan)     \
  __MSL_MATH1(atanh) __MSL_MATH1(ceil) __MSL_MATH1(cos) __MSL_MATH1(cosh) __MSL_MATH1(cospi)      \
  __MSL_MATH1(exp) __MSL_MATH1(exp2) __MSL_MATH1(exp10) __MSL_MATH1(fabs) __MSL_MATH1(floor)      \
  __MSL_MATH1(fract) __MSL_MATH1(log) __MSL_MATH1(log2) __MSL_MATH1(log10) __MSL_MATH1(rint)      \
  __MSL_MATH1(round) __MSL_MATH1(rsqrt) __MSL_MATH1(sin) __MSL_MATH1(sinh) __MSL_MATH1(sinpi)     \
  __MSL_MATH1(sqrt) __MSL_MATH1(tan) __MSL_MATH1(tanh) __MSL_MATH1(tanpi) __MSL_MATH1(trunc)      \
  __MSL_MATH1(saturate) __MSL_MATH1(sign)                                                         \
  __MSL_MATH2(atan2) __MSL_MATH2(copysign) __MSL_MATH2(fdim) __MSL_MATH2(fmax) __MSL_MATH2(fmin)  \
  __MSL_MATH2(fmod) __MSL_MATH2(nextafter) __MSL_MATH2(pow) __MSL_MATH2(powr) __MSL_MATH2(step)   \
  __MSL_MATH3(fma) __MSL_MATH3(fmax3) __MSL_MATH3(fmin3) __MSL_MATH3(fmedian3) __MSL_MATH3(mix)   \
  __MSL_MATH3(smoothstep)                                                                         \
  template <class T> __MSL_IF(__MSL_FP(T), T) ldexp(T x, __msl::int_of<T> k);                     \
  template <class T> __MSL_IF(__MSL_FP(T), T) frexp(T x, __private __msl::int_of<T>& exp);        \
  template <class T> __MSL_IF(__MSL_FP(T), T) modf(T x, __private T& intval);                     \
  template <class T> __MSL_IF(__MSL_FP(T), T) sincos(T x, __private T& cosval);

namespace metal {
__MSL_MATH_ALL
namespace fast { __MSL_MATH_ALL }
namespace precise { __MSL_MATH_ALL }

// ---- Common to float and integer types --------------------------------------
template <class T> __MSL_IF(__MSL_ARITH(T), T) abs(T x);
template <class T> __MSL_IF(__MSL_ARITH(T), T) min(T x, T y);
template <class T> __MSL_IF(__MSL_ARITH(T), T) max(T x, T y);
template <class T> __MSL_IF(__MSL_ARITH(T), T) clamp(T x, T minval, T maxval);
template <class T> __MSL_IF(__MSL_ARITH(T), T) min3(T x, T y, T z);
template <class T> __MSL_IF(__MSL_ARITH(T), T) max3(T x, T y, T z);
template <class T> __MSL_IF(__MSL_ARITH(T), T) median3(T x, T y, T z);
namespace fast {
template <class T> __MSL_IF(__MSL_FP(T), T) min(T x, T y);
template <class T> __MSL_IF(__MSL_FP(T), T) max(T x, T y);
template <class T> __MSL_IF(__MSL_FP(T), T) clamp(T x, T minval, T maxval);
}  // namespace fast
namespace precise {
template <class T> __MSL_IF(__MSL_FP(T), T) min(T x, T y);
template <class T> __MSL_IF(__MSL_FP(T), T) max(T x, T y);
template <class T> __MSL_IF(__MSL_FP(T), T) clamp(T x, T minval, T maxval);
}  // namespace precise

// ---- Integer types ----------------------------------------------------------
#define __MSL_INT1(f) template <class T> __MSL_IF(__MSL_INT(T), T) f(T x);
#define __MSL_INT2(f) template <class T> __MSL_IF(__MSL_INT(T), T) f(T x, T y);
#define __MSL_INT3(f) template <class T> __MSL_IF(__MSL_INT(T), T) f(T x, T y, T z);
__MSL_INT1(clz) __MSL_INT1(ctz) __MSL_INT1(popcount) __MSL_INT1(reverse_bits)
__MSL_INT2(absdiff) __MSL_INT2(addsat) __MSL_INT2(subsat) __MSL_INT2(hadd) __MSL_INT2(rhadd)
__MSL_INT2(mulhi) __MSL_INT2(rotate)
__MSL_INT3(madhi) __MSL_INT3(madsat)
template <class T> __MSL_IF(__MSL_INT(T), T) extract_bits(T x, uint offset, uint bits);
template <class T> __MSL_IF(__MSL_INT(T), T) insert_bits(T base, T insert, uint offset, uint bits);
#undef __MSL_INT1
#undef __MSL_INT2
#undef __MSL_INT3

// ---- Geometric (float and half vectors) -------------------------------------
template <class T> __MSL_IF(__MSL_FPVEC(T), __msl::elem_of<T>) dot(T x, T y);
template <class T> __MSL_IF(__MSL_FPVEC(T), __msl::elem_of<T>) distance(T x, T y);
template <class T> __MSL_IF(__MSL_FPVEC(T), __msl::elem_of<T>) distance_squared(T x, T y);
template <class T> __MSL_IF(__MSL_FPVEC(T), __msl::elem_of<T>) length(T x);
template <class T> __MSL_IF(__MSL_FPVEC(T), __msl::elem_of<T>) length_squared(T x);
template <class T> __MSL_IF(__MSL_FPVEC(T), T) normalize(T x);
template <class T> __MSL_IF(__MSL_FPVEC(T) && __msl::vec<T>::lanes == 3, T) cross(T x, T y);
template <class T> __MSL_IF(__MSL_FPVEC(T), T) faceforward(T n, T i, T nref);
template <class T> __MSL_IF(__MSL_FPVEC(T), T) reflect(T i, T n);
template <class T> __MSL_IF(__MSL_FPVEC(T), T) refract(T i, T n, __msl::elem_of<T> eta);
namespace fast {
template <class T> __MSL_IF(__MSL_FPVEC(T), __msl::elem_of<T>) distance(T x, T y);
template <class T> __MSL_IF(__MSL_FPVEC(T), __msl::elem_of<T>) length(T x);
template <class T> __MSL_IF(__MSL_FPVEC(T), T) normalize(T x);
}  // namespace fast
namespace precise {
template <class T> __MSL_IF(__MSL_FPVEC(T), __msl::elem_of<T>) distance(T x, T y);
template <class T> __MSL_IF(__MSL_FPVEC(T), __msl::elem_of<T>) length(T x);
template <class T> __MSL_IF(__MSL_FPVEC(T), T) normalize(T x);
}  // namespace precise

// ---- Relational -------------------------------------------------------------
template <class T> __MSL_IF(__MSL_FP(T), __msl::bool_of<T>) isfinite(T x);
template <class T> __MSL_IF(__MSL_FP(T), __msl::bool_of<T>) isinf(T x);
template <class T> __MSL_IF(__MSL_FP(T), __msl::bool_of<T>) isnan(T x);
template <class T> __MSL_IF(__MSL_FP(T), __msl::bool_of<T>) isnormal(T x);
template <class T> __MSL_IF(__MSL_FP(T), __msl::bool_of<T>) signbit(T x);
template <class T> __MSL_IF(__MSL_FP(T), __msl::bool_of<T>) isordered(T x, T y);
template <class T> __MSL_IF(__MSL_FP(T), __msl::bool_of<T>) isunordered(T x, T y);
bool all(bool x);
bool all(bool2 x);
bool all(bool3 x);
bool all(bool4 x);
bool any(bool x);
bool any(bool2 x);
bool any(bool3 x);
bool any(bool4 x);
// c ? b : a, per lane for a vector mask (a comparison such as v > 0.5f).
template <class T> __MSL_IF(__MSL_ARITH(T) || __msl::scalar<T>::is_bool, T) select(T a, T b, bool c);
template <class T> __MSL_IF(__MSL_ARITH(T) && (__msl::vec<T>::lanes > 1), T) select(T a, T b, __msl::bool_of<T> c);

// ---- Reinterpretation -------------------------------------------------------
// as_type<T>(x): the bits of a scalar or vector as another of the same size.
template <class T, class U>
__MSL_IF(sizeof(T) == sizeof(U) && (__MSL_ARITH(T) || __msl::scalar<T>::is_bool) &&
             (__MSL_ARITH(U) || __msl::scalar<U>::is_bool),
         T)
as_type(U x);
}  // namespace metal

#undef __MSL_MATH1
#undef __MSL_MATH2
#undef __MSL_MATH3
#undef __MSL_MATH_ALL
