// Shared by both preludes, part 2 (start): MSL's math constants and the
// overload filters of the math functions. Included by cpp/gpu/host/prelude/
// mkv_prelude_math.h and cpp/gpu/cuda/prelude/mkv_cuda_math.h after each has
// defined INFINITY, NAN, HUGE_VALF (builtins on the host, bit patterns under
// CUDA) and before any function; mkv_common_math_ops.h holds the functions
// that are the same logic on both. Needs MKV_FN (see mkv_common_types.h).
#pragma once

#include "mkv_common_vec_operands.h"

// ---- Constants, spelled as MSL defines them (macros) -------------------------
#ifndef MAXFLOAT
#define MAXFLOAT FLT_MAX
#endif
#define HALF_MAX (static_cast<half>(65504.0f))
#define HALF_MIN (static_cast<half>(6.103515625e-05f))  // smallest normal, 2^-14
#define HALF_EPSILON (static_cast<half>(9.765625e-04f))  // 2^-10
#define MAXHALF HALF_MAX
#define HUGE_VALH (static_cast<half>(INFINITY))
#define M_E_F 2.718281828459045f
#define M_LOG2E_F 1.442695040888963f
#define M_LOG10E_F 0.434294481903252f
#define M_LN2_F 0.693147180559945f
#define M_LN10_F 2.302585092994046f
#define M_PI_F 3.141592653589793f
#define M_PI_2_F 1.570796326794897f
#define M_PI_4_F 0.785398163397448f
#define M_1_PI_F 0.318309886183791f
#define M_2_PI_F 0.636619772367581f
#define M_2_SQRTPI_F 1.128379167095513f
#define M_SQRT2_F 1.414213562373095f
#define M_SQRT1_2_F 0.707106781186548f
#define M_E_H (static_cast<half>(M_E_F))
#define M_LOG2E_H (static_cast<half>(M_LOG2E_F))
#define M_LN2_H (static_cast<half>(M_LN2_F))
#define M_PI_H (static_cast<half>(M_PI_F))
#define M_PI_2_H (static_cast<half>(M_PI_2_F))
#define M_SQRT2_H (static_cast<half>(M_SQRT2_F))
#define M_SQRT1_2_H (static_cast<half>(M_SQRT1_2_F))

namespace metal {
namespace mkv_detail {
template <class... X>
using enable_float_op =
    std::enable_if_t<(is_vec_like_v<X> || ...) && (is_operand_v<X> && ...) &&
                         is_float_v<typename vec_traits<typename first_vec<X...>::type>::elem>,
                     int>;
template <class V>
using enable_int_vec =
    std::enable_if_t<is_vec_like_v<V> && std::is_integral<typename vec_traits<V>::elem>::value, int>;
template <class T>
using enable_int = std::enable_if_t<std::is_integral<T>::value && !std::is_same<T, bool>::value, int>;

template <class T> using uint_of = std::make_unsigned_t<T>;
template <class T> constexpr int bits_v = int(sizeof(T) * CHAR_BIT);
}  // namespace mkv_detail
}  // namespace metal
