// Shared by both preludes, part 1 (check): Metal's layout of the vector types,
// so structs shared with the GPU have the same size everywhere. Included by
// cpp/gpu/host/prelude/mkv_prelude_types.h and cpp/gpu/cuda/prelude/
// mkv_cuda_types.h after their typedefs (float4 is mkv_float4 under CUDA, see
// its metal_stdlib).
#pragma once

namespace metal {
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
