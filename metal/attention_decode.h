// Decode attention body: one query per query head (position n_tokens - 1)
// against one layer's KV cache, f16 or quantized K/V (dequantized in
// registers: AttnKvQuant), f32 accumulation. Bound by reading
// K and V, so the layout is chosen for bytes in flight and few instructions
// per byte (docs/ATTENTION.md, "Decode").
//
// Geometry. A threadgroup of S SIMD-groups (single pass: kAttnSimdgroups = 8;
// split: kAttnDecodeSplitSimdgroups = 4) serves one KV head
// and a block of up to R = attn_decode_rows(D) query heads that share it
// (native GQA/MQA), over one chunk of key positions (all of them unless
// split-K). Inside a SIMD-group, KL = attn_decode_key_lanes(D) lanes share a
// key: lane j of a lane group owns the E = attn_decode_lane_elems(D) halfs
// [j*E, j*E + E) of every q, K, V and acc row (one 16-byte piece for E = 8,
// 8 bytes for E = 4), so the G = 32 / KL lane groups read G whole rows per
// load instruction. A SIMD-group takes blocks of G * 4 consecutive positions,
// lane group g the positions base + u*G + g (u < 4), one block every
// S blocks. Per block each lane issues its 4 K and 4 V loads before any
// math (the default kernels prefetch: the next block's loads go out before
// this block's math), forms partial dots with every query row (scores of the
// 4 keys travel as a float4), reduces them with log2(KL) simd_shuffle_xor steps
// inside its lane group, and updates its lane group's own online softmax
// (m, l, acc) per row with one rescale per block. At the end the lane groups
// merge by shuffles, the SIMD-groups through threadgroup memory.
//
// The host executor's shape (the _h kernels, attention_decode_host.metal)
// is the same code with two parameters changed: a lane holds EL =
// attn_decode_host_lane_elems(D) elements of each row (EL / E pieces, read
// through EL / E readers), so fewer lanes share a key and its scores take
// fewer shuffle steps, and a threadgroup is one SIMD-group.
//
// Scores are kept in the log2 domain (q is pre-scaled by scale * log2(e), so
// exp becomes exp2); m in the split partials is log2-scaled too.
//
// Read count: every K and V element of the visible range is loaded exactly
// once per (KV head, head block) — once per decode step when group_size <= R,
// ceil(group_size / R) times otherwise. Masked or out-of-window slots are
// never read: the chunk loops over positions [lo, n_tokens) and maps position
// p to its slot through the block table (kv_slot; positions past the chunk's
// end load its last row again and are masked; that row is in cache already).
#pragma once

#include "attention.h"
#include "attention_decode_readers.h"
#include "kv_table.h"

// Weight exp2(m - m_all) of a state with max m in a merge whose max is m_all;
// 0 for a state that saw no key (m = -inf), also when none did.
inline float attn_merge_weight(float m, float m_all) {
  return m_all == -INFINITY ? 0.0f : exp2(m - m_all);
}

// The K and V pieces of lane group `group` for the block of positions at i:
// positions i + u*G + group (u < U), clamped to the chunk's last one; the
// lane's P pieces of each row through its P readers.
template <typename L, uint U, uint G, uint P>
inline void attn_decode_load_block(thread const L (&ld)[P], const device uint* table, uint i, uint group, uint end,
                                   thread typename L::KPiece (&kw)[U][P], thread typename L::VPiece (&vw)[U][P]) {
  // The U positions span (U - 1) * G + 1 <= 13 < kKvBlockTokens: at most two
  // table entries, loaded once for the block.
  const uint first = min(i + group, end - 1);
  const uint b0 = kv_block(first);
  const uint e0 = table[b0], e1 = table[kv_block(min(i + (U - 1) * G + group, end - 1))];
  MKV_UNROLL for (uint u = 0; u < U; ++u) {
    const uint pos = min(i + u * G + group, end - 1);
    const uint slot = ld[0].slot(kv_block(pos) == b0 ? e0 : e1, pos);
    MKV_UNROLL for (uint j = 0; j < P; ++j) ld[j].load(slot, kw[u][j], vw[u][j]);
  }
}

// One SIMD-group's online softmax over positions [begin, end) of a chunk
// through reader ld (blocks of BLOCK positions, one every S blocks), into
// its lane group's (m, l, acc) per query row.
template <typename L, uint D, uint EL, uint R, uint S, bool LG, uint P = EL / L::kElems>
inline void attn_decode_scan(thread const L (&ld)[P], const device uint* table, uint begin, uint end, uint simd,
                             uint group, bool prefetch, bool capped, float cap_out, float cap_in,
                             thread const float (&qr)[R][EL], thread float (&acc)[R][EL],
                             thread float (&m)[R], thread float (&l)[R],
                             device float* lg, uint lg_stride, uint lg_rows) {
  constexpr uint KL = mkv_params::attn_decode_key_lanes_for(D, EL);
  constexpr uint G = 32 / KL;
  constexpr uint U = mkv_params::kAttnDecodeBlockKeys;
  constexpr uint BLOCK = G * U;
  typedef typename L::KPiece KPiece;
  typedef typename L::VPiece VPiece;
  // Issue all 2U loads of a block before any math: positions past the
  // chunk's end read its last row again (masked below). `prefetch` also
  // issues the next block's loads before this block's math (2 U E / 2 more
  // registers).
  KPiece kw[U][P];
  VPiece vw[U][P];
  KPiece kn[U][P];
  VPiece vn[U][P];
  const uint first = begin + simd * BLOCK;
  if (prefetch && first < end) attn_decode_load_block<L, U, G, P>(ld, table, first, group, end, kw, vw);
  for (uint i = first; i < end; i += S * BLOCK) {
    if (prefetch) {
      if (i + S * BLOCK < end)
        attn_decode_load_block<L, U, G, P>(ld, table, i + S * BLOCK, group, end, kn, vn);
    } else {
      attn_decode_load_block<L, U, G, P>(ld, table, i, group, end, kw, vw);
    }
    // Partial dots, then the sum over the lane group (the xor masks stay inside it).
    float4 s[R];
    MKV_UNROLL for (uint r = 0; r < R; ++r) s[r] = float4(0.0f);
    MKV_UNROLL for (uint u = 0; u < U; ++u) {
      float k[EL];
      attn_unpack_lane<AttnSideK, L, P, EL>(ld, kw[u], k);
      MKV_UNROLL for (uint r = 0; r < R; ++r) {
        float d = 0.0f;
        MKV_UNROLL for (uint e = 0; e < EL; ++e) d += qr[r][e] * k[e];
        s[r][u] = d;
      }
    }
    MKV_UNROLL for (uint r = 0; r < R; ++r) {
      MKV_UNROLL for (uint x = KL / 2; x > 0; x /= 2) s[r] += simd_shuffle_xor(s[r], ushort(x));
    }
    // Mask, softcap, and one online-softmax rescale per row and block.
    float4 valid;
    MKV_UNROLL for (uint u = 0; u < U; ++u) valid[u] = (i + u * G + group < end) ? 0.0f : -INFINITY;
    float4 pr[R];
    MKV_UNROLL for (uint r = 0; r < R; ++r) {
      float4 sr = s[r];
      if (capped) sr = cap_out * tanh(sr * cap_in);
      if (LG && r < lg_rows) {  // a policy's logits (_lg kernels): one lane of each lane group writes its keys'
        MKV_UNROLL for (uint u = 0; u < U; ++u)
          if (i + u * G + group < end) lg[r * lg_stride + i + u * G + group] = sr[u] * 0.6931471805599453f;  // ln 2: the natural domain
      }
      sr += valid;  // -inf for the masked keys
      const float m_new = max(m[r], max(max(sr.x, sr.y), max(sr.z, sr.w)));
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // nothing visible yet: all weights 0
      const float factor = exp2(m[r] - m_use);
      pr[r] = exp2(sr - m_use);
      l[r] = l[r] * factor + ((pr[r].x + pr[r].y) + (pr[r].z + pr[r].w));
      m[r] = m_new;
      MKV_UNROLL for (uint e = 0; e < EL; ++e) acc[r][e] *= factor;
    }
    MKV_UNROLL for (uint u = 0; u < U; ++u) {
      float v[EL];
      attn_unpack_lane<AttnSideV, L, P, EL>(ld, vw[u], v);
      MKV_UNROLL for (uint r = 0; r < R; ++r) {
        MKV_UNROLL for (uint e = 0; e < EL; ++e) acc[r][e] += pr[r][u] * v[e];
      }
    }
    if (prefetch) {
      MKV_UNROLL for (uint u = 0; u < U; ++u) {
        MKV_UNROLL for (uint j = 0; j < P; ++j) {
          kw[u][j] = kn[u][j];
          vw[u][j] = vn[u][j];
        }
      }
    }
  }

}

// Writes (split) the chunk's unnormalised output and (max, sum) per query
// head, or (single pass) the normalised output, sinks folded in. R: query
// rows held (<= attn_decode_rows(D)); prefetch: the next block's loads go
// out before this block's math (a constant of each kernel, like split);
// S: SIMD-groups per threadgroup; RES: the cache has a residual window
// (keys from S(n - 1) on are read from the ring); LG: the _lg kernels, which
// also write every key's logit for an eviction policy when p.logits (a
// compile-time choice: the write costs the other kernels registers and so
// occupancy, measured on the H200: 45.4 -> 51.4 us at 8B/32k f16); EL: the
// elements of a row each lane holds, EL / E of the reader's pieces (the GPU
// shape: one piece; the host's: attn_decode_host_lane_elems).
template <typename L, uint D, uint R, uint S, bool RES = false, bool LG = false, uint EL = L::kElems>
inline void attn_decode_body(constant mkv_params::AttnDecode& p,
                             const device float* q,      // (n_q_heads, D)
                             const device uchar* kv,     // the layer's pool: K section, V section
                             const device uint* table,   // block table: ceil(n_tokens / B) entries
                             const device uchar* ring,   // the residual window (RES)
                             const device float* sinks,  // (n_q_heads) if has_sinks
                             device float* out,          // (n_q_heads, D)            single pass
                             device float* part_o,       // (n_q_heads, n_chunks, D)  split
                             device float* part_ml,      // (n_q_heads, n_chunks, 2)  split
                             device float* logits,       // (n_q_heads, n_tokens) if p.logits
                             threadgroup float* tg_m,    // (S, R)
                             threadgroup float* tg_l,    // (S, R)
                             threadgroup float* tg_acc,  // (S, D)
                             uint2 tg, uint tid, uint simd, uint lane, bool split,
                             bool prefetch) {
  constexpr uint E = L::kElems;                             // elements of a piece
  constexpr uint P = EL / E;                                // pieces a lane holds
  static_assert(P * E == EL && D % EL == 0, "a lane holds whole pieces, a row whole lanes' worth");
  constexpr uint KL = mkv_params::attn_decode_key_lanes_for(D, EL);  // lanes a key (the scan's geometry)
  constexpr float LOG2E = 1.4426950408889634f;
  const AttnHeadBlock hb = attn_head_block(p, tg.x);
  const uint kv_head = hb.kv_head, head0 = hb.head0, rows = hb.count;
  const uint group = lane / KL, piece = lane % KL;
  const bool owns = KL * EL == D || piece * EL < D;  // folds to true when D / EL is a power of two

  // Visible positions [lo, n): the whole history, or the last `window`.
  const uint n = p.n_tokens;
  const uint lo = (p.window > 0 && n > p.window) ? n - p.window : 0;
  const uint begin = lo + tg.y * p.chunk_keys;
  const uint end = min(begin + p.chunk_keys, n);
  // Idle lanes load their group's last piece again (same row, no extra
  // traffic) so every load is unconditional; their q is 0, and they never store.
  const uint piece_read = owns ? piece : D / EL - 1;
  L ld[P];
  MKV_UNROLL for (uint j = 0; j < P; ++j) ld[j] = L::make(p, kv, kv_head, piece_read * EL + j * E);

  // q pre-scaled: scores come out in the log2 domain, or (softcap) in the
  // natural one for tanh, scaled by log2(e) after it.
  const bool capped = p.softcap > 0.0f;
  const float q_scale = capped ? p.scale : p.scale * LOG2E;
  const float cap_out = p.softcap * LOG2E;
  const float cap_in = capped ? 1.0f / p.softcap : 0.0f;
  float qr[R][EL];
  float acc[R][EL];
  float m[R];
  float l[R];
  MKV_UNROLL for (uint r = 0; r < R; ++r) {
    MKV_UNROLL for (uint e = 0; e < EL; ++e) {
      qr[r][e] = (r < rows && owns) ? q[(head0 + r) * D + piece * EL + e] * q_scale : 0.0f;
      acc[r][e] = 0.0f;
    }
    m[r] = -INFINITY;
    l[r] = 0.0f;
  }

  // A policy's logits (p.logits): written by the lane owning piece 0 of each lane group.
  const uint lg_rows = (LG && p.logits != 0 && piece == 0) ? rows : 0u;
  device float* lg = logits + (p.logits != 0 ? head0 * n : 0u);
  if (RES) {  // the pool's keys before the window, then the window's from the ring
    const uint w = min(max(mkv_params::attn_ring_start(n - 1, p.residual, p.ring_lo), begin), end);
    attn_decode_scan<L, D, EL, R, S, LG>(ld, table, begin, w, simd, group, prefetch, capped, cap_out, cap_in, qr, acc,
                                         m, l, lg, n, lg_rows);
    AttnKvRing<D, E> rd[P];
    MKV_UNROLL for (uint j = 0; j < P; ++j) rd[j] = AttnKvRing<D, E>::make(p, ring, kv_head, piece_read * EL + j * E);
    attn_decode_scan<AttnKvRing<D, E>, D, EL, R, S, LG>(rd, table, w, end, simd, group, prefetch, capped, cap_out,
                                                        cap_in, qr, acc, m, l, lg, n, lg_rows);
  } else {
    attn_decode_scan<L, D, EL, R, S, LG>(ld, table, begin, end, simd, group, prefetch, capped, cap_out, cap_in, qr, acc,
                                         m, l, lg, n, lg_rows);
  }

  // Merge the G lane groups of the SIMD-group (same elements, other keys).
  // (m, l) travel as a float2 and acc four elements at a time: the same values
  // and arithmetic as one shuffle each, in a third of the shuffle calls (each
  // one a rendezvous of 32 fibers on the host executor).
  static_assert(EL % 4 == 0, "acc travels as float4s");
  MKV_UNROLL for (uint x = KL; x < 32; x *= 2) {
    MKV_UNROLL for (uint r = 0; r < R; ++r) {
      const float2 ml_o = simd_shuffle_xor(float2(m[r], l[r]), ushort(x));
      const float m_all = max(m[r], ml_o.x);
      const float w = attn_merge_weight(m[r], m_all), w_o = attn_merge_weight(ml_o.x, m_all);
      l[r] = l[r] * w + ml_o.y * w_o;
      MKV_UNROLL for (uint e = 0; e < EL; e += 4) {
        const float4 a_o = simd_shuffle_xor(float4(acc[r][e], acc[r][e + 1], acc[r][e + 2], acc[r][e + 3]), ushort(x));
        MKV_UNROLL for (uint j = 0; j < 4; ++j) acc[r][e + j] = acc[r][e + j] * w + a_o[j] * w_o;
      }
      m[r] = m_all;
    }
  }

  // Merge the SIMD-groups: weights exp2(m_g - M); a group that saw no key has
  // m_g = -inf, weight 0 and acc 0. Every chunk holds a key, so M is finite.
  if (lane == 0) {
    for (uint r = 0; r < R; ++r) {
      tg_m[simd * R + r] = m[r];
      tg_l[simd * R + r] = l[r];
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  MKV_UNROLL for (uint r = 0; r < R; ++r) {  // unrolled: acc stays in registers
    if (r < rows) {  // uniform over the threadgroup: every thread meets the barriers
      float m_all = -INFINITY;
      for (uint g = 0; g < S; ++g) m_all = max(m_all, tg_m[g * R + r]);
      const float w = attn_merge_weight(m[r], m_all);
      if (group == 0 && owns)
        for (uint e = 0; e < EL; ++e) tg_acc[simd * D + piece * EL + e] = acc[r][e] * w;
      threadgroup_barrier(mem_flags::mem_threadgroup);
      float l_all = 0.0f;
      for (uint g = 0; g < S; ++g) l_all += tg_l[g * R + r] * attn_merge_weight(tg_m[g * R + r], m_all);
      const uint qh = head0 + r;
      for (uint el = tid; el < D; el += S * 32) {  // D > S * 32 for the 4-SIMD-group split at D > 128
        float o = 0.0f;
        for (uint g = 0; g < S; ++g) o += tg_acc[g * D + el];
        if (split) {
          const uint at = qh * p.n_chunks + tg.y;
          part_o[at * D + el] = o;
          if (el == 0) {
            part_ml[at * 2] = m_all;
            part_ml[at * 2 + 1] = l_all;
          }
        } else {
          const float sink2 = p.has_sinks ? sinks[qh] * LOG2E : 0.0f;
          out[qh * D + el] = attn_finish_sink<true>(m_all, l_all, o, p.has_sinks != 0, sink2);
        }
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);  // tg_acc is reused by the next row
    }
  }
}

// Second pass of split-K for one query head: out = sum_c w_c acc_c / sum_c
// w_c l_c, w_c = exp2(m_c - M), with the sink folded in. 256 threads: every
// thread takes chunks for M and the weights (kept in threadgroup memory),
// then NG = 256 / (D/4) chunk groups of D/4 threads sum float4 quads of the
// chunks c = group, group + NG, ... four chunks' loads in flight at a time,
// and the first D threads add up the groups.
template <uint D>
inline void attn_decode_reduce_body(constant mkv_params::AttnDecodeReduce& p,
                                    const device float* part_o,   // (n_q_heads, n_chunks, D)
                                    const device float* part_ml,  // (n_q_heads, n_chunks, 2)
                                    const device float* sinks,    // (n_q_heads) if has_sinks
                                    device float* out,            // (n_q_heads, D)
                                    threadgroup float* tg,        // kAttnReduceTgFloats
                                    uint qh, uint tid, uint simd, uint lane) {
  constexpr uint T = mkv_params::kAttnReduceThreads;
  constexpr uint S = T / 32;
  constexpr uint Q = D / 4;   // float4 quads per row
  constexpr uint NG = T / Q;  // chunk groups
  constexpr float LOG2E = 1.4426950408889634f;
  // tg: weights (kAttnDecodeMaxChunks), then per-SIMD-group max and sum (2, S) at W,
  // then the chunk groups' outputs (NG, D) at O.
  constexpr uint W = mkv_params::kAttnDecodeMaxChunks;
  constexpr uint O = W + 2 * S;
  const uint n = p.n_chunks;
  const device float* ml = part_ml + qh * n * 2;

  float mx = -INFINITY;
  for (uint c = tid; c < n; c += T) mx = max(mx, ml[c * 2]);
  mx = simd_max(mx);
  if (lane == 0) tg[W + simd] = mx;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float m_all = -INFINITY;
  for (uint g = 0; g < S; ++g) m_all = max(m_all, tg[W + g]);
  float ls = 0.0f;
  for (uint c = tid; c < n; c += T) {
    const float w = attn_merge_weight(ml[c * 2], m_all);
    tg[c] = w;
    ls += w * ml[c * 2 + 1];
  }
  ls = simd_sum(ls);
  if (lane == 0) tg[W + S + simd] = ls;
  threadgroup_barrier(mem_flags::mem_threadgroup);

  const uint quad = tid % Q, cg = tid / Q;
  if (cg < NG) {
    const device float4* src = (const device float4*)(part_o + qh * n * D) + quad;
    float4 o = float4(0.0f);
    uint c = cg;
    for (; c + 3 * NG < n; c += 4 * NG) {
      const float4 a = src[c * Q], b = src[(c + NG) * Q];
      const float4 x = src[(c + 2 * NG) * Q], y = src[(c + 3 * NG) * Q];
      o += tg[c] * a + tg[c + NG] * b + tg[c + 2 * NG] * x + tg[c + 3 * NG] * y;
    }
    for (; c < n; c += NG) o += tg[c] * src[c * Q];
    for (uint j = 0; j < 4; ++j) tg[O + cg * D + quad * 4 + j] = o[j];
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (tid < D) {
    float l_all = 0.0f;
    for (uint g = 0; g < S; ++g) l_all += tg[W + S + g];
    float o = 0.0f;
    for (uint g = 0; g < NG; ++g) o += tg[O + g * D + tid];
    const float sink2 = p.has_sinks ? sinks[qh] * LOG2E : 0.0f;
    out[qh * D + tid] = attn_finish_sink<true>(m_all, l_all, o, p.has_sinks != 0, sink2);
  }
}
