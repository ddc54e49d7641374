// The decode attention kernels' entry points (the bodies: attention_decode.h),
// instantiated by attention_decode.metal (every device's shapes) and
// attention_decode_host.metal (the host executor's). S: SIMD-groups a
// threadgroup runs (the op dispatches S * 32 threads; MKV_MAX_THREADS is the
// GPU shape's, the most any instantiation takes); EL: row elements a lane holds.
#pragma once

#include "mkv_kernel.h"
#include "attention_decode.h"

template <typename L, uint D, uint R, bool PF, bool RES = false, bool LG = false,
          uint S = mkv_params::kAttnSimdgroups, uint EL = L::kElems>
MKV_MAX_THREADS(mkv_params::kAttnSimdgroups * 32) kernel void attn_decode(constant mkv_params::AttnDecode& p [[buffer(0)]],
                        const device float* q [[buffer(1)]],      // (n_q_heads, D)
                        const device uchar* kv [[buffer(2)]],     // the layer's pool
                        const device float* sinks [[buffer(3)]],  // (n_q_heads); q when unused
                        device float* out [[buffer(4)]],          // (n_q_heads, D)
                        const device uint* table [[buffer(5)]],   // block table
                        const device uchar* ring [[buffer(6)]],   // residual window (RES)
                        device float* logits [[buffer(7)]],       // (n_q_heads, n_tokens) if p.logits
                        uint2 tg [[threadgroup_position_in_grid]],
                        uint tid [[thread_index_in_threadgroup]],
                        uint simd [[simdgroup_index_in_threadgroup]],
                        uint lane [[thread_index_in_simdgroup]]) {
  threadgroup float tg_m[S * R];
  threadgroup float tg_l[S * R];
  threadgroup float tg_acc[S * D];
  attn_decode_body<L, D, R, S, RES, LG, EL>(p, q, kv, table, ring, sinks, out, nullptr, nullptr, logits, tg_m, tg_l,
                                            tg_acc, tg, tid, simd, lane, false, PF);
}

template <typename L, uint D, uint R, bool PF, bool RES = false, bool LG = false,
          uint S = mkv_params::kAttnDecodeSplitSimdgroups, uint EL = L::kElems>
MKV_MAX_THREADS(mkv_params::kAttnDecodeSplitSimdgroups * 32) kernel void attn_decode_split(constant mkv_params::AttnDecode& p [[buffer(0)]],
                              const device float* q [[buffer(1)]],   // (n_q_heads, D)
                              const device uchar* kv [[buffer(2)]],  // the layer's pool
                              device float* part_o [[buffer(3)]],    // (n_q_heads, n_chunks, D)
                              device float* part_ml [[buffer(4)]],   // (n_q_heads, n_chunks, 2)
                              const device uint* table [[buffer(5)]],  // block table
                              const device uchar* ring [[buffer(6)]],  // residual window (RES)
                              device float* logits [[buffer(7)]],      // (n_q_heads, n_tokens) if p.logits
                              uint2 tg [[threadgroup_position_in_grid]],
                              uint tid [[thread_index_in_threadgroup]],
                              uint simd [[simdgroup_index_in_threadgroup]],
                              uint lane [[thread_index_in_simdgroup]]) {
  threadgroup float tg_m[S * R];
  threadgroup float tg_l[S * R];
  threadgroup float tg_acc[S * D];
  attn_decode_body<L, D, R, S, RES, LG, EL>(p, q, kv, table, ring, nullptr, nullptr, part_o, part_ml, logits, tg_m,
                                            tg_l, tg_acc, tg, tid, simd, lane, true, PF);
}

template <uint D>
MKV_MAX_THREADS(mkv_params::kAttnReduceThreads) kernel void attn_decode_reduce(constant mkv_params::AttnDecodeReduce& p [[buffer(0)]],
                               const device float* part_o [[buffer(1)]],   // (n_q_heads, n_chunks, D)
                               const device float* part_ml [[buffer(2)]],  // (n_q_heads, n_chunks, 2)
                               const device float* sinks [[buffer(3)]],    // (n_q_heads); part_o when unused
                               device float* out [[buffer(4)]],            // (n_q_heads, D)
                               threadgroup float* tg [[threadgroup(0)]],   // kAttnReduceTgFloats
                               uint qh [[threadgroup_position_in_grid]],
                               uint tid [[thread_index_in_threadgroup]],
                               uint simd [[simdgroup_index_in_threadgroup]],
                               uint lane [[thread_index_in_simdgroup]]) {
  attn_decode_reduce_body<D>(p, part_o, part_ml, sinks, out, tg, qh, tid, simd, lane);
}
