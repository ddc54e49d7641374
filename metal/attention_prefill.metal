// Prefill attention kernels (see attention_prefill.h for the design and the
// read count). Variants by head_dim D: attn_prefill_f16_dD, and
// attn_prefill_kvq_dD over quantized K and/or V (the head_dims kv_format_fits accepts),
// with or without a residual window (p.residual; its ring at buffer 6).
#include "mkv_kernel.h"
#include "attention_prefill.h"
#include "attention_variants.h"

// BK = attn_prefill_key_tile(D), R = attn_rows_per_simdgroup(D).
template <bool Quant, uint D, uint BK, uint R>
MKV_MAX_THREADS(mkv_params::kAttnSimdgroups * 32) kernel void attn_prefill(constant mkv_params::AttnPrefill& p [[buffer(0)]],
                         const device float* q [[buffer(1)]],      // (n_queries, n_q_heads, D)
                         const device uchar* kv [[buffer(2)]],     // the layer's pool
                         const device float* sinks [[buffer(3)]],  // (n_q_heads); q when unused
                         device float* out [[buffer(4)]],          // (n_queries, n_q_heads, D)
                         const device uint* table [[buffer(5)]],   // block table
                         const device uchar* ring [[buffer(6)]],   // residual window (Quant kernels); kv if none
                         device float* logits [[buffer(7)]],       // a policy's logits (p.logits); out if none
                         uint2 tg [[threadgroup_position_in_grid]],
                         uint tid [[thread_index_in_threadgroup]],
                         uint simd [[simdgroup_index_in_threadgroup]],
                         uint lane [[thread_index_in_simdgroup]]) {
  // half4 so the tiles are 8-byte aligned for the half4 stores.
  threadgroup half4 k_tile[BK * D / 4];
  threadgroup half4 v_tile[BK * D / 4];
  attn_prefill_body<Quant, D, BK, R>(p, q, kv, table, ring, sinks, out, logits, (threadgroup half*)k_tile,
                              (threadgroup half*)v_tile, tg, tid, simd, lane);
}

// One kernel per head_dim D; the name literal is built whole (stringized
// after pasting) so the host build pass can read it. The op accepts exactly
// these D (kAttnHeadDims, cpp/ops/attention.h).
#define MKV_ATTN_PREFILL_KIND(D, kind, quant)                                     \
  MKV_KERNEL(MKV_STR(attn_prefill_##kind##_d##D),                                 \
             attn_prefill<quant, D, mkv_params::attn_prefill_key_tile(D), mkv_params::attn_rows_per_simdgroup(D)>)
// f16 K and V at every head_dim, the quantized readers at theirs (attention_variants.h).
MKV_ATTN_HEAD_DIMS(MKV_ATTN_PREFILL_KIND, f16, false)
MKV_ATTN_KVQ_HEAD_DIMS(MKV_ATTN_PREFILL_KIND, kvq, true)
