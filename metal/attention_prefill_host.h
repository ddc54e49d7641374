// The host executor's shape of prefill attention (the _h kernels of
// attention_prefill_host.metal, built for the host only): a lane is one query
// position with the heads of its head block (HR rows, whole head_dim each),
// reading its own keys straight from the pool, so the kernel has no
// collective and no barrier. The GPU shape (attention_prefill.h) spends one
// simd_sum per 4 keys and row and two barriers per staged tile; on the host
// every one of those is a rendezvous of 32 fibers, which made it most of a
// long prompt's prefill.
//
// Same results, bit for bit, as the GPU shape on the host: a score is summed
// as that shape sums it there (each lane's E-element partial of the GPU
// layout, from 0, then the partials in lane order, as the host's simd_sum
// folds them), the 4-key blocks are the same absolute ones (4i .. 4i + 3) in
// the same order (pool pass, then ring pass), and the online-softmax update
// and the finish are attention.h's, element by element.
//
// Geometry: grid (ceil(n_queries / 32), n_kv_heads * head_blocks), 32 threads;
// p.queries_per_tile = 32, p.heads_per_block <= attn_prefill_host_rows(D).
// Reads: each visible K/V row once per (query, KV head, head block), from the
// cache (the 32 lanes of a threadgroup read the same rows, close in time).
#pragma once

#include "attention.h"
#include "attention_host_params.h"
#include "kv_codec.h"
#include "kv_table.h"

// K or V rows of keys kp .. kp+3 of one KV head, widened to float; zero for keys
// outside [lo, hi], which the row never sees (their table entries may name
// blocks a window let go).
template <bool Quant, uint D>
inline void attn_prefill_host_load(constant mkv_params::AttnPrefill& p, const device uchar* section, uint fmt,
                                   const device uint* table, const device half* ring_rows, bool from_ring,
                                   uint kv_head, int kp, int lo, int hi, thread float (&out)[4][D]) {
  const uint slot_stride = p.n_kv_heads * D;
  for (uint j = 0; j < 4; ++j) {
    const int pos = kp + int(j);
    if (pos < lo || pos > hi) {
      for (uint e = 0; e < D; ++e) out[j][e] = 0.0f;
      continue;
    }
    if (from_ring || !Quant) {
      const device half* row = from_ring ? ring_rows + uint(pos) % p.ring_slots * slot_stride + kv_head * D
                                         : (const device half*)section + kv_slot(table, uint(pos)) * slot_stride + kv_head * D;
      for (uint c = 0; c < D; c += 4) {
        const float4 v = float4(*(const device half4*)(row + c));
        out[j][c] = v.x;
        out[j][c + 1] = v.y;
        out[j][c + 2] = v.z;
        out[j][c + 3] = v.w;
      }
    } else {
      constexpr uint B = mkv_params::kKvBlockTokens;
      const uint slot = kv_slot(table, uint(pos));
      for (uint c = 0; c < D; c += 4) {
        const float4 v = float4(mkv_kv::kv_load4(section, fmt, B, p.n_kv_heads, D, slot, kv_head, c));
        out[j][c] = v.x;
        out[j][c + 1] = v.y;
        out[j][c + 2] = v.z;
        out[j][c + 3] = v.w;
      }
    }
  }
}

// q.k of 4 keys summed in the GPU shape's order on the host (see the top).
template <uint D>
inline float4 attn_prefill_host_dot(thread const float (&q)[D], thread const float (&k)[4][D]) {
  constexpr uint E = mkv_params::attn_lane_elems(D);
  constexpr uint L = mkv_params::attn_lanes(D);
  float4 dot = float4(0.0f);
  for (uint l = 0; l < L; ++l) {
    float4 part = float4(0.0f);
    for (uint e = 0; e < E; ++e) {
      const uint i = l * E + e;
      part += q[i] * float4(k[0][i], k[1][i], k[2][i], k[3][i]);
    }
    dot = l == 0 ? part : dot + part;
  }
  if (L < 32) dot += float4(0.0f);  // the idle lanes' zeros (turns -0 into +0, as there)
  return dot;
}

template <bool Quant, uint D, uint HR>
inline void attn_prefill_host_body(constant mkv_params::AttnPrefill& p,
                                   const device float* q,      // (n_queries, n_q_heads, D)
                                   const device uchar* kv,     // the layer's pool: K section, V section
                                   const device uint* table,   // block table: ceil(n_tokens / B) entries
                                   const device uchar* ring,   // residual window (Quant, p.residual > 0)
                                   const device float* sinks,  // (n_q_heads) if has_sinks
                                   device float* out,          // (n_queries, n_q_heads, D)
                                   device float* logits,       // (n_queries, n_q_heads, n_tokens) if p.logits
                                   uint2 tg, uint lane) {
  const AttnHeadBlock hb = attn_head_block(p, tg.y);
  const uint kv_head = hb.kv_head, head0 = hb.head0, g = hb.count;
  const uint qi = tg.x * p.queries_per_tile + lane;
  if (qi >= p.n_queries) return;  // no collective below: a finished lane is fine
  const int qpos = int(p.q_pos0 + qi);
  const int lo = p.window > 0 ? max(0, qpos - int(p.window) + 1) : 0;

  AttnRows<D, HR> st;
  attn_rows_init(st);
  for (uint j = 0; j < g; ++j)
    for (uint e = 0; e < D; ++e) st.q[j][e] = q[(qi * p.n_q_heads + head0 + j) * D + e];

  const device uchar* v_section = kv + p.slots * mkv_params::kv_slot_bytes(p.k_format, p.n_kv_heads, D);
  const bool res = Quant && p.residual > 0;
  const device half* ring_k = (const device half*)ring;
  const device half* ring_v = ring_k + p.ring_slots * p.n_kv_heads * D;
  const int ring_from = res ? int(mkv_params::attn_ring_start(uint(qpos), p.residual, p.ring_lo)) : qpos + 1;
  const uint n_tokens = p.q_pos0 + p.n_queries;

  float kr[4][D];  // K of the block's 4 keys
  float vr[4][D];  // V of the block's 4 keys
  for (uint pass = 0; pass < (res ? 2u : 1u); ++pass) {
    const bool from_ring = pass == 1;
    const int plo = from_ring ? max(lo, ring_from) : lo;
    const int phi = from_ring ? qpos : min(qpos, ring_from - 1);
    for (int kp = plo & ~3; kp <= phi; kp += 4) {
      attn_prefill_host_load<Quant, D>(p, kv, p.k_format, table, ring_k, from_ring, kv_head, kp, plo, phi, kr);
      float4 s[HR];
      for (uint j = 0; j < HR; ++j)
        if (j < g) s[j] = attn_transform(attn_prefill_host_dot<D>(st.q[j], kr), p.scale, p.softcap);
      attn_prefill_host_load<Quant, D>(p, v_section, p.v_format, table, ring_v, from_ring, kv_head, kp, plo, phi, vr);
      for (uint j = 0; j < HR; ++j) {
        if (j >= g) continue;
        if (p.logits != 0) {  // a policy's logits, the row's visible keys
          device float* lg = logits + (qi * p.n_q_heads + head0 + j) * n_tokens;
          for (int c = 0; c < 4; ++c)
            if (kp + c >= plo && kp + c <= phi) lg[kp + c] = s[j][c];
        }
        attn_update(st, j, attn_mask(s[j], kp, plo, phi), vr);
      }
    }
  }

  for (uint j = 0; j < g; ++j) {
    const uint qh = head0 + j;
    const float sink = p.has_sinks ? sinks[qh] : 0.0f;
    device float* o = out + (qi * p.n_q_heads + qh) * D;
    for (uint e = 0; e < D; ++e) o[e] = attn_finish(st.m[j], st.l[j], st.acc[j][e], p.has_sinks != 0, sink);
  }
}
