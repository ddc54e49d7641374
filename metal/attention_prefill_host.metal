// The host executor's prefill attention shape: attention_prefill.metal's
// kernel names with "_h" appended, built for the host executor only (design:
// attention_prefill_host.h). GPU compilers see an empty file; the host also
// builds and tests the GPU shape.
#include "mkv_kernel.h"
#include "attention_prefill_host.h"
#include "attention_variants.h"

#if defined(MKV_HOST_SHAPES)
template <bool Quant, uint D, uint HR>
MKV_MAX_THREADS(mkv_params::kAttnPrefillHostQueries) kernel void attn_prefill_host(
    constant mkv_params::AttnPrefill& p [[buffer(0)]],
    const device float* q [[buffer(1)]],      // (n_queries, n_q_heads, D)
    const device uchar* kv [[buffer(2)]],     // the layer's pool
    const device float* sinks [[buffer(3)]],  // (n_q_heads); q when unused
    device float* out [[buffer(4)]],          // (n_queries, n_q_heads, D)
    const device uint* table [[buffer(5)]],   // block table
    const device uchar* ring [[buffer(6)]],   // residual window (Quant kernels); kv if none
    device float* logits [[buffer(7)]],       // a policy's logits (p.logits); out if none
    uint2 tg [[threadgroup_position_in_grid]],
    uint lane [[thread_index_in_threadgroup]]) {
  // The kvq kernels' staged rows (attn_prefill_host_staged); the f16 ones read the pool in place.
  // (half4: rows read 4 halves at a time)
  threadgroup half4 k_stage[Quant ? attn_prefill_host_stage_keys(D) * D / 4 : 1];
  threadgroup half4 v_stage[Quant ? attn_prefill_host_stage_keys(D) * D / 4 : 1];
  attn_prefill_host_body<Quant, D, HR>(p, q, kv, table, ring, sinks, out, logits, (threadgroup half*)k_stage,
                                       (threadgroup half*)v_stage, tg, lane);
}

#define MKV_ATTN_PREFILL_HOST_KIND(D, kind, quant) \
  MKV_KERNEL(MKV_STR(attn_prefill_##kind##_d##D##_h), attn_prefill_host<quant, D, mkv_params::attn_prefill_host_rows(D)>)
// The head_dims of attention_variants.h, as attention_prefill.metal's.
MKV_ATTN_HEAD_DIMS(MKV_ATTN_PREFILL_HOST_KIND, f16, false)
MKV_ATTN_KVQ_HEAD_DIMS(MKV_ATTN_PREFILL_HOST_KIND, kvq, true)
#endif
