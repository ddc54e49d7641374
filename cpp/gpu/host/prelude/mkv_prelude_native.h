// Host prelude, part 1a: the compiler's own vectors (GCC/Clang vector
// extensions) under the MSL vector types, so float4/uint4 arithmetic, dot and
// conversions compile to SSE/AVX/NEON instructions rather than four scalar ones.
//
// vec_storage<T, N> (mkv_prelude_types.h) overlays its element array with
// native_t<T, kStorage>; the operators ask native_op_v (mkv_prelude_vec_ops.h)
// whether an operation may run on the native vectors with exactly the results
// of the per-element code, and fall back to that code otherwise.
// What stays per element, and why:
//   - 3-vectors: their fourth (padding) element is not always initialized, and
//     a denormal or signalling NaN there would slow or trap a native operation;
//   - half arithmetic: MSL rounds every half operation to half; the native
//     _Float16 vectors of GCC 12 promote, so only conversions are native;
//   - integer / and %: a native division by the padding or by a zero lane
//     traps where the kernel's own code would not have divided;
//   - 8- and 16-bit shifts: C++ promotes to int before shifting, a native
//     shift does not (uchar4(0x80) << 1 differs past the element width);
//   - bool vectors: stored as one byte 0/1 per element, native only as the
//     result of a comparison.
#pragma once

#include <cstdint>
#include <type_traits>

namespace metal {
namespace mkv_detail {

// The native vector of S elements of T (bool: bytes; half: _Float16).
template <class T, int S> struct native_of {
  typedef T type __attribute__((vector_size(S * sizeof(T))));
};
template <int S> struct native_of<bool, S> {
  typedef unsigned char type __attribute__((vector_size(S)));
};
template <class T, int S> using native_t = typename native_of<T, S>::type;

// N copies of s (a vector literal: one broadcast instruction, where a loop
// over the elements gave an insert per element).
template <class T, int N> inline native_t<T, N> native_splat(T s) {
  if constexpr (N == 2) {
    return native_t<T, 2>{s, s};
  } else {
    static_assert(N == 4, "2 or 4 elements (3-vectors are stored as 4)");
    return native_t<T, 4>{s, s, s, s};
  }
}

// Element-type conversions done natively (__builtin_convertvector, which
// converts as static_cast does): any two element types but bool and half
// (half <-> float: below), 2 or 4 elements.
template <class To, class From, int N> constexpr bool native_convert_v =
    N != 3 && !std::is_same<To, bool>::value && !std::is_same<From, bool>::value &&
    !std::is_same<To, _Float16>::value && !std::is_same<From, _Float16>::value;

// half <-> float with F16C: one instruction for 2 or 4 elements. (Without it,
// the per-element conversions.)
#if defined(__F16C__)
constexpr bool kNativeHalf = true;
typedef short mkv_short8 __attribute__((vector_size(16)));
typedef float mkv_float4 __attribute__((vector_size(16)));
typedef long long mkv_long2 __attribute__((vector_size(16)));
typedef int mkv_int4 __attribute__((vector_size(16)));
// The halves' bits go in and out through integer registers and vector
// literals (vmovq/vmovd), not through memory: a narrow store followed by a
// wide load of the same bytes misses store-to-load forwarding, which made a
// half4 -> float4 cost more than the per-element conversions it replaced.
template <int N> inline native_t<float, N> half_to_float(native_t<_Float16, N> h) {
  mkv_short8 w;
  if constexpr (N == 4) {
    long long bits;
    __builtin_memcpy(&bits, &h, 8);
    w = (mkv_short8)(mkv_long2){bits, 0};
  } else {
    int bits;
    __builtin_memcpy(&bits, &h, 4);
    w = (mkv_short8)(mkv_int4){bits, 0, 0, 0};
  }
  const mkv_float4 f = __builtin_ia32_vcvtph2ps(w);
  if constexpr (N == 4) {
    return f;
  } else {
    return native_t<float, 2>{f[0], f[1]};
  }
}
template <int N> inline native_t<_Float16, N> float_to_half(native_t<float, N> f) {
  mkv_float4 w;
  if constexpr (N == 4) {
    w = f;
  } else {
    w = mkv_float4{f[0], f[1], 0.0f, 0.0f};
  }
  // 4: round as MXCSR says (to nearest even), as the scalar conversion does.
  const mkv_short8 h = __builtin_ia32_vcvtps2ph(w, 4);
  native_t<_Float16, N> r;
  if constexpr (N == 4) {
    const long long bits = ((mkv_long2)h)[0];
    __builtin_memcpy(&r, &bits, 8);
  } else {
    const int bits = ((mkv_int4)h)[0];
    __builtin_memcpy(&r, &bits, 4);
  }
  return r;
}
#else
constexpr bool kNativeHalf = false;
#endif

}  // namespace mkv_detail
}  // namespace metal
