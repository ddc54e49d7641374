// Decode attention body: one query per query head (position n_tokens - 1)
// against one layer's KV cache, f16 K/V, f32 accumulation.
//
// Geometry. A threadgroup of kAttnSimdgroups SIMD-groups serves one KV head
// and a block of up to R query heads that share it (native GQA/MQA), over one
// chunk of key positions (the whole range unless split-K). SIMD-group g takes
// key blocks g, g + S, g + 2S, ... of 4 consecutive positions; its lanes split
// head_dim (E = attn_lane_elems(D) elements each, attention.h). Per block:
// each lane loads its E-slice
// of the 4 K rows once, forms partial dots with all R query rows, one
// simd_sum(float4) per row gives 4 scores, then the same lanes load the 4 V
// slices once and update every row's online softmax. At the end the
// SIMD-groups' (m, l, acc) merge through threadgroup memory.
//
// Read count: every K and V element of the visible range is loaded exactly
// once per (KV head, head block) — once per decode step when
// group_size <= R (8 at D <= 128, 4 above), ceil(group_size / R) times
// otherwise. Masked or out-of-window slots are never read: the chunk loops over
// positions [lo, n_tokens) and maps position p to slot p % slots.
#pragma once

#include "attention.h"

// Writes (split) the chunk's unnormalised output and (max, sum) per query
// head, or (single pass) the normalised output, sinks folded in.
template <uint D, uint R>
inline void attn_decode_body(constant mkv_params::AttnDecode& p,
                             const device float* q,      // (n_q_heads, D)
                             const device half* kv,      // (2, slots, n_kv_heads, D)
                             const device float* sinks,  // (n_q_heads) if has_sinks
                             device float* out,          // (n_q_heads, D)            single pass
                             device float* part_o,       // (n_q_heads, n_chunks, D)  split
                             device float* part_ml,      // (n_q_heads, n_chunks, 2)  split
                             threadgroup float* tg_m,    // (S, R)
                             threadgroup float* tg_l,    // (S, R)
                             threadgroup float* tg_acc,  // (S, D)
                             uint2 tg, uint tid, uint simd, uint lane, bool split) {
  constexpr uint E = mkv_params::attn_lane_elems(D);
  constexpr uint S = mkv_params::kAttnSimdgroups;
  const AttnHeadBlock hb = attn_head_block(p, tg.x);
  const uint kv_head = hb.kv_head, head0 = hb.head0, rows = hb.count;

  // Visible positions [lo, n): the whole history, or the last `window`.
  const uint n = p.n_tokens;
  const uint lo = (p.window > 0 && n > p.window) ? n - p.window : 0;
  const uint begin = lo + tg.y * p.chunk_keys;
  const uint end = min(begin + p.chunk_keys, n);
  const uint slot_begin = begin % p.slots;
  const uint slot_stride = p.n_kv_heads * D;  // halfs from one slot to the next
  const device half* k_base = kv + kv_head * D;
  const device half* v_base = kv + p.slots * slot_stride + kv_head * D;

  AttnRows<E, R> st;
  attn_rows_init(st);
  for (uint r = 0; r < R; ++r)
    if (r < rows) load_q_slice<D>(q + (head0 + r) * D, lane, st.q[r]);

  for (uint i = begin + simd * 4; i < end; i += S * 4) {
    float kv4[4][E];  // K slices, then V slices, of positions i .. i+3
    MKV_UNROLL for (uint j = 0; j < 4; ++j) {
      if (i + j < end) {
        uint slot = slot_begin + (i + j - begin);  // < 2 * slots: chunks fit in the ring
        if (slot >= p.slots) slot -= p.slots;
        load_slice<D>(k_base + slot * slot_stride, lane, kv4[j]);
      } else {
        for (uint e = 0; e < E; ++e) kv4[j][e] = 0.0f;
      }
    }
    float4 scores[R];
    MKV_UNROLL for (uint r = 0; r < R; ++r)
      if (r < rows) scores[r] = simd_sum(attn_dot4(st.q[r], kv4));
    MKV_UNROLL for (uint j = 0; j < 4; ++j) {
      if (i + j < end) {
        uint slot = slot_begin + (i + j - begin);
        if (slot >= p.slots) slot -= p.slots;
        load_slice<D>(v_base + slot * slot_stride, lane, kv4[j]);
      }
    }
    MKV_UNROLL for (uint r = 0; r < R; ++r) {
      if (r < rows) {
        const float4 s = attn_transform(scores[r], p.scale, p.softcap);
        attn_update(st, r, attn_mask(s, int(i), int(begin), int(end) - 1), kv4);
      }
    }
  }

  // Merge the SIMD-groups: weights exp(m_g - M); a group that saw no key has
  // m_g = -inf, weight 0 and acc 0. Every chunk holds a key, so M is finite.
  if (lane == 0) {
    for (uint r = 0; r < R; ++r) {
      tg_m[simd * R + r] = st.m[r];
      tg_l[simd * R + r] = st.l[r];
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  MKV_UNROLL for (uint r = 0; r < R; ++r) {  // unrolled: st stays in registers (nvcc: no 320-byte stack copy)
    if (r < rows) {  // uniform over the threadgroup: every thread meets the barriers
      float m_all = -INFINITY;
      for (uint g = 0; g < S; ++g) m_all = max(m_all, tg_m[g * R + r]);
      const float w = exp(st.m[r] - m_all);
      if (attn_lane_owns<D>(lane))
        for (uint e = 0; e < E; ++e) tg_acc[simd * D + lane * E + e] = st.acc[r][e] * w;
      threadgroup_barrier(mem_flags::mem_threadgroup);
      if (tid < D) {
        float l_all = 0.0f;
        float o = 0.0f;
        for (uint g = 0; g < S; ++g) {
          l_all += tg_l[g * R + r] * exp(tg_m[g * R + r] - m_all);
          o += tg_acc[g * D + tid];
        }
        const uint qh = head0 + r;
        if (split) {
          const uint at = qh * p.n_chunks + tg.y;
          part_o[at * D + tid] = o;
          if (tid == 0) {
            part_ml[at * 2] = m_all;
            part_ml[at * 2 + 1] = l_all;
          }
        } else {
          const float sink = p.has_sinks ? sinks[qh] : 0.0f;
          out[qh * D + tid] = attn_finish(m_all, l_all, o, p.has_sinks != 0, sink);
        }
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);  // tg_acc is reused by the next row
    }
  }
}

// Second pass of split-K: out = sum_c exp(m_c - M) acc_c / sum_c exp(m_c - M) l_c,
// with the sink folded in. One threadgroup per query head, one thread per element.
template <uint D>
inline void attn_decode_reduce_body(constant mkv_params::AttnDecodeReduce& p,
                                    const device float* part_o,   // (n_q_heads, n_chunks, D)
                                    const device float* part_ml,  // (n_q_heads, n_chunks, 2)
                                    const device float* sinks,    // (n_q_heads) if has_sinks
                                    device float* out,            // (n_q_heads, D)
                                    uint qh, uint tid) {
  const device float* ml = part_ml + qh * p.n_chunks * 2;
  const device float* o_c = part_o + qh * p.n_chunks * D + tid;
  float m_all = -INFINITY;
  for (uint c = 0; c < p.n_chunks; ++c) m_all = max(m_all, ml[c * 2]);
  float l_all = 0.0f;
  float o = 0.0f;
  for (uint c = 0; c < p.n_chunks; ++c) {
    const float w = exp(ml[c * 2] - m_all);
    l_all += ml[c * 2 + 1] * w;
    o += o_c[c * D] * w;
  }
  const float sink = p.has_sinks ? sinks[qh] : 0.0f;
  out[qh * D + tid] = attn_finish(m_all, l_all, o, p.has_sinks != 0, sink);
}
