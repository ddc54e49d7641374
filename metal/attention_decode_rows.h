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
// kernels; only the rendezvous are gone, and a policy's logits (p.logits) are
// the _lg_h kernels' to the bit. Single pass. Two kernels per head_dim:
//  - _f16: f16 K/V, bit-identical to attn_decode_f16_dD[_r4|_lg]_h;
//  - _kvq: K and V in any pair of formats (kv_format.h), each row dequantized
//    piece by piece as the kvq reader does (AttnKvQuant), and a residual
//    window's keys from the ring (p.residual: the pool's keys before the
//    window, then the window's, as two scans): bit-identical to
//    attn_decode_kvq_dD[_res|_lg|_r4]_h. Split-K keeps the _h kernels.
//
// Why this shape (docs/ATTENTION.md, "Decode on the host"): the cost is
// converting K/V from half and the per-element products, so
//  - a K or V row is converted once for the R heads that read it (a thread per
//    query head converted it R times), by half4 -> float4 (F16C) loads;
//  - the R heads' score partials are one float4 (q transposed once, (D, R)):
//    t_j += q[e][0..3] * k[e], the same sequential sum per head as the
//    SIMD-group lane's, for 4 heads at once; 4 keys x KL partials in flight;
//  - V accumulates a float4 of acc at a time across a group's 4 keys:
//    (((acc * f + p0 v0) + p1 v1) + p2 v2) + p3 v3, the lane's order;
//  - the G lane groups are cut into kAttnDecodeRowsParts threadgroups (3 KV
//    heads over 2 executor threads left one idle half the time): a part joins
//    its groups by the tree's first levels, attn_decode_rows_merge the parts
//    by the rest, then finishes. The tree pairs aligned blocks, so cutting it
//    at a level changes no value.
// Registers are free on the host: a thread holds R x G / parts states of D floats.
#pragma once

#include "attention_decode.h"  // attn_merge_weight
#include "attention_decode_readers.h"
#include "kv_table.h"

// A hint to fetch the next block's K/V rows while this block computes: the
// rows of a long context come from DRAM (30 layers x 1,500 keys of SmolLM2:
// 35 MB), and a lane group's rows 8 positions apart, 4 of them, defeat the
// hardware's stream prefetch. MSL has no such hint; these kernels are built
// for the host only, where it is the compiler's.
#if defined(__METALKV_HOST__)
#define MKV_ROWS_PREFETCH(p) __builtin_prefetch(p)
#else
#define MKV_ROWS_PREFETCH(p)
#endif

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

// Where the rows form's K and V rows come from, as floats (each row converted
// once for every head of the block), and which lines to fetch ahead:
//   AttnRowsF16    f16 rows of the pool (through the block table) or of the
//                  residual window's ring (by position)
//   AttnRowsQuant  rows of the pool in any formats, dequantized piece by
//                  piece as the kvq reader does (E elements a piece, the GPU
//                  shape's), so the floats are the _h kernels' own
template <uint D>
struct AttnRowsF16 {
  const device half* k_base;
  const device half* v_base;
  uint stride;      // halfs from one slot to the next
  uint ring_slots;  // 0: the pool (slots through the block table); else the ring's rows by position

  static AttnRowsF16 pool(constant mkv_params::AttnDecode& p, const device uchar* kv, uint kv_head) {
    AttnRowsF16 r;
    r.stride = p.n_kv_heads * D;
    r.k_base = (const device half*)kv + kv_head * D;
    r.v_base = r.k_base + p.slots * r.stride;
    r.ring_slots = 0;
    return r;
  }
  static AttnRowsF16 ring(constant mkv_params::AttnDecode& p, const device uchar* ring, uint kv_head) {
    AttnRowsF16 r;
    r.stride = p.n_kv_heads * D;
    r.k_base = (const device half*)ring + kv_head * D;
    r.v_base = r.k_base + p.ring_slots * r.stride;
    r.ring_slots = p.ring_slots;
    return r;
  }
  uint slot(const device uint* table, uint pos) const { return ring_slots ? pos % ring_slots : kv_slot(table, pos); }
  // (the whole row as lane 0's slice of D: half4 -> float4 loads)
  void k_row(uint slot, thread float (&out)[D]) const { load_slice<D, D>(k_base + slot * stride, 0, out); }
  // V is read where it is used, 4 halfs at a time (vr stays unused).
  void v_rows(thread const uint (&)[4], thread float (&)[4][D]) const {}
  float4 v4(thread const uint (&slot)[4], thread const float (&)[4][D], uint u, uint e) const {
    return float4(*(const device half4*)(v_base + slot[u] * stride + e));
  }
  void prefetch(uint slot) const {
    for (uint e = 0; e < D; e += 32) {  // a 64-byte line of 32 halfs
      MKV_ROWS_PREFETCH(k_base + slot * stride + e);
      MKV_ROWS_PREFETCH(v_base + slot * stride + e);
    }
  }
};

template <uint D>
struct AttnRowsQuant {
  enum { E = mkv_params::attn_decode_lane_elems(D) };  // the kvq reader's piece
  typedef AttnKvQuant<D, E> Reader;
  Reader rd;

  static AttnRowsQuant pool(constant mkv_params::AttnDecode& p, const device uchar* kv, uint kv_head) {
    AttnRowsQuant r;
    r.rd = Reader::make(p, kv, kv_head, 0);
    return r;
  }
  uint slot(const device uint* table, uint pos) const { return kv_slot(table, pos); }
  template <typename Section>
  static void row_floats(const device uchar* section, uint fmt, uint heads, uint head, uint slot,
                         thread float (&out)[D]) {
    for (uint e0 = 0; e0 < D; e0 += E) {
      float x[E];
      Section::widen(fmt, Section::read(section, fmt, heads, D, slot, head, e0), x);
      for (uint e = 0; e < E; ++e) out[e0 + e] = x[e];
    }
  }
  void k_row(uint slot, thread float (&out)[D]) const {
    row_floats<typename Reader::KS>(rd.k_section, rd.k_format, rd.heads, rd.head, slot, out);
  }
  // V's 4 rows dequantized first, then read from them.
  void v_rows(thread const uint (&slot)[4], thread float (&vr)[4][D]) const {
    for (uint u = 0; u < 4; ++u)
      row_floats<typename Reader::VS>(rd.v_section, rd.v_format, rd.heads, rd.head, slot[u], vr[u]);
  }
  float4 v4(thread const uint (&)[4], thread const float (&vr)[4][D], uint u, uint e) const {
    return float4(vr[u][e], vr[u][e + 1], vr[u][e + 2], vr[u][e + 3]);
  }
  void prefetch(uint slot) const {  // the rows' first codes (a q4 row of 128 is one line)
    MKV_ROWS_PREFETCH(rd.k_section + mkv_params::kv_data_offset(rd.k_format, mkv_params::kKvBlockTokens, rd.heads, D,
                                                                slot, rd.head, 0));
    MKV_ROWS_PREFETCH(rd.v_section + mkv_params::kv_data_offset(rd.v_format, mkv_params::kKvBlockTokens, rd.heads, D,
                                                                slot, rd.head, 0));
  }
};

// The scores of a lane group's 4 keys (K rows kr, as floats) for the block's R <= 4
// query heads at once, a float4 over the heads per key (qt[e] holds element e
// of each head's q): each head's score as the host shape's lane group sums
// it, lane j's partial over its EL elements (idle lanes: +0), then the xor
// butterfly, t_j = t_j + t_{j^x} for x = KL/2 .. 1 (lane 0's value; every
// lane's is the same: addition commutes). The 4 keys' KL partials are
// independent chains, unrolled so that they overlap. The rows are scalars in
// memory: each product reads its element as a broadcast operand of the multiply.
template <uint D>
inline void attn_rows_scores(thread const float4* qt,  // (D): element e of each head's q
                             thread const float (&kr)[4][D],
                             thread float4* sh) {  // (4 keys): the heads' scores
  constexpr uint EL = attn_rows_lane_elems(D), KL = attn_rows_key_lanes(D);
  float4 t[4][KL];
  MKV_UNROLL for (uint u = 0; u < 4; ++u)
    MKV_UNROLL for (uint j = 0; j < KL; ++j) t[u][j] = float4(0.0f);
  // Element e of every lane's piece, then the next: 4 x KL independent sums in flight.
  MKV_UNROLL for (uint e = 0; e < EL; ++e)
    MKV_UNROLL for (uint j = 0; j < KL; ++j) {
      if (j * EL < D) {
        MKV_UNROLL for (uint u = 0; u < 4; ++u) t[u][j] += qt[j * EL + e] * kr[u][j * EL + e];
      }
    }
  MKV_UNROLL for (uint u = 0; u < 4; ++u) {
    MKV_UNROLL for (uint x = KL / 2; x > 0; x /= 2) {
      float4 n[KL];
      MKV_UNROLL for (uint j = 0; j < KL; ++j) n[j] = t[u][j] + t[u][j ^ x];
      MKV_UNROLL for (uint j = 0; j < KL; ++j) t[u][j] = n[j];
    }
    sh[u] = t[u][0];
  }
}

// max as fmax computes it (the other operand where one is NaN; which zero of
// two does not matter here: m only enters as exp2(x - m)), without the libm call.
inline float attn_rows_max(float a, float b) { return (a > b || isnan(b)) ? a : b; }

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
  const float m_new = attn_rows_max(m, attn_rows_max(attn_rows_max(sr.x, sr.y), attn_rows_max(sr.z, sr.w)));
  const float m_use = m_new == -INFINITY ? 0.0f : m_new;
  factor = exp2(m - m_use);
  const float4 pr = exp2(sr - m_use);
  l = l * factor + ((pr.x + pr.y) + (pr.z + pr.w));
  m = m_new;
  return pr;
}

// Where one part's state starts in scratch: (n_q_heads, parts, D + 2) floats, acc then m, l.
inline uint attn_rows_part(uint d, uint qh, uint part) { return (qh * mkv_params::kAttnDecodeRowsParts + part) * (d + 2); }

// One part's lane groups [g0, g0 + GP) over positions [from, to) through
// reader rd, into their states st (the host shape's attn_decode_scan for each
// of those groups: blocks of G * 4 positions from `from`, group g's keys
// from + u * G + g, positions past `to` its last row again, masked).
template <uint D, typename RD, uint R, uint GP>
inline void attn_rows_scan(constant mkv_params::AttnDecode& p, thread const RD& rd, const device uint* table,
                           uint from, uint to, uint g0, uint rows, thread const float4* qt, bool capped,
                           float cap_out, float cap_in, device float* logits, uint head0,
                           thread AttnGroupState<D> (&st)[R][GP]) {
  constexpr uint G = attn_rows_groups(D), U = mkv_params::kAttnDecodeBlockKeys;
  const uint n = p.n_tokens;
  for (uint i = from; i < to; i += G * U) {
    for (uint gp = 0; gp < GP; ++gp) {
      const uint g = g0 + gp;
      uint slot[U];
      float4 valid;
      for (uint u = 0; u < U; ++u) {
        const uint pos = i + u * G + g;
        slot[u] = rd.slot(table, min(pos, to - 1));  // past the end: the last row again, masked
        valid[u] = pos < to ? 0.0f : -INFINITY;
      }
      for (uint u = 0; u < U; ++u) {  // the same group's rows of the next block
        const uint ahead = i + G * U + u * G + g;
        if (ahead < to) rd.prefetch(rd.slot(table, ahead));
      }
      float kr[U][D], vr[U][D];
      for (uint u = 0; u < U; ++u) rd.k_row(slot[u], kr[u]);
      float4 sh[U];  // (keys, heads)
      attn_rows_scores<D>(qt, kr, sh);
      // (heads, keys): head r's scores of the 4 keys as the lane group's float4.
      const float4 lo01 = float4(sh[0].x, sh[1].x, sh[0].y, sh[1].y), hi01 = float4(sh[0].z, sh[1].z, sh[0].w, sh[1].w);
      const float4 lo23 = float4(sh[2].x, sh[3].x, sh[2].y, sh[3].y), hi23 = float4(sh[2].z, sh[3].z, sh[2].w, sh[3].w);
      const float4 hs[4] = {float4(lo01.xy, lo23.xy), float4(lo01.zw, lo23.zw), float4(hi01.xy, hi23.xy),
                            float4(hi01.zw, hi23.zw)};
      float4 pr[R];
      float factor[R];
      for (uint r = 0; r < rows; ++r) {
        float4 sr = hs[r];
        if (capped) sr = cap_out * tanh(sr * cap_in);
        if (p.logits != 0) {  // a policy's logits, in the natural domain, as the _lg_h kernels write them
          device float* lg = logits + (head0 + r) * n;
          for (uint u = 0; u < U; ++u)
            if (i + u * G + g < to) lg[i + u * G + g] = sr[u] * 0.6931471805599453f;  // ln 2
        }
        sr += valid;
        pr[r] = attn_rows_softmax_step(st[r][gp].m, st[r][gp].l, sr, factor[r]);
      }
      rd.v_rows(slot, vr);
      for (uint e = 0; e < D; e += 4) {
        const float4 v0 = rd.v4(slot, vr, 0, e), v1 = rd.v4(slot, vr, 1, e);
        const float4 v2 = rd.v4(slot, vr, 2, e), v3 = rd.v4(slot, vr, 3, e);
        for (uint r = 0; r < rows; ++r) {
          thread float* acc = st[r][gp].acc + e;
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
}

// First kernel: threadgroup (head block, part), one thread: the part's lane
// groups [part * G / P, (part + 1) * G / P) over every visible key (through
// reader RD: AttnRowsF16 or AttnRowsQuant; the latter with a residual window
// reads the window's keys from the ring), joined by the merge tree's levels
// inside the part, into parts (attn_rows_part).
template <uint D, typename RD>
inline void attn_decode_rows_body(constant mkv_params::AttnDecode& p,
                                  const device float* q,      // (n_q_heads, D)
                                  const device uchar* kv,     // the layer's pool: K section, V section
                                  const device uint* table,   // block table: ceil(n_tokens / B) entries
                                  const device uchar* ring,   // the residual window (p.residual)
                                  device float* parts,        // (n_q_heads, parts, D + 2)
                                  device float* logits,       // (n_q_heads, n_tokens) if p.logits
                                  uint2 tg, uint lane) {
  constexpr uint G = attn_rows_groups(D), U = mkv_params::kAttnDecodeBlockKeys;
  constexpr uint R = mkv_params::attn_decode_rows_heads(D);
  constexpr uint GP = G / mkv_params::kAttnDecodeRowsParts;  // lane groups of a part
  static_assert(U == 4, "a lane group's keys of a block are one float4");
  static_assert(GP >= 1 && GP * mkv_params::kAttnDecodeRowsParts == G, "parts split the lane groups evenly");
  constexpr float LOG2E = 1.4426950408889634f;
  const AttnHeadBlock hb = attn_head_block(p, tg.x);
  if (lane != 0) return;  // one thread a threadgroup (the op's plan)
  const uint rows = min(hb.count, R);
  const uint g0 = tg.y * GP;

  const uint n = p.n_tokens;
  const uint begin = (p.window > 0 && n > p.window) ? n - p.window : 0;
  const uint end = n;
  const bool capped = p.softcap > 0.0f;
  const float q_scale = capped ? p.scale : p.scale * LOG2E;
  const float cap_out = p.softcap * LOG2E;
  const float cap_in = capped ? 1.0f / p.softcap : 0.0f;
  float4 qt[D];  // (D, heads): element e of each head's q, 0 past the block's heads
  for (uint e = 0; e < D; ++e) {
    qt[e] = float4(0.0f);
    for (uint r = 0; r < rows; ++r) qt[e][r] = q[(hb.head0 + r) * D + e] * q_scale;
  }

  AttnGroupState<D> st[R][GP];
  for (uint r = 0; r < rows; ++r)
    for (uint g = 0; g < GP; ++g) {
      st[r][g].m = -INFINITY;
      st[r][g].l = 0.0f;
      for (uint e = 0; e < D; ++e) st[r][g].acc[e] = 0.0f;
    }

  const RD rd = RD::pool(p, kv, hb.kv_head);
  if (p.residual > 0) {  // the pool's keys before the window, then the window's from the ring
    const uint w = min(max(mkv_params::attn_ring_start(n - 1, p.residual, p.ring_lo), begin), end);
    attn_rows_scan<D, RD, R, GP>(p, rd, table, begin, w, g0, rows, qt, capped, cap_out, cap_in, logits, hb.head0,
                                 st);
    const AttnRowsF16<D> rg = AttnRowsF16<D>::ring(p, ring, hb.kv_head);
    attn_rows_scan<D, AttnRowsF16<D>, R, GP>(p, rg, table, w, end, g0, rows, qt, capped, cap_out, cap_in, logits,
                                             hb.head0, st);
  } else {
    attn_rows_scan<D, RD, R, GP>(p, rd, table, begin, end, g0, rows, qt, capped, cap_out, cap_in, logits, hb.head0,
                                 st);
  }

  for (uint r = 0; r < rows; ++r) {
    // The merge tree's levels inside the part (xor partners 1, 2 ... groups
    // apart), as lane group g0 sees them.
    for (uint x = 1; x < GP; x *= 2)
      for (uint g = 0; g + x < GP; g += 2 * x) attn_rows_merge<D>(st[r][g], st[r][g + x]);
    device float* dst = parts + attn_rows_part(D, hb.head0 + r, tg.y);
    for (uint e = 0; e < D; ++e) dst[e] = st[r][0].acc[e];
    dst[D] = st[r][0].m;
    dst[D + 1] = st[r][0].l;
  }
}

// Second kernel: threadgroup = query head, one thread: the merge tree's
// remaining levels over the parts, then the one-SIMD-group merge through
// threadgroup memory and the finish, as the host shape's lane group 0 does them.
template <uint D>
inline void attn_decode_rows_merge_body(constant mkv_params::AttnDecode& p,
                                        const device float* parts,  // (n_q_heads, parts, D + 2)
                                        const device float* sinks,  // (n_q_heads) if has_sinks
                                        device float* out,          // (n_q_heads, D)
                                        uint qh, uint lane) {
  constexpr uint P = mkv_params::kAttnDecodeRowsParts;
  constexpr float LOG2E = 1.4426950408889634f;
  if (lane != 0) return;
  AttnGroupState<D> s[P];
  for (uint k = 0; k < P; ++k) {
    const device float* src = parts + attn_rows_part(D, qh, k);
    for (uint e = 0; e < D; ++e) s[k].acc[e] = src[e];
    s[k].m = src[D];
    s[k].l = src[D + 1];
  }
  for (uint x = 1; x < P; x *= 2)
    for (uint k = 0; k + x < P; k += 2 * x) attn_rows_merge<D>(s[k], s[k + x]);

  const float m_all = max(-INFINITY, s[0].m);
  const float w = attn_merge_weight(s[0].m, m_all);
  const float l_all = 0.0f + s[0].l * attn_merge_weight(s[0].m, m_all);
  const float sink2 = p.has_sinks ? sinks[qh] * LOG2E : 0.0f;
  for (uint e = 0; e < D; ++e) {
    const float o = 0.0f + s[0].acc[e] * w;
    out[qh * D + e] = attn_finish_sink<true>(m_all, l_all, o, p.has_sinks != 0, sink2);
  }
}
