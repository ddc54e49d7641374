// Shared by both preludes, part 4 (start): the types of MSL's barriers and
// SIMD-group votes. Included by cpp/gpu/host/prelude/mkv_prelude_simd.h
// (fiber rendezvous) and cpp/gpu/cuda/prelude/mkv_cuda_simd.h (warp
// collectives), whose functions on them differ. Needs MKV_FN (see
// mkv_common_types.h). tools/msl_check/msl_simdgroup.h declares the same enum
// for itself: it models Apple's declarations for a syntax check and does not
// include the executors' preludes.
#pragma once

#include "mkv_common_types.h"

namespace metal {

enum class mem_flags : uint32_t {
  mem_none = 0,
  mem_device = 1,
  mem_threadgroup = 2,
  mem_texture = 4,
  mem_threadgroup_imageblock = 8,
  mem_object_data = 16,
};
MKV_FN constexpr mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(uint32_t(a) | uint32_t(b)); }

// simd_ballot's result: one bit per lane.
struct simd_vote {
  using vote_t = uint64_t;
  vote_t bits = 0;
  MKV_FN explicit constexpr operator vote_t() const { return bits; }
  MKV_FN constexpr bool any() const { return bits != 0; }
};

}  // namespace metal
