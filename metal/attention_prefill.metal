// Prefill attention kernels (see attention_prefill.h for the design and the
// read count). Variants by head_dim D: attn_prefill_f16_dD.
#include "mkv_kernel.h"
#include "attention_prefill.h"

// BK = attn_prefill_key_tile(D), R = attn_rows_per_simdgroup(D).
template <uint D, uint BK, uint R>
MKV_MAX_THREADS(mkv_params::kAttnSimdgroups * 32) kernel void attn_prefill(constant mkv_params::AttnPrefill& p [[buffer(0)]],
                         const device float* q [[buffer(1)]],      // (n_queries, n_q_heads, D)
                         const device half* kv [[buffer(2)]],      // (2, slots, n_kv_heads, D)
                         const device float* sinks [[buffer(3)]],  // (n_q_heads); q when unused
                         device float* out [[buffer(4)]],          // (n_queries, n_q_heads, D)
                         uint2 tg [[threadgroup_position_in_grid]],
                         uint tid [[thread_index_in_threadgroup]],
                         uint simd [[simdgroup_index_in_threadgroup]],
                         uint lane [[thread_index_in_simdgroup]]) {
  // half4 so the tiles are 8-byte aligned for the half4 stores.
  threadgroup half4 k_tile[BK * D / 4];
  threadgroup half4 v_tile[BK * D / 4];
  attn_prefill_body<D, BK, R>(p, q, kv, sinks, out, (threadgroup half*)k_tile,
                              (threadgroup half*)v_tile, tg, tid, simd, lane);
}

// One explicit instantiation per variant; the name literal stays whole so the
// host build pass can read it.

MKV_KERNEL("attn_prefill_f16_d64", attn_prefill<64, mkv_params::attn_prefill_key_tile(64),
                                                mkv_params::attn_rows_per_simdgroup(64)>)
MKV_KERNEL("attn_prefill_f16_d128", attn_prefill<128, mkv_params::attn_prefill_key_tile(128),
                                                 mkv_params::attn_rows_per_simdgroup(128)>)
MKV_KERNEL("attn_prefill_f16_d256", attn_prefill<256, mkv_params::attn_prefill_key_tile(256),
                                                 mkv_params::attn_rows_per_simdgroup(256)>)
