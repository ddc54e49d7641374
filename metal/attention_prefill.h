// Prefill attention body: n_queries queries at consecutive positions against
// one layer's KV cache (which already holds their own keys), f16 K/V or
// quantized (Quant: each of K and V in its format, dequantized while the tile
// is staged), f32 accumulation, causal and sliding-window masks by position.
//
// Geometry. A threadgroup serves one query tile (queries_per_tile positions)
// for one KV head and a block of heads_per_block query heads sharing it
// (native GQA): rows = (query, head) pairs, row = qi * heads_per_block + h.
// SIMD-group g holds rows g, g + S, g + 2S, ... (up to R each, interleaved so
// causal work is balanced) in registers, lanes splitting head_dim. Keys are
// visited in tiles of BK positions staged into threadgroup memory by all
// threads (K and V, zero past the last visible key); each SIMD-group then walks
// the tile 4 keys at a time exactly like decode (one simd_sum(float4) per row).
//
// Skipping. The tile loop covers only positions some row of the threadgroup
// can see, [first query - W + 1, last query] (causal: from 0), so fully masked
// tiles are never loaded; inside a tile a SIMD-group skips each 4-key block
// that none of its rows sees, and each row skips blocks outside its own range.
//
// Read count: each visible K/V element is read from device memory once per
// (query tile, KV head, head block) — the staged tile serves all
// queries_per_tile * heads_per_block rows.
//
// Residual window (Quant kernels, p.residual > 0): each row reads the keys
// before its S(p) (attn_ring_start) from the pool and the rest from the
// ring's f16 rows, as decode at its position would. Two passes over the
// tiles: the pool's keys up to the last row's S, then the ring's from the
// first row's S; each row sees its own part of each pass, so its 4-key
// blocks are still visited in position order whatever the tile or chunk.
#pragma once

#include "attention.h"
#include "kv_codec.h"
#include "kv_table.h"

// Keys k0 .. k0+BK-1 of one KV head for the K and V tiles (BK x D halfs each),
// shared by the NT threads of the threadgroup: slots from the block table
// (dequantized where Quant) or, from_ring, the residual window's f16 rows; zero
// outside [t_lo, t_hi] (a sliding table may have let those blocks go). D % 4 ==
// 0, so every row and column c is 8-byte aligned. Four halves move as their
// bits (uint2: one 8-byte load and store). attn_prefill_fetch reads a thread's
// share (at most attn_prefill_share(D, BK, NT) pieces) into registers,
// attn_prefill_put writes it to the tiles, attn_prefill_stage does both. Shared
// by the SIMD and the matrix prefill kernels (attention_prefill_mma.h).
constexpr uint attn_prefill_share(uint D, uint BK, uint NT) { return (BK * D / 4 + NT - 1) / NT; }

// Whether a tile's keys share one entry of the block table: tiles of BK keys
// that start at multiples of BK (Aligned: the matrix kernels') with BK dividing
// kKvBlockTokens lie in one block. Their pieces then take the entry looked up
// once a tile (attn_prefill_tile_entry); other tiles look up each key's.
template <uint BK, bool Aligned>
constexpr bool attn_prefill_one_block() { return Aligned && mkv_params::kKvBlockTokens % BK == 0; }

// The table entry of a one-block tile's keys, read through a key the caller
// may see (the tile overlaps [t_lo, t_hi]); 0 where unused (the ring's pass,
// tiles that look up each key).
template <uint BK, bool Aligned>
inline uint attn_prefill_tile_entry(const device uint* table, bool from_ring, int k0, int t_lo) {
  return attn_prefill_one_block<BK, Aligned>() && !from_ring ? table[kv_block(uint(max(k0, t_lo)))] : 0u;
}

// Piece idx (< BK * D / 4) of the tiles: key k0 + idx / (D / 4), columns 4 (idx % (D / 4)) .. + 4.
template <bool Quant, uint D, bool OneBlock = false>
inline void attn_prefill_piece(constant mkv_params::AttnPrefill& p, const device uchar* kv, const device uint* table,
                               const device half* ring_k, const device half* ring_v, uint kv_head, bool from_ring,
                               int k0, int t_lo, int t_hi, uint idx, uint entry, thread uint2& kh, thread uint2& vh) {
  const uint slot_stride = p.n_kv_heads * D;
  const uint t = idx / (D / 4);
  const uint c = idx % (D / 4) * 4;
  kh = uint2(0u);
  vh = uint2(0u);
  if (k0 + int(t) < t_lo || k0 + int(t) > t_hi) return;
  if (from_ring) {
    const uint at = (uint(k0) + t) % p.ring_slots * slot_stride + c;
    kh = *(const device uint2*)(ring_k + at);
    vh = *(const device uint2*)(ring_v + at);
    return;
  }
  const uint slot = OneBlock ? kv_slot_in(entry, uint(k0) + t) : kv_slot(table, uint(k0) + t);
  if (Quant) {
    constexpr uint B = mkv_params::kKvBlockTokens;
    const device uchar* v_section = kv + p.slots * mkv_params::kv_slot_bytes(p.k_format, p.n_kv_heads, D);
    kh = as_type<uint2>(mkv_kv::kv_load4(kv, p.k_format, B, p.n_kv_heads, D, slot, kv_head, c));
    vh = as_type<uint2>(mkv_kv::kv_load4(v_section, p.v_format, B, p.n_kv_heads, D, slot, kv_head, c));
  } else {
    const device half* k_base = (const device half*)kv + kv_head * D;
    const device half* v_base = (const device half*)kv + p.slots * slot_stride + kv_head * D;
    kh = *(const device uint2*)(k_base + slot * slot_stride + c);
    vh = *(const device uint2*)(v_base + slot * slot_stride + c);
  }
}

// Where piece idx goes in a tile whose rows are S halves apart (S >= D).
inline uint attn_prefill_piece_at(uint D, uint S, uint idx) { return idx / (D / 4) * S + idx % (D / 4) * 4; }

// A tile whose BK keys all lie in one f16 block and in [t_lo, t_hi]: the keys'
// rows are consecutive slots, so a thread's pieces sit at offsets fixed for it
// from one K and one V address, with no per-piece range check or slot lookup.
// On the H100 this made the D = 80 half kernel 8 % faster (docs/KERNELS.md,
// issue 38's round two).
template <uint D, uint BK, uint NT>
inline void attn_prefill_fetch_whole(constant mkv_params::AttnPrefill& p, const device uchar* kv, uint kv_head,
                                     uint entry, int k0, uint tid, thread uint2* kh, thread uint2* vh) {
  const uint slot_stride = p.n_kv_heads * D;
  const device half* k_base = (const device half*)kv + ulong(kv_slot_in(entry, uint(k0))) * slot_stride + kv_head * D;
  const device half* v_base = k_base + ulong(p.slots) * slot_stride;
  MKV_UNROLL for (uint n = 0; n < attn_prefill_share(D, BK, NT); ++n) {
    const uint idx = tid + n * NT;
    if (BK * D / 4 % NT != 0 && idx >= BK * D / 4) break;
    const uint at = idx / (D / 4) * slot_stride + idx % (D / 4) * 4;
    kh[n] = *(const device uint2*)(k_base + at);
    vh[n] = *(const device uint2*)(v_base + at);
  }
}

template <bool Quant, uint D, uint BK, uint NT, bool Aligned = false>
inline void attn_prefill_fetch(constant mkv_params::AttnPrefill& p, const device uchar* kv, const device uint* table,
                               const device half* ring_k, const device half* ring_v, uint kv_head, bool from_ring,
                               int k0, int t_lo, int t_hi, uint tid, thread uint2* kh, thread uint2* vh) {
  constexpr bool one = attn_prefill_one_block<BK, Aligned>();
  const uint entry = attn_prefill_tile_entry<BK, Aligned>(table, from_ring, k0, t_lo);
  if (one && !Quant && !from_ring && k0 >= t_lo && k0 + int(BK) - 1 <= t_hi) {
    attn_prefill_fetch_whole<D, BK, NT>(p, kv, kv_head, entry, k0, tid, kh, vh);
    return;
  }
  MKV_UNROLL for (uint n = 0; n < attn_prefill_share(D, BK, NT); ++n) {
    const uint idx = tid + n * NT;
    if (BK * D / 4 % NT != 0 && idx >= BK * D / 4) break;
    attn_prefill_piece<Quant, D, one>(p, kv, table, ring_k, ring_v, kv_head, from_ring, k0, t_lo, t_hi, idx, entry,
                                      kh[n], vh[n]);
  }
}

template <uint D, uint BK, uint NT, uint S = D>
inline void attn_prefill_put(threadgroup half* k_tile, threadgroup half* v_tile, uint tid, thread const uint2* kh,
                             thread const uint2* vh) {
  MKV_UNROLL for (uint n = 0; n < attn_prefill_share(D, BK, NT); ++n) {
    const uint idx = tid + n * NT;
    if (BK * D / 4 % NT != 0 && idx >= BK * D / 4) break;
    *(threadgroup uint2*)(k_tile + attn_prefill_piece_at(D, S, idx)) = kh[n];
    *(threadgroup uint2*)(v_tile + attn_prefill_piece_at(D, S, idx)) = vh[n];
  }
}

// Fetch and put piece by piece (few registers).
template <bool Quant, uint D, uint BK, uint NT, uint S = D, bool Aligned = false>
inline void attn_prefill_stage(constant mkv_params::AttnPrefill& p, const device uchar* kv, const device uint* table,
                               const device half* ring_k, const device half* ring_v, uint kv_head, bool from_ring,
                               int k0, int t_lo, int t_hi, threadgroup half* k_tile, threadgroup half* v_tile,
                               uint tid) {
  constexpr bool one = attn_prefill_one_block<BK, Aligned>();
  const uint entry = attn_prefill_tile_entry<BK, Aligned>(table, from_ring, k0, t_lo);
  for (uint idx = tid; idx < BK * D / 4; idx += NT) {
    uint2 kh, vh;
    attn_prefill_piece<Quant, D, one>(p, kv, table, ring_k, ring_v, kv_head, from_ring, k0, t_lo, t_hi, idx, entry,
                                      kh, vh);
    *(threadgroup uint2*)(k_tile + attn_prefill_piece_at(D, S, idx)) = kh;
    *(threadgroup uint2*)(v_tile + attn_prefill_piece_at(D, S, idx)) = vh;
  }
}

// The keys a prefill tile's rows may see, [k_lo, k_hi] (queries qi0 .. qi0 + n - 1),
// and with a residual window (res) the first keys its first and last rows read
// from the ring (s_first, s_last): the pool's pass covers keys before s_last,
// the ring's those from s_first. Shared by the SIMD and matrix kernels.
struct AttnTileKeys {
  int k_lo, k_hi, s_first, s_last;
  bool res;
};

template <bool Quant>
inline AttnTileKeys attn_prefill_tile_keys(constant mkv_params::AttnPrefill& p, uint qi0, uint n) {
  AttnTileKeys t;
  const int first_q = int(p.q_pos0 + qi0);
  t.k_hi = attn_prefill_row_hi(p, first_q + int(n) - 1);
  t.k_lo = p.window > 0 ? max(0, first_q - int(p.window) + 1) : 0;
  t.res = Quant && p.residual > 0;  // uniform
  t.s_first = t.res ? int(mkv_params::attn_ring_start(uint(first_q), p.residual, p.ring_lo)) : t.k_hi + 1;
  t.s_last = t.res ? int(mkv_params::attn_ring_start(uint(t.k_hi), p.residual, p.ring_lo)) : t.k_hi + 1;
  return t;
}

// The first key a row ending at key hi reads from the ring (hi + 1: none).
inline int attn_prefill_ring_from(constant mkv_params::AttnPrefill& p, thread const AttnTileKeys& t, int hi) {
  return t.res ? int(mkv_params::attn_ring_start(uint(max(hi, 0)), p.residual, p.ring_lo)) : hi + 1;
}

// A pass's keys (pool: pass 0, ring: pass 1): the tile's [x, y], and a row's
// part of them given its own [lo, hi] and ring start.
inline int2 attn_prefill_pass_keys(thread const AttnTileKeys& t, bool from_ring) {
  return from_ring ? int2(max(t.k_lo, t.s_first), t.k_hi) : int2(t.k_lo, min(t.k_hi, t.s_last - 1));
}
inline int2 attn_prefill_row_keys(int lo, int hi, int ring_from, bool from_ring) {
  return from_ring ? int2(max(lo, ring_from), hi) : int2(lo, min(hi, ring_from - 1));
}

template <bool Quant, uint D, uint BK, uint R>
inline void attn_prefill_body(constant mkv_params::AttnPrefill& p,
                              const device float* q,      // (n_queries, n_q_heads, D)
                              const device uchar* kv,     // the layer's pool: K section, V section
                              const device uint* table,   // block table: ceil(n_tokens / B) entries
                              const device uchar* ring,   // residual window (Quant, p.residual > 0)
                              const device float* sinks,  // (n_q_heads) if has_sinks
                              device float* out,          // (n_queries, n_q_heads, D)
                              device float* logits,       // (n_queries, n_q_heads, n_tokens) if p.logits
                              threadgroup half* k_tile,   // (BK, D)
                              threadgroup half* v_tile,   // (BK, D)
                              uint2 tg, uint tid, uint simd, uint lane) {
  constexpr uint E = mkv_params::attn_lane_elems(D);
  constexpr uint S = mkv_params::kAttnSimdgroups;
  const AttnHeadBlock hb = attn_head_block(p, tg.y);
  const uint kv_head = hb.kv_head, head0 = hb.head0, g = hb.count;
  const uint qi0 = tg.x * p.queries_per_tile;
  const uint n_tile_queries = min(p.queries_per_tile, p.n_queries - qi0);
  const uint n_rows = n_tile_queries * g;
  const int window = int(p.window);

  // This SIMD-group's rows and the key positions [lo, hi] each may see.
  AttnRows<E, R> st;
  attn_rows_init(st);
  int lo[R];
  int hi[R];
  for (uint j = 0; j < R; ++j) {
    const uint row = simd + S * j;
    lo[j] = 0;  // empty range for rows past the tile
    hi[j] = -1;
    if (row < n_rows) {
      const uint qi = qi0 + row / g;
      const int qpos = int(p.q_pos0 + qi);
      hi[j] = attn_prefill_row_hi(p, qpos);
      lo[j] = window > 0 ? max(0, qpos - window + 1) : 0;
      load_q_slice<D>(q + (qi * p.n_q_heads + head0 + row % g) * D, lane, st.q[j]);
    }
  }

  // Positions any row of the threadgroup may see, and the ring's part of them.
  const AttnTileKeys keys = attn_prefill_tile_keys<Quant>(p, qi0, n_tile_queries);
  const uint slot_stride = p.n_kv_heads * D;
  const device half* ring_k = (const device half*)ring + kv_head * D;
  const device half* ring_v = ring_k + p.ring_slots * slot_stride;
  int ring_from[R];  // each row's first key from the ring
  for (uint j = 0; j < R; ++j) ring_from[j] = attn_prefill_ring_from(p, keys, hi[j]);

  for (uint pass = 0; pass < (keys.res ? 2u : 1u); ++pass) {
    const bool from_ring = pass == 1;
    // This pass's keys [t_lo, t_hi], and each row's part of them.
    const int2 tk = attn_prefill_pass_keys(keys, from_ring);
    const int t_lo = tk.x, t_hi = tk.y;
    int plo[R];
    int phi[R];
    for (uint j = 0; j < R; ++j) {
      const int2 rk = attn_prefill_row_keys(lo[j], hi[j], ring_from[j], from_ring);
      plo[j] = rk.x;
      phi[j] = rk.y;
    }
    // Positions any row of the threadgroup may see, [t_lo, t_hi]. The tiles
    // start at t_lo rounded down to a multiple of 4, so every row visits the
    // 4-key blocks of absolute positions 4i .. 4i + 3: a query's result does not
    // depend on which chunk or tile it came in with (chunk invariance: a prompt
    // fed in other chunks, or partly from a prefix cache, gives the same bits).
    const int k_start = t_lo & ~3;
    for (int k0 = k_start; k0 <= t_hi; k0 += int(BK)) {
      attn_prefill_stage<Quant, D, BK, S * 32>(p, kv, table, ring_k, ring_v, kv_head, from_ring, k0, t_lo, t_hi,
                                                k_tile, v_tile, tid);
      threadgroup_barrier(mem_flags::mem_threadgroup);

      for (uint b = 0; b < BK; b += 4) {
        const int kp = k0 + int(b);
        bool sees[R];
        bool any = false;
        for (uint j = 0; j < R; ++j) {
          sees[j] = plo[j] <= kp + 3 && phi[j] >= kp;
          any = any || sees[j];
        }
        if (!any) continue;  // uniform within the SIMD-group
        float kv4[4][E];
        for (uint j = 0; j < 4; ++j) load_slice_tg<D>(k_tile + (b + j) * D, lane, kv4[j]);
        float4 scores[R];
        for (uint j = 0; j < R; ++j)
          if (sees[j]) scores[j] = simd_sum(attn_dot4(st.q[j], kv4));
        for (uint j = 0; j < 4; ++j) load_slice_tg<D>(v_tile + (b + j) * D, lane, kv4[j]);
        for (uint j = 0; j < R; ++j) {
          if (sees[j]) {
            const float4 s = attn_transform(scores[j], p.scale, p.softcap);
            if (p.logits != 0 && lane == 0) {  // a policy's logits, the row's visible keys
              const uint row = simd + S * j, n_tokens = p.q_pos0 + p.n_queries;
              device float* lg = logits + ((qi0 + row / g) * p.n_q_heads + head0 + row % g) * n_tokens;
              for (int c = 0; c < 4; ++c)
                if (kp + c >= plo[j] && kp + c <= phi[j]) lg[kp + c] = s[c];
            }
            attn_update(st, j, attn_mask(s, kp, plo[j], phi[j]), kv4);
          }
        }
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);  // the tile is overwritten next
    }
  }

  for (uint j = 0; j < R; ++j) {
    const uint row = simd + S * j;
    if (row < n_rows && attn_lane_owns<D>(lane)) {
      const uint qh = head0 + row % g;
      const float sink = p.has_sinks ? sinks[qh] : 0.0f;
      device float* o = out + ((qi0 + row / g) * p.n_q_heads + qh) * D + lane * E;
      for (uint e = 0; e < E; ++e)
        o[e] = attn_finish(st.m[j], st.l[j], st.acc[j][e], p.has_sinks != 0, sink);
    }
  }
}
