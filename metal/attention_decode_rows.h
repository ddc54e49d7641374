// The host executor's decode attention without collectives (the _rows_h
// kernels of attention_decode_rows.metal, built for the host only): one
// thread computes a block of up to R = attn_decode_rows_heads(D) query heads
// of one KV head alone, replaying what the host shape's SIMD-group
// (attention_decode.h with S = 1 and EL = attn_decode_host_lane_elems)
// computes for each of them, value for value: the G lane groups' own online
// softmax states over their keys (positions i + u*G + g of each block of
// G * 4), each score as KL lane partials of EL elements summed by the xor
// butterfly, the groups merged by the same tree at the end, then the
// one-SIMD-group merge and the finish. Results are bit-identical to the _h
// kernels; only the rendezvous are gone. f16 K/V, single pass, no residual
// window, no logits: the op keeps the _h kernels for the rest.
//
// Why this shape (docs/ATTENTION.md, "Decode on the host"): the work is
// converting K/V from half and the per-element products, so
//  - a K or V row is converted once for the R heads that read it (a thread per
//    query head converted it R times), as half4 -> float4 (F16C) loads;
//  - a lane group's 4 keys of a block are one float4: the 4 K rows' pieces
//    are transposed (4 x 4) so that each score partial is a float4 over the 4
//    keys, t_j += q[e] * k[e][0..3]: the same sequential sum per key as the
//    SIMD-group lane's, four keys at a time, the butterfly on float4s;
//  - V accumulates a float4 of acc at a time across the 4 keys:
//    (((acc * f + p0 v0) + p1 v1) + p2 v2) + p3 v3, the same order as the lane's.
// Registers are free on the host: a thread holds R x G states of D floats.
#pragma once

#include "attention_decode.h"  // attn_merge_weight
#include "kv_table.h"

// The host shape's geometry at head_dim D: elements a lane holds, lanes a key,
// lane groups (keys a group takes per block: kAttnDecodeBlockKeys).
constexpr uint attn_rows_lane_elems(uint d) { return mkv_params::attn_decode_host_lane_elems(d); }
constexpr uint attn_rows_key_lanes(uint d) { return mkv_params::attn_decode_key_lanes_for(d, attn_rows_lane_elems(d)); }
constexpr uint attn_rows_groups(uint d) { return 32 / attn_rows_key_lanes(d); }

// One lane group's online softmax state over the whole row.
template <uint D>
struct AttnGroupState {
  float m;
  float l;
  float acc[D];
};

// Element e of the 4 keys of one lane group in a block, as a float4 over the
// keys: the 4 rows' f16 pieces e .. e+3 loaded as half4, transposed.
template <uint D>
inline void attn_rows_keys_t(const device half* k_base, thread const uint (&slot)[4], uint stride,
                             thread float4 (&kt)[D]) {
  for (uint e = 0; e < D; e += 4) {
    const float4 a = float4(*(const device half4*)(k_base + slot[0] * stride + e));
    const float4 b = float4(*(const device half4*)(k_base + slot[1] * stride + e));
    const float4 c = float4(*(const device half4*)(k_base + slot[2] * stride + e));
    const float4 d = float4(*(const device half4*)(k_base + slot[3] * stride + e));
    const float4 ab_lo = float4(a.x, b.x, a.y, b.y), ab_hi = float4(a.z, b.z, a.w, b.w);
    const float4 cd_lo = float4(c.x, d.x, c.y, d.y), cd_hi = float4(c.z, d.z, c.w, d.w);
    kt[e] = float4(ab_lo.xy, cd_lo.xy);
    kt[e + 1] = float4(ab_lo.zw, cd_lo.zw);
    kt[e + 2] = float4(ab_hi.xy, cd_hi.xy);
    kt[e + 3] = float4(ab_hi.zw, cd_hi.zw);
  }
}

// The scores of one lane group's 4 keys as the host shape's lane group sums
// each: lane j's partial over its EL elements (idle lanes: +0), then the xor
// butterfly, t_j = t_j + t_{j^x} for x = KL/2 .. 1 (lane 0's value; every
// lane's is the same: addition commutes).
template <uint D>
inline float4 attn_rows_scores(thread const float (&q)[D], thread const float4 (&kt)[D]) {
  constexpr uint EL = attn_rows_lane_elems(D), KL = attn_rows_key_lanes(D);
  float4 t[KL];
  for (uint j = 0; j < KL; ++j) {
    float4 d = float4(0.0f);
    if (j * EL < D)
      for (uint e = 0; e < EL; ++e) d += q[j * EL + e] * kt[j * EL + e];
    t[j] = d;
  }
  for (uint x = KL / 2; x > 0; x /= 2) {
    float4 n[KL];
    for (uint j = 0; j < KL; ++j) n[j] = t[j] + t[j ^ x];
    for (uint j = 0; j < KL; ++j) t[j] = n[j];
  }
  return t[0];
}

// Merges state b into a as the host shape's shuffle step does.
template <uint D>
inline void attn_rows_merge(thread AttnGroupState<D>& a, thread const AttnGroupState<D>& b) {
  const float m_all = max(a.m, b.m);
  const float w = attn_merge_weight(a.m, m_all), w_o = attn_merge_weight(b.m, m_all);
  a.l = a.l * w + b.l * w_o;
  for (uint e = 0; e < D; ++e) a.acc[e] = a.acc[e] * w + b.acc[e] * w_o;
  a.m = m_all;
}

// One lane group's online softmax step over its 4 keys of a block (scores
// sr, masked), returning the weights of the 4 keys; acc is rescaled later.
inline float4 attn_rows_softmax_step(thread float& m, thread float& l, float4 sr, thread float& factor) {
  const float m_new = max(m, max(max(sr.x, sr.y), max(sr.z, sr.w)));
  const float m_use = m_new == -INFINITY ? 0.0f : m_new;
  factor = exp2(m - m_use);
  const float4 pr = exp2(sr - m_use);
  l = l * factor + ((pr.x + pr.y) + (pr.z + pr.w));
  m = m_new;
  return pr;
}

template <uint D>
inline void attn_decode_rows_body(constant mkv_params::AttnDecode& p,
                                  const device float* q,      // (n_q_heads, D)
                                  const device uchar* kv,     // the layer's pool: K section, V section (f16)
                                  const device uint* table,   // block table: ceil(n_tokens / B) entries
                                  const device float* sinks,  // (n_q_heads) if has_sinks
                                  device float* out,          // (n_q_heads, D)
                                  uint2 tg, uint lane) {
  constexpr uint G = attn_rows_groups(D), U = mkv_params::kAttnDecodeBlockKeys;
  constexpr uint R = mkv_params::attn_decode_rows_heads(D);
  static_assert(U == 4, "a lane group's keys of a block are one float4");
  constexpr float LOG2E = 1.4426950408889634f;
  const AttnHeadBlock hb = attn_head_block(p, tg.x);
  if (lane != 0) return;  // one thread a threadgroup (the op's plan)
  const uint rows = min(hb.count, R);

  const uint n = p.n_tokens;
  const uint begin = (p.window > 0 && n > p.window) ? n - p.window : 0;
  const uint end = n;
  const bool capped = p.softcap > 0.0f;
  const float q_scale = capped ? p.scale : p.scale * LOG2E;
  const float cap_out = p.softcap * LOG2E;
  const float cap_in = capped ? 1.0f / p.softcap : 0.0f;
  float qr[R][D];
  for (uint r = 0; r < rows; ++r)
    for (uint e = 0; e < D; ++e) qr[r][e] = q[(hb.head0 + r) * D + e] * q_scale;

  const uint slot_stride = p.n_kv_heads * D;
  const device half* k_base = (const device half*)kv + hb.kv_head * D;
  const device half* v_base = k_base + p.slots * slot_stride;
  AttnGroupState<D> st[R][G];
  for (uint r = 0; r < rows; ++r)
    for (uint g = 0; g < G; ++g) {
      st[r][g].m = -INFINITY;
      st[r][g].l = 0.0f;
      for (uint e = 0; e < D; ++e) st[r][g].acc[e] = 0.0f;
    }

  float4 kt[D];
  for (uint i = begin; i < end; i += G * U) {
    for (uint g = 0; g < G; ++g) {
      uint slot[U];
      float4 valid;
      for (uint u = 0; u < U; ++u) {
        const uint pos = i + u * G + g;
        slot[u] = kv_slot(table, min(pos, end - 1));  // past the end: the last row again, masked
        valid[u] = pos < end ? 0.0f : -INFINITY;
      }
      attn_rows_keys_t<D>(k_base, slot, slot_stride, kt);
      float4 pr[R];
      float factor[R];
      for (uint r = 0; r < rows; ++r) {
        float4 sr = attn_rows_scores<D>(qr[r], kt);
        if (capped) sr = cap_out * tanh(sr * cap_in);
        sr += valid;
        pr[r] = attn_rows_softmax_step(st[r][g].m, st[r][g].l, sr, factor[r]);
      }
      for (uint e = 0; e < D; e += 4) {
        const float4 v0 = float4(*(const device half4*)(v_base + slot[0] * slot_stride + e));
        const float4 v1 = float4(*(const device half4*)(v_base + slot[1] * slot_stride + e));
        const float4 v2 = float4(*(const device half4*)(v_base + slot[2] * slot_stride + e));
        const float4 v3 = float4(*(const device half4*)(v_base + slot[3] * slot_stride + e));
        for (uint r = 0; r < rows; ++r) {
          thread float* acc = st[r][g].acc + e;
          float4 a = float4(acc[0], acc[1], acc[2], acc[3]) * factor[r];
          a += pr[r].x * v0;
          a += pr[r].y * v1;
          a += pr[r].z * v2;
          a += pr[r].w * v3;
          acc[0] = a.x;
          acc[1] = a.y;
          acc[2] = a.z;
          acc[3] = a.w;
        }
      }
    }
  }

  for (uint r = 0; r < rows; ++r) {
    // The lane groups' merge tree (xor partners 1, 2, 4 ... groups apart), as lane group 0 sees it.
    for (uint x = 1; x < G; x *= 2)
      for (uint g = 0; g + x < G; g += 2 * x) attn_rows_merge<D>(st[r][g], st[r][g + x]);

    // The one-SIMD-group merge through threadgroup memory, then the finish.
    const uint qh = hb.head0 + r;
    thread const AttnGroupState<D>& s = st[r][0];
    const float m_all = max(-INFINITY, s.m);
    const float w = attn_merge_weight(s.m, m_all);
    const float l_all = 0.0f + s.l * attn_merge_weight(s.m, m_all);
    const float sink2 = p.has_sinks ? sinks[qh] * LOG2E : 0.0f;
    for (uint e = 0; e < D; ++e) {
      const float o = 0.0f + s.acc[e] * w;
      out[qh * D + e] = attn_finish_sink<true>(m_all, l_all, o, p.has_sinks != 0, sink2);
    }
  }
}
