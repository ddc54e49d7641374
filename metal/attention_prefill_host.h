// The host executor's shape of prefill attention (the _h kernels of
// attention_prefill_host.metal, built for the host only): a lane is one query
// position with the heads of its head block (HR rows, whole head_dim each),
// reading its own f16 keys straight from the pool, so the f16 kernels have no
// collective and no barrier. The GPU shape (attention_prefill.h) spends one
// simd_sum per 4 keys and row and two barriers per staged tile; on the host
// every one of those is a rendezvous of 32 fibers, which made it most of a
// long prompt's prefill. The kvq kernels dequantize the pool's rows once a
// threadgroup into threadgroup memory (attn_prefill_host_staged: two
// barriers per 32 keys, against each lane dequantizing every row itself).
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
// Reads: each visible f16 K/V row once per (query, KV head, head block), from
// the cache (the 32 lanes of a threadgroup read the same rows, close in time);
// each quantized one once per (threadgroup, KV head, head block).
#pragma once

#include "attention.h"
#include "attention_host_params.h"
#include "attention_prefill.h"  // attn_prefill_tile_keys
#include "kv_codec.h"
#include "kv_table.h"

// Keys a tile of the kvq kernels' staged pool pass holds (attn_prefill_host_staged):
// its K and V rows as half, 2 x 2 x keys x D bytes, 16 KiB at most.
constexpr uint attn_prefill_host_stage_keys(uint D) { return D <= 128 ? 32 : 16; }

// Where key `pos`'s row of one KV head lies: an f16 row (the pool's f16
// section, or the residual window's ring), or a slot of a quantized section;
// found once per key and block, not per element. Keys outside [lo, hi] are not
// visible: the row never sees them (their table entries may name blocks a
// window let go) and they read as zeros.
struct AttnHostKey {
  const device half* f16;  // the f16 row, or null for a quantized one
  uint slot;
  bool visible;
};

template <bool Quant, uint D>
inline AttnHostKey attn_prefill_host_key(constant mkv_params::AttnPrefill& p, const device uchar* section,
                                         const device uint* table, const device half* ring_rows, bool from_ring,
                                         uint kv_head, int pos, int lo, int hi) {
  AttnHostKey k{nullptr, 0u, pos >= lo && pos <= hi};
  if (!k.visible) return k;
  const uint slot_stride = p.n_kv_heads * D;
  if (from_ring) {
    k.f16 = ring_rows + uint(pos) % p.ring_slots * slot_stride + kv_head * D;
  } else {
    k.slot = kv_slot(table, uint(pos));
    if (!Quant) k.f16 = (const device half*)section + k.slot * slot_stride + kv_head * D;
  }
  return k;
}

// Elements c .. c + 3 of a key's row, widened to float (zeros if not visible).
template <uint D>
inline float4 attn_prefill_host_elems(constant mkv_params::AttnPrefill& p, const device uchar* section, uint fmt,
                                      thread const AttnHostKey& k, uint kv_head, uint c) {
  if (!k.visible) return float4(0.0f);
  if (k.f16) return float4(*(const device half4*)(k.f16 + c));
  return float4(mkv_kv::kv_load4(section, fmt, mkv_params::kKvBlockTokens, p.n_kv_heads, D, k.slot, kv_head, c));
}

// A key's whole row, widened to float, as attn_prefill_host_elems gives it 4
// elements at a time (zeros if not visible). q8 and q4 rows find their codes
// and scales once a row: code x scale (q4's codes offset by 8) rounded to
// half, kv_load4's values, without its offsets and format branches every 4
// elements.
template <uint D>
inline void attn_prefill_host_row(constant mkv_params::AttnPrefill& p, const device uchar* section, uint fmt,
                                  thread const AttnHostKey& k, uint kv_head, thread float* out) {
  if (k.visible && !k.f16 && (fmt == mkv_params::kKvQ8 || fmt == mkv_params::kKvQ4)) {
    constexpr uint B = mkv_params::kKvBlockTokens;
    const device uchar* data = section + mkv_params::kv_data_offset(fmt, B, p.n_kv_heads, D, k.slot, kv_head, 0);
    const device half* scales =
        (const device half*)(section + mkv_params::kv_param_offset(fmt, B, p.n_kv_heads, D, k.slot, kv_head, 0));
    const uint group = mkv_params::kv_group(fmt, D);
    for (uint c = 0; c < D; c += 4) {
      const float4 v = float4(mkv_kv::kv_codes4(fmt, data + (fmt == mkv_params::kKvQ8 ? c : c / 2),
                                                float(scales[c / group])));
      for (uint i = 0; i < 4; ++i) out[c + i] = v[i];
    }
    return;
  }
  for (uint c = 0; c < D; c += 4) {
    const float4 v = attn_prefill_host_elems<D>(p, section, fmt, k, kv_head, c);
    for (uint i = 0; i < 4; ++i) out[c + i] = v[i];
  }
}

// V rows of keys kp .. kp+3, key-major: out[j][e] (attention.h's attn_update).
template <bool Quant, uint D>
inline void attn_prefill_host_load(constant mkv_params::AttnPrefill& p, const device uchar* section, uint fmt,
                                   const device uint* table, const device half* ring_rows, bool from_ring,
                                   uint kv_head, int kp, int lo, int hi, thread float (&out)[4][D]) {
  for (uint j = 0; j < 4; ++j) {
    const AttnHostKey k = attn_prefill_host_key<Quant, D>(p, section, table, ring_rows, from_ring, kv_head,
                                                           kp + int(j), lo, hi);
    if (k.f16) {  // a visible f16 row: no branch inside
      for (uint c = 0; c < D; c += 4) {
        const float4 v = float4(*(const device half4*)(k.f16 + c));
        for (uint i = 0; i < 4; ++i) out[j][c + i] = v[i];
      }
      continue;
    }
    attn_prefill_host_row<D>(p, section, fmt, k, kv_head, out[j]);
  }
}

// 4 keys' rows of D halves (from the pool or from threadgroup memory: P is a
// half4 pointer of either space), element-major: out[e] = the 4 keys' element
// e, read a half4 a row at a time (one conversion for 4 elements).
template <uint D, typename P>
inline void attn_prefill_host_transpose(P r0, P r1, P r2, P r3, thread float4* out) {
  for (uint c = 0; c < D; c += 4) {
    const float4 a = float4(r0[c / 4]), b = float4(r1[c / 4]), e = float4(r2[c / 4]), f = float4(r3[c / 4]);
    out[c] = float4(a.x, b.x, e.x, f.x);
    out[c + 1] = float4(a.y, b.y, e.y, f.y);
    out[c + 2] = float4(a.z, b.z, e.z, f.z);
    out[c + 3] = float4(a.w, b.w, e.w, f.w);
  }
}

// K rows of keys kp .. kp+3, element-major: out[e] = the 4 keys' element e, so
// a score's multiply takes one vector, transposed once per block for every
// query head of the block (a 4x4 transpose per 4 elements).
template <bool Quant, uint D>
inline void attn_prefill_host_load_t(constant mkv_params::AttnPrefill& p, const device uchar* section, uint fmt,
                                     const device uint* table, const device half* ring_rows, bool from_ring,
                                     uint kv_head, int kp, int lo, int hi, thread float4* out) {
  AttnHostKey k[4];
  for (uint j = 0; j < 4; ++j)
    k[j] = attn_prefill_host_key<Quant, D>(p, section, table, ring_rows, from_ring, kv_head, kp + int(j), lo, hi);
  if (k[0].f16 && k[1].f16 && k[2].f16 && k[3].f16) {  // the common block: 4 visible f16 rows, no branch inside
    attn_prefill_host_transpose<D>((const device half4*)k[0].f16, (const device half4*)k[1].f16,
                                   (const device half4*)k[2].f16, (const device half4*)k[3].f16, out);
    return;
  }
  float r[4][D];
  for (uint j = 0; j < 4; ++j) attn_prefill_host_row<D>(p, section, fmt, k[j], kv_head, r[j]);
  for (uint e = 0; e < D; ++e) out[e] = float4(r[0][e], r[1][e], r[2][e], r[3][e]);
}

// q.k of 4 keys for each of the block's first G query heads, each summed in
// the GPU shape's order on the host (see the top). The heads go side by side:
// each head's sum is a chain of L dependent adds, and one head alone waits on
// it. G is a template parameter so the loop has no branch (attn_prefill_host_dots
// picks it from the block's head count).
template <uint D, uint HR, uint G>
inline void attn_prefill_host_dots_g(thread const float (&q)[HR][D], thread const float4* kt,
                                     thread float4* dot) {
  constexpr uint E = mkv_params::attn_lane_elems(D);
  constexpr uint L = mkv_params::attn_lanes(D);
  for (uint l = 0; l < L; ++l)
    for (uint j = 0; j < G; ++j) {
      float4 part = float4(0.0f);
      for (uint e = 0; e < E; ++e) part += q[j][l * E + e] * kt[l * E + e];
      dot[j] = l == 0 ? part : dot[j] + part;
    }
  if (L < 32)
    for (uint j = 0; j < G; ++j) dot[j] += float4(0.0f);  // the idle lanes' zeros (turns -0 into +0, as there)
}

template <uint D, uint HR>
inline void attn_prefill_host_dots(thread const float (&q)[HR][D], thread const float4* kt, uint g,
                                   thread float4* dot) {
  static_assert(HR >= 1 && HR <= 4, "the cases below");
  if (g >= 4 && HR >= 4) attn_prefill_host_dots_g<D, HR, (HR >= 4 ? 4 : HR)>(q, kt, dot);
  else if (g == 3 && HR >= 3) attn_prefill_host_dots_g<D, HR, (HR >= 3 ? 3 : HR)>(q, kt, dot);
  else if (g == 2 && HR >= 2) attn_prefill_host_dots_g<D, HR, (HR >= 2 ? 2 : HR)>(q, kt, dot);
  else attn_prefill_host_dots_g<D, HR, 1>(q, kt, dot);
}

// One 4-key block of one row's pass: the scores of the block's query heads, a
// policy's logits, the online-softmax step. kt and vr hold the block's K
// (element-major) and V (key-major), zeros where the row does not see a key.
template <uint D, uint HR>
inline void attn_prefill_host_step(constant mkv_params::AttnPrefill& p, thread AttnRows<D, HR>& st,
                                   thread const float4* kt, thread const float (&vr)[4][D], uint g, int kp,
                                   int plo, int phi, device float* logits, uint qi, uint head0, uint n_tokens) {
  float4 s[HR];
  attn_prefill_host_dots<D, HR>(st.q, kt, g, s);
  for (uint j = 0; j < HR; ++j) {
    if (j >= g) continue;
    s[j] = attn_transform(s[j], p.scale, p.softcap);
    if (p.logits != 0) {  // a policy's logits, the row's visible keys
      device float* lg = logits + (qi * p.n_q_heads + head0 + j) * n_tokens;
      for (int c = 0; c < 4; ++c)
        if (kp + c >= plo && kp + c <= phi) lg[kp + c] = s[j][c];
    }
    attn_update(st, j, attn_mask(s[j], kp, plo, phi), vr);
  }
}

// The kvq kernels' pool pass, with the quantized rows dequantized once a
// threadgroup: tiles of attn_prefill_host_stage_keys(D) keys of the
// threadgroup's key range (attn_prefill_tile_keys, as the GPU shape stages
// them), lane j dequantizing key j's K and V rows into threadgroup memory as
// half (their values are halves: kv_load4's), then every lane reading its own
// visible keys of the tile from there, zeros for the rest, as
// attn_prefill_host_load(_t) give them. So the values, the 4-key blocks and
// their order are the unstaged loop's, and so are the results, bit for bit;
// each row is dequantized once a threadgroup instead of once a query (32x
// fewer), for two barriers a tile.
template <uint D, uint HR>
inline void attn_prefill_host_staged(constant mkv_params::AttnPrefill& p, thread AttnRows<D, HR>& st,
                                     const device uchar* kv, const device uchar* v_section, const device uint* table,
                                     uint kv_head, int2 tile_keys, bool live, int plo, int phi, uint g,
                                     device float* logits, uint qi, uint head0, uint n_tokens,
                                     threadgroup half* k_stage, threadgroup half* v_stage, uint lane) {
  constexpr uint TK = attn_prefill_host_stage_keys(D);
  float4 kt[D];
  float vr[4][D];
  for (int t0 = tile_keys.x & ~int(TK - 1); t0 <= tile_keys.y; t0 += int(TK)) {
    if (lane < TK) {
      const int key = t0 + int(lane);
      float row[D];
      const AttnHostKey k = attn_prefill_host_key<true, D>(p, kv, table, nullptr, false, kv_head, key, tile_keys.x,
                                                            tile_keys.y);
      attn_prefill_host_row<D>(p, kv, p.k_format, k, kv_head, row);
      for (uint e = 0; e < D; ++e) k_stage[lane * D + e] = half(row[e]);
      attn_prefill_host_row<D>(p, v_section, p.v_format, k, kv_head, row);
      for (uint e = 0; e < D; ++e) v_stage[lane * D + e] = half(row[e]);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    const int last = min(phi, t0 + int(TK) - 1);
    for (int kp = max(t0, plo & ~3); live && kp <= last; kp += 4) {
      const threadgroup half* kr = k_stage + uint(kp - t0) * D;
      const threadgroup half* vv = v_stage + uint(kp - t0) * D;
      if (kp >= plo && kp + 3 <= phi) {  // the common block: the row sees all 4 keys
        const threadgroup half4* k4 = (const threadgroup half4*)kr;
        attn_prefill_host_transpose<D>(k4, k4 + D / 4, k4 + D / 2, k4 + 3 * D / 4, kt);
        for (uint j = 0; j < 4; ++j)
          for (uint c = 0; c < D; c += 4) {
            const float4 x = float4(*(const threadgroup half4*)(vv + j * D + c));
            for (uint i = 0; i < 4; ++i) vr[j][c + i] = x[i];
          }
      } else {
        for (uint j = 0; j < 4; ++j) {
          const bool seen = kp + int(j) >= plo && kp + int(j) <= phi;
          for (uint e = 0; e < D; ++e) {
            kt[e][j] = seen ? float(kr[j * D + e]) : 0.0f;
            vr[j][e] = seen ? float(vv[j * D + e]) : 0.0f;
          }
        }
      }
      attn_prefill_host_step<D, HR>(p, st, kt, vr, g, kp, plo, phi, logits, qi, head0, n_tokens);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);  // before the next tile overwrites these
  }
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
                                   threadgroup half* k_stage,  // Quant: (attn_prefill_host_stage_keys(D), D)
                                   threadgroup half* v_stage,  // the same for V
                                   uint2 tg, uint lane) {
  const AttnHeadBlock hb = attn_head_block(p, tg.y);
  const uint kv_head = hb.kv_head, head0 = hb.head0, g = hb.count;
  const uint qi0 = tg.x * p.queries_per_tile, qi = qi0 + lane;
  // A lane past n_queries has nothing to compute; in the kvq kernels it still
  // stages and meets the barriers.
  const bool live = qi < p.n_queries;
  if (!Quant && !live) return;
  const int qpos = int(p.q_pos0 + qi);
  const int lo = p.window > 0 ? max(0, qpos - int(p.window) + 1) : 0;
  const int hi = live ? attn_prefill_row_hi(p, qpos) : -1;  // (attention.h)

  AttnRows<D, HR> st;
  attn_rows_init(st);
  if (live)
    for (uint j = 0; j < g; ++j)
      for (uint e = 0; e < D; ++e) st.q[j][e] = q[(qi * p.n_q_heads + head0 + j) * D + e];

  const device uchar* v_section = kv + p.slots * mkv_params::kv_slot_bytes(p.k_format, p.n_kv_heads, D);
  const bool res = Quant && p.residual > 0;
  const device half* ring_k = (const device half*)ring;
  const device half* ring_v = ring_k + p.ring_slots * p.n_kv_heads * D;
  const int ring_from = res ? int(mkv_params::attn_ring_start(uint(max(hi, 0)), p.residual, p.ring_lo)) : hi + 1;
  const uint n_tokens = p.q_pos0 + p.n_queries;

  float4 kt[D];    // K of the block's 4 keys, element-major
  float vr[4][D];  // V of the block's 4 keys
  for (uint pass = 0; pass < (res ? 2u : 1u); ++pass) {
    const bool from_ring = pass == 1;
    const int plo = from_ring ? max(lo, ring_from) : lo;
    const int phi = from_ring ? hi : min(hi, ring_from - 1);
    if (Quant && !from_ring) {  // quantized rows: staged once a threadgroup
      const AttnTileKeys keys = attn_prefill_tile_keys<Quant>(p, qi0, min(p.queries_per_tile, p.n_queries - qi0));
      attn_prefill_host_staged<D, HR>(p, st, kv, v_section, table, kv_head, attn_prefill_pass_keys(keys, false), live,
                                      plo, phi, g, logits, qi, head0, n_tokens, k_stage, v_stage, lane);
      continue;
    }
    for (int kp = plo & ~3; live && kp <= phi; kp += 4) {
      attn_prefill_host_load_t<Quant, D>(p, kv, p.k_format, table, ring_k, from_ring, kv_head, kp, plo, phi, kt);
      attn_prefill_host_load<Quant, D>(p, v_section, p.v_format, table, ring_v, from_ring, kv_head, kp, plo, phi, vr);
      attn_prefill_host_step<D, HR>(p, st, kt, vr, g, kp, plo, phi, logits, qi, head0, n_tokens);
    }
  }
  if (!live) return;

  for (uint j = 0; j < g; ++j) {
    const uint qh = head0 + j;
    const float sink = p.has_sinks ? sinks[qh] : 0.0f;
    device float* o = out + (qi * p.n_q_heads + qh) * D;
    for (uint e = 0; e < D; ++e) o[e] = attn_finish(st.m[j], st.l[j], st.acc[j][e], p.has_sinks != 0, sink);
  }
}
