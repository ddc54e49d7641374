// Shared by both preludes, part 1 (end): MSL packed vectors and the vector
// traits of vec and packed_vec. Included by cpp/gpu/host/prelude/
// mkv_prelude_types.h and cpp/gpu/cuda/prelude/mkv_cuda_types.h right after
// their vec<T,N>; needs MKV_FN (see mkv_common_types.h).
#pragma once

#include "mkv_common_types.h"

// MSL packed vectors: no padding, element alignment (packed_float3 is 12
// bytes, 4-aligned), for tightly packed buffer data (quant.h reads 2-byte
// aligned quants as packed_ushort2). They convert implicitly to and from
// vec<T,N> and take part in arithmetic, but have no swizzles. Element-wise
// access only: their alignment allows nothing wider.
namespace metal {
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
  MKV_FN packed_vec(const vec<T, N>& v) {
    for (int i = 0; i < N; ++i) data_[i] = v[i];
  }
  template <class A0, class A1, class... As>
  MKV_FN packed_vec(const A0& a0, const A1& a1, const As&... as) : packed_vec(vec<T, N>(a0, a1, as...)) {}
  MKV_FN operator vec<T, N>() const {
    vec<T, N> v;
    for (int i = 0; i < N; ++i) v[i] = data_[i];
    return v;
  }
  MKV_FN T& operator[](int i) { return data_[i]; }
  MKV_FN const T& operator[](int i) const { return data_[i]; }
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
}  // namespace metal
