// The host executor's decode attention without collectives (the _rows_h
// kernels of attention_decode_rows.metal, built for the host only): a lane
// computes one query head's row alone, replaying what the host shape's
// SIMD-group (attention_decode.h with S = 1 and EL = attn_decode_host_lane_elems)
// computes for it, value for value: the G lane groups' own online softmax
// states over their keys (positions i + u*G + g of each block of G * 4), each
// score as KL lane partials of EL elements summed by the xor butterfly, the
// groups merged by the same tree at the end, then the one-SIMD-group merge and
// the finish. Results are bit-identical to the _h kernels; only the
// rendezvous are gone (2 per row and 32 keys, each 32 fiber switches, made
// decode at 1.5k tokens twice as slow as at 100). f16 K/V, single pass, no
// residual window, no logits: the op keeps the _h kernels for the rest.
//
// Registers are free on the host: a lane holds G states of D floats.
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

// The score of one key as the host shape's lane group sums it: each of the KL
// lanes' partial over its EL elements (idle lanes: +0), then the xor
// butterfly, t_j = t_j + t_{j^x} for x = KL/2 .. 1 (the same value on every
// lane: addition commutes).
template <uint D>
inline float attn_rows_score(thread const float (&q)[D], const device half* k) {
  constexpr uint EL = attn_rows_lane_elems(D), KL = attn_rows_key_lanes(D);
  float t[KL];
  for (uint j = 0; j < KL; ++j) {
    float d = 0.0f;
    if (j * EL < D)
      for (uint e = 0; e < EL; ++e) d += q[j * EL + e] * float(k[j * EL + e]);
    t[j] = d;
  }
  for (uint x = KL / 2; x > 0; x /= 2) {
    float n[KL];
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

template <uint D>
inline void attn_decode_rows_body(constant mkv_params::AttnDecode& p,
                                  const device float* q,      // (n_q_heads, D)
                                  const device uchar* kv,     // the layer's pool: K section, V section (f16)
                                  const device uint* table,   // block table: ceil(n_tokens / B) entries
                                  const device float* sinks,  // (n_q_heads) if has_sinks
                                  device float* out,          // (n_q_heads, D)
                                  uint2 tg, uint lane) {
  constexpr uint G = attn_rows_groups(D), U = mkv_params::kAttnDecodeBlockKeys;
  constexpr float LOG2E = 1.4426950408889634f;
  const AttnHeadBlock hb = attn_head_block(p, tg.x);
  if (lane >= hb.count) return;  // no collective below: a finished lane is fine
  const uint qh = hb.head0 + lane;

  const uint n = p.n_tokens;
  const uint begin = (p.window > 0 && n > p.window) ? n - p.window : 0;
  const uint end = n;
  const bool capped = p.softcap > 0.0f;
  const float q_scale = capped ? p.scale : p.scale * LOG2E;
  const float cap_out = p.softcap * LOG2E;
  const float cap_in = capped ? 1.0f / p.softcap : 0.0f;
  float qr[D];
  for (uint e = 0; e < D; ++e) qr[e] = q[qh * D + e] * q_scale;

  const uint slot_stride = p.n_kv_heads * D;
  const device half* k_base = (const device half*)kv + hb.kv_head * D;
  const device half* v_base = k_base + p.slots * slot_stride;
  AttnGroupState<D> st[G];
  for (uint g = 0; g < G; ++g) {
    st[g].m = -INFINITY;
    st[g].l = 0.0f;
    for (uint e = 0; e < D; ++e) st[g].acc[e] = 0.0f;
  }

  for (uint i = begin; i < end; i += G * U) {
    for (uint g = 0; g < G; ++g) {
      uint slot[U];
      float4 sr;
      for (uint u = 0; u < U; ++u) {
        const uint pos = min(i + u * G + g, end - 1);  // past the end: the last row again, masked
        slot[u] = kv_slot(table, pos);
        sr[u] = attn_rows_score<D>(qr, k_base + slot[u] * slot_stride);
      }
      if (capped) sr = cap_out * tanh(sr * cap_in);
      float4 valid;
      for (uint u = 0; u < U; ++u) valid[u] = (i + u * G + g < end) ? 0.0f : -INFINITY;
      sr += valid;
      thread AttnGroupState<D>& s = st[g];
      const float m_new = max(s.m, max(max(sr.x, sr.y), max(sr.z, sr.w)));
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      const float factor = exp2(s.m - m_use);
      const float4 pr = exp2(sr - m_use);
      s.l = s.l * factor + ((pr.x + pr.y) + (pr.z + pr.w));
      s.m = m_new;
      for (uint e = 0; e < D; ++e) s.acc[e] *= factor;
      for (uint u = 0; u < U; ++u) {
        const device half* v = v_base + slot[u] * slot_stride;
        for (uint e = 0; e < D; ++e) s.acc[e] += pr[u] * float(v[e]);
      }
    }
  }

  // The lane groups' merge tree (xor partners 1, 2, 4 ... groups apart), as lane group 0 sees it.
  for (uint x = 1; x < G; x *= 2)
    for (uint g = 0; g + x < G; g += 2 * x) attn_rows_merge<D>(st[g], st[g + x]);

  // The one-SIMD-group merge through threadgroup memory, then the finish.
  const float m_all = max(-INFINITY, st[0].m);
  const float w = attn_merge_weight(st[0].m, m_all);
  const float l_all = 0.0f + st[0].l * attn_merge_weight(st[0].m, m_all);
  const float sink2 = p.has_sinks ? sinks[qh] * LOG2E : 0.0f;
  for (uint e = 0; e < D; ++e) {
    const float o = 0.0f + st[0].acc[e] * w;
    out[qh * D + e] = attn_finish_sink<true>(m_all, l_all, o, p.has_sinks != 0, sink2);
  }
}
