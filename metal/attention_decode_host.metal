// The host executor's decode attention shape: every kernel name the op picks
// on the host (attention_decode.metal's, fixed-format pairs read through the
// kvq kernels) with "_h" appended, built for the host executor only. Same
// bodies, two parameters changed (attention_params.h,
// attn_decode_host_lane_elems): a lane holds a quarter of a row (16 elements
// at D = 80, 112), so 4 lanes share a key (8 at 80, 112) and its scores take 2
// shuffle steps where the GPU shape takes 3-5, and a threadgroup is one
// SIMD-group. Each shuffle is a rendezvous of 32 fibers on the host; registers
// cost nothing there.
// GPU compilers see an empty file: the GPU shapes are the ones that fit their
// registers (docs/ATTENTION.md), and the host also builds and tests those.
#include "mkv_kernel.h"
#include "attention_decode_kernels.h"
#include "attention_variants.h"

#if defined(MKV_HOST_SHAPES)
// Single pass and split-K first pass of one (reader, rows, window, logits)
// choice: attn_decode_<kind>_d<D><suffix>_h and attn_decode_split_<kind>_d<D><suffix>_h.
#define MKV_ATTN_DECODE_HOST(D, R, kind, reader, RES, LG, suffix)                                          \
  MKV_KERNEL(MKV_STR(attn_decode_##kind##_d##D##suffix##_h),                                                \
             attn_decode<reader<D, mkv_params::attn_decode_lane_elems(D)>, D, R, false, RES, LG,            \
                         mkv_params::kAttnDecodeHostSimdgroups, mkv_params::attn_decode_host_lane_elems(D)>) \
  MKV_KERNEL(MKV_STR(attn_decode_split_##kind##_d##D##suffix##_h),                                          \
             attn_decode_split<reader<D, mkv_params::attn_decode_lane_elems(D)>, D, R, false, RES, LG,      \
                               mkv_params::kAttnDecodeHostSimdgroups,                                       \
                               mkv_params::attn_decode_host_lane_elems(D)>)
// f16 K and V (and an eviction policy's logits) at every head_dim.
#define MKV_ATTN_DECODE_HOST_F16(D, unused)                                                             \
  MKV_ATTN_DECODE_HOST(D, mkv_params::attn_decode_rows(D), f16, AttnKvF16, false, false, )        \
  MKV_ATTN_DECODE_HOST(D, mkv_params::attn_decode_rows(D), f16, AttnKvF16, false, true, _lg)
// Quantized K and/or V, with a residual window, with logits: the head_dims kv_format_fits takes.
#define MKV_ATTN_DECODE_HOST_KVQ(D, unused)                                                             \
  MKV_ATTN_DECODE_HOST(D, mkv_params::attn_decode_rows(D), kvq, AttnKvQuant, false, false, )      \
  MKV_ATTN_DECODE_HOST(D, mkv_params::attn_decode_rows(D), kvq, AttnKvQuant, true, false, _res)   \
  MKV_ATTN_DECODE_HOST(D, mkv_params::attn_decode_rows(D), kvq, AttnKvQuant, false, true, _lg)
// The 4-row forms where D allows 8 rows (the op's pick for head blocks of <= 4).
#define MKV_ATTN_DECODE_HOST_R4(D, unused)                                              \
  MKV_ATTN_DECODE_HOST(D, 4, f16, AttnKvF16, false, false, _r4)                  \
  MKV_ATTN_DECODE_HOST(D, 4, kvq, AttnKvQuant, false, false, _r4)                \
  MKV_ATTN_DECODE_HOST(D, 4, kvq, AttnKvQuant, true, false, _res_r4)

// The head_dims of attention_variants.h, as attention_decode.metal's.
MKV_ATTN_HEAD_DIMS(MKV_ATTN_DECODE_HOST_F16, )
MKV_ATTN_KVQ_HEAD_DIMS(MKV_ATTN_DECODE_HOST_KVQ, )
MKV_ATTN_R4_HEAD_DIMS(MKV_ATTN_DECODE_HOST_R4, )
#endif
