// MSL check prelude, part 4: <metal_simdgroup_matrix> (MSL 2.3; bfloat elements
// from MSL 3.1). Declarations only, modeled on Apple's: loads from device or
// threadgroup memory and stores to them in the matrix's own element type; a
// product's d and c share one type, a and b may hold others (half inputs into
// a float accumulator, as llama.cpp's and MLX's kernels do); the matrix is
// held in thread memory.
#pragma once

typedef __bf16 bfloat;
typedef bfloat bfloat2 __attribute__((ext_vector_type(2)));
typedef bfloat bfloat4 __attribute__((ext_vector_type(4)));

namespace metal {

template <class T, int Cols, int Rows>
struct simdgroup_matrix {
  static_assert(Cols == 8 && Rows == 8, "MSL's simdgroup matrices are 8x8");
  simdgroup_matrix() = default;
  explicit simdgroup_matrix(T diagonal);
  typename __msl::make_vec<T, 2>::type& thread_elements();
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;

template <class T, int C, int R = C>
simdgroup_matrix<T, C, R> make_filled_simdgroup_matrix(T value);

template <class T, int C, int R>
void simdgroup_load(__private simdgroup_matrix<T, C, R>& d, const __global T* src, ulong elements_per_row = C,
                    ulong2 matrix_origin = 0, bool transpose_matrix = false);
template <class T, int C, int R>
void simdgroup_load(__private simdgroup_matrix<T, C, R>& d, const __local T* src, ulong elements_per_row = C,
                    ulong2 matrix_origin = 0, bool transpose_matrix = false);
template <class T, int C, int R>
void simdgroup_store(__private const simdgroup_matrix<T, C, R>& a, __global T* dst, ulong elements_per_row = C,
                     ulong2 matrix_origin = 0, bool transpose_matrix = false);
template <class T, int C, int R>
void simdgroup_store(__private const simdgroup_matrix<T, C, R>& a, __local T* dst, ulong elements_per_row = C,
                     ulong2 matrix_origin = 0, bool transpose_matrix = false);
template <class T, class U, class V, int C, int R, int K>
void simdgroup_multiply(__private simdgroup_matrix<T, C, R>& d, __private const simdgroup_matrix<U, K, R>& a,
                        __private const simdgroup_matrix<V, C, K>& b);
template <class T, class U, class V, int C, int R, int K>
void simdgroup_multiply_accumulate(__private simdgroup_matrix<T, C, R>& d,
                                   __private const simdgroup_matrix<U, K, R>& a,
                                   __private const simdgroup_matrix<V, C, K>& b,
                                   __private const simdgroup_matrix<T, C, R>& c);

}  // namespace metal
