// Prefill attention on matrix units: attn_prefill_mma_{f16,kvq}_dD for every
// head_dim of attention_prefill.metal, and attn_prefill_mma_f16_dD_half with Q
// and P in half (AttentionDesc::half_operands; design: attention_prefill_mma.h).
// Built for every device; the op picks them where the device reports matrix
// units, and as prefill_variant 'mma' anywhere.
#include "mkv_kernel.h"
#include "attention_prefill_mma.h"
#include "attention_variants.h"

template <bool Quant, uint D, uint BK, uint RB, typename QT>
MKV_MAX_THREADS(mkv_params::kAttnMmaSimdgroups * 32) kernel void attn_prefill_mma(
    constant mkv_params::AttnPrefill& p [[buffer(0)]],
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
  // uint4: 16-byte aligned rows (simdgroup_load4)
  threadgroup uint4 k_tile[BK * attn_prefill_mma_stride(D) / 8];
  threadgroup uint4 v_tile[BK * attn_prefill_mma_stride(D) / 8];
  threadgroup float square[mkv_params::kAttnMmaSimdgroups * 64];
  attn_prefill_mma_body<Quant, D, BK, RB, QT>(p, q, kv, table, ring, sinks, out, logits, (threadgroup half*)k_tile,
                                              (threadgroup half*)v_tile, (threadgroup QT*)square, tg, tid, simd,
                                              lane);
}

#define MKV_ATTN_PREFILL_MMA_KIND(D, kind, quant, QT, suffix)                               \
  MKV_KERNEL(MKV_STR(attn_prefill_mma_##kind##_d##D##suffix),                               \
             attn_prefill_mma<quant, D, mkv_params::attn_prefill_key_tile(D),                      \
                              mkv_params::attn_prefill_mma_blocks(D, MKV_IS_HALF_##QT), QT>)
#define MKV_IS_HALF_float false
#define MKV_IS_HALF_half true
#define MKV_ATTN_PREFILL_MMA_F16(D, kind, quant) MKV_ATTN_PREFILL_MMA_KIND(D, kind, quant, float, )
#define MKV_ATTN_PREFILL_MMA_HALF(D, kind, quant) MKV_ATTN_PREFILL_MMA_KIND(D, kind, quant, half, _half)
MKV_ATTN_HEAD_DIMS(MKV_ATTN_PREFILL_MMA_F16, f16, false)
MKV_ATTN_HEAD_DIMS(MKV_ATTN_PREFILL_MMA_HALF, f16, false)
MKV_ATTN_KVQ_HEAD_DIMS(MKV_ATTN_PREFILL_MMA_F16, kvq, true)
