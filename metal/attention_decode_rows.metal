// The host executor's collective-free decode attention (design:
// attention_decode_rows.h): attn_decode_f16_dD_rows_h (f16 K/V, every
// head_dim) or attn_decode_kvq_dD_rows_h (any formats, a residual window;
// the head_dims the kvq kernels take) for the parts' states, then
// attn_decode_rows_merge_dD_h (their merge and the finish), single pass;
// bit-identical to attn_decode_f16_dD[_r4|_lg]_h and attn_decode_kvq_dD[_res|_lg|_r4]_h.
// Built for the host executor only; GPU compilers see an empty file.
#include "mkv_kernel.h"
#include "attention_decode_rows.h"
#include "attention_variants.h"

#if defined(MKV_HOST_SHAPES)
template <uint D, typename RD>
MKV_MAX_THREADS(32) kernel void attn_decode_rows(constant mkv_params::AttnDecode& p [[buffer(0)]],
                                                 const device float* q [[buffer(1)]],      // (n_q_heads, D)
                                                 const device uchar* kv [[buffer(2)]],     // the layer's pool
                                                 const device float* sinks [[buffer(3)]],  // unused (decode's ABI)
                                                 device float* out [[buffer(4)]],          // unused (decode's ABI)
                                                 const device uint* table [[buffer(5)]],   // block table
                                                 const device uchar* ring [[buffer(6)]],   // the residual window (kvq)
                                                 device float* parts [[buffer(7)]],        // (n_q_heads, parts, D + 2)
                                                 device float* logits [[buffer(8)]],       // (n_q_heads, n_tokens) if p.logits
                                                 uint2 tg [[threadgroup_position_in_grid]],
                                                 uint lane [[thread_index_in_threadgroup]]) {
  attn_decode_rows_body<D, RD>(p, q, kv, table, ring, parts, logits, tg, lane);
}

template <uint D>
MKV_MAX_THREADS(32) kernel void attn_decode_rows_merge(constant mkv_params::AttnDecode& p [[buffer(0)]],
                                                       const device float* parts [[buffer(1)]],  // (n_q_heads, parts, D + 2)
                                                       const device float* sinks [[buffer(2)]],  // (n_q_heads); parts when unused
                                                       device float* out [[buffer(3)]],          // (n_q_heads, D)
                                                       uint qh [[threadgroup_position_in_grid]],
                                                       uint lane [[thread_index_in_threadgroup]]) {
  attn_decode_rows_merge_body<D>(p, parts, sinks, out, qh, lane);
}

#define MKV_ATTN_DECODE_ROWS(D, unused)                                                       \
  MKV_KERNEL(MKV_STR(attn_decode_f16_d##D##_rows_h), attn_decode_rows<D, AttnRowsF16<D>>) \
  MKV_KERNEL(MKV_STR(attn_decode_rows_merge_d##D##_h), attn_decode_rows_merge<D>)
#define MKV_ATTN_DECODE_ROWS_KVQ(D, unused) \
  MKV_KERNEL(MKV_STR(attn_decode_kvq_d##D##_rows_h), attn_decode_rows<D, AttnRowsQuant<D>>)
MKV_ATTN_HEAD_DIMS(MKV_ATTN_DECODE_ROWS, )
MKV_ATTN_KVQ_HEAD_DIMS(MKV_ATTN_DECODE_ROWS_KVQ, )
#endif
