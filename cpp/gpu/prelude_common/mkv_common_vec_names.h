// Shared by both preludes, part 1 (names): MSL's vector and packed-vector
// names (float2 ... bool4, packed_float2 ... packed_uchar4) in namespace metal
// and at global scope, and Metal's layout of them, so structs shared with the
// GPU have the same size everywhere. Included by cpp/gpu/host/prelude/
// mkv_prelude_types.h and cpp/gpu/cuda/prelude/mkv_cuda_types.h after their
// vec<T,N> and mkv_common_packed_vec.h, with MKV_CHAR defined: the element type
// of char2..char4 (MSL char is signed; each prelude says how it gets that).
// Under CUDA each pasted name is a macro for ours (float4 -> mkv_float4, see
// its metal_stdlib), so the same lines define and export mkv_float4 there.
#pragma once

#ifndef MKV_CHAR
#error "define MKV_CHAR (a prelude's types header does) before including mkv_common_vec_names.h"
#endif

// M(element type, name) for every MSL vector element; packed vectors exist
// for the first eight only.
#define MKV_PACKED_ELEMENTS(M) \
  M(float, float) M(half, half) M(int, int) M(uint, uint) M(short, short) M(ushort, ushort) M(MKV_CHAR, char) \
  M(uchar, uchar)
#define MKV_VEC_ELEMENTS(M) MKV_PACKED_ELEMENTS(M) M(long, long) M(ulong, ulong) M(bool, bool)

namespace metal {
#define MKV_VEC_TYPEDEFS(T, name) \
  typedef vec<T, 2> name##2;      \
  typedef vec<T, 3> name##3;      \
  typedef vec<T, 4> name##4;
#define MKV_PACKED_TYPEDEFS(T, name)                 \
  typedef mkv_detail::packed_vec<T, 2> packed_##name##2; \
  typedef mkv_detail::packed_vec<T, 3> packed_##name##3; \
  typedef mkv_detail::packed_vec<T, 4> packed_##name##4;
MKV_VEC_ELEMENTS(MKV_VEC_TYPEDEFS)
MKV_PACKED_ELEMENTS(MKV_PACKED_TYPEDEFS)
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
              "vectors must pass in registers and live in threadgroup (__shared__) arrays without construction");
}  // namespace metal

// Global names, so MSL code may omit `metal::` (it usually also says `using
// namespace metal;`; both routes name the same type, so no ambiguity).
#define MKV_EXPORT_VEC(T, name) using metal::name##2; using metal::name##3; using metal::name##4;
#define MKV_EXPORT_PACKED(T, name) \
  using metal::packed_##name##2; using metal::packed_##name##3; using metal::packed_##name##4;
MKV_VEC_ELEMENTS(MKV_EXPORT_VEC)
MKV_PACKED_ELEMENTS(MKV_EXPORT_PACKED)
#undef MKV_EXPORT_PACKED
#undef MKV_EXPORT_VEC
#undef MKV_VEC_ELEMENTS
#undef MKV_PACKED_ELEMENTS
