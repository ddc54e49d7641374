// Pieces shared by the decode and prefill attention kernels: per-lane slices
// of head_dim, score transform, and the online-softmax update of a block of 4
// keys for the query rows a SIMD-group holds.
//
// Layout inside a SIMD-group: lane l owns elements [l*E, l*E + E) of head_dim,
// E = attn_lane_elems(D), for every query row, K row and V row, while
// l < L = attn_lanes(D) = D / E (attention_params.h):
//   D   32 64 80 96 112 128 160 192 256
//   E    1  2  4  3   4   4   5   6   8
//   L   32 32 20 32  28  32  32  32  32
//   load h h2 h4 h  h4  h4   h  h2  h4  (K/V from device memory: half, half2, half4)
// Lanes past L hold zeros in q, K, V and acc and never load or store, so
// their partial dots are exact zeros and simd_sum over all 32 lanes stays
// exact; every lane still meets every collective. A q.k dot product is a
// per-lane partial followed by simd_sum; scores of 4 keys travel together as
// a float4 so one simd_sum serves 4 keys.
#pragma once

#include "mkv_kernel.h"  // metal_stdlib, using namespace metal
#include "attention_params.h"

// Online-softmax state of up to R query rows; every lane holds the same m and
// l (they come from simd_sum results) and its own E-slice of q and acc.
// The query heads one threadgroup serves: KV head `kv_head` and its query
// heads head0 .. head0 + count - 1 (a block of at most heads_per_block of the
// group_size heads sharing it). `index` is the threadgroup's head-block index.
struct AttnHeadBlock {
  uint kv_head;
  uint head0;
  uint count;
};
template <typename Params>
inline AttnHeadBlock attn_head_block(constant Params& p, uint index) {
  AttnHeadBlock b;
  b.kv_head = index / p.head_blocks;
  const uint block = index % p.head_blocks;
  b.head0 = b.kv_head * p.group_size + block * p.heads_per_block;
  b.count = min(p.heads_per_block, p.group_size - block * p.heads_per_block);
  return b;
}

template <uint E, uint R>
struct AttnRows {
  float q[R][E];
  float acc[R][E];  // unnormalised output: sum_k exp(s_k - m) * v_k
  float m[R];       // running max of the visible scores (-inf before the first)
  float l[R];       // running sum of exp(s_k - m)
};

template <uint E, uint R>
inline void attn_rows_init(thread AttnRows<E, R>& st) {
  for (uint r = 0; r < R; ++r) {
    for (uint e = 0; e < E; ++e) {
      st.q[r][e] = 0.0f;
      st.acc[r][e] = 0.0f;
    }
    st.m[r] = -INFINITY;
    st.l[r] = 0.0f;
  }
}

// Whether the lane owns elements of head_dim D (all lanes when 32 divides D;
// the test folds away then).
template <uint D>
inline bool attn_lane_owns(uint lane) {
  constexpr uint L = mkv_params::attn_lanes(D);
  return L == 32 || lane < L;
}

// The lane's E halfs of a device row, widened to float; zeros on a lane that
// owns none. The widest load E allows: half4 when 4 divides E (D = 80, 112,
// 128, 256), half2 when 2 does (64, 192), else half. Aligned: rows start
// 8-byte aligned (D % 4 == 0, kv offset checked by the op) and the lane's
// slice at lane * E * 2 bytes, a multiple of the load's size.
template <uint D, uint E>
inline void load_slice(const device half* row, uint lane, thread float (&out)[E]) {
  if (!attn_lane_owns<D>(lane)) {
    for (uint e = 0; e < E; ++e) out[e] = 0.0f;
    return;
  }
  const device half* p = row + lane * E;
  if (E % 4 == 0) {
    for (uint i = 0; i < E; i += 4) {
      const float4 v = float4(*(const device half4*)(p + i));
      out[i] = v.x;
      out[i + 1] = v.y;
      out[i + 2] = v.z;
      out[i + 3] = v.w;
    }
  } else if (E % 2 == 0) {
    for (uint i = 0; i < E; i += 2) {
      const float2 v = float2(*(const device half2*)(p + i));
      out[i] = v.x;
      out[i + 1] = v.y;
    }
  } else {
    for (uint e = 0; e < E; ++e) out[e] = float(p[e]);
  }
}

// The same from a K/V tile staged in threadgroup memory.
template <uint D, uint E>
inline void load_slice_tg(const threadgroup half* row, uint lane, thread float (&out)[E]) {
  const bool owns = attn_lane_owns<D>(lane);
  const threadgroup half* p = row + lane * E;
  for (uint e = 0; e < E; ++e) out[e] = owns ? float(p[e]) : 0.0f;
}

// The lane's slice of a float q row; zeros on a lane that owns none.
template <uint D, uint E>
inline void load_q_slice(const device float* row, uint lane, thread float (&out)[E]) {
  const bool owns = attn_lane_owns<D>(lane);
  for (uint e = 0; e < E; ++e) out[e] = owns ? row[lane * E + e] : 0.0f;
}

// Lane partials of q.k for 4 keys; the caller simd_sums them.
template <uint E>
inline float4 attn_dot4(thread const float (&q)[E], thread const float (&k)[4][E]) {
  float4 d = float4(0.0f);
  for (uint e = 0; e < E; ++e) {
    d.x += q[e] * k[0][e];
    d.y += q[e] * k[1][e];
    d.z += q[e] * k[2][e];
    d.w += q[e] * k[3][e];
  }
  return d;
}

// Scale, then Gemma-2 logit soft-capping (before masking, as the model does).
inline float4 attn_transform(float4 dots, float scale, float softcap) {
  float4 s = dots * scale;
  if (softcap > 0.0f) s = softcap * tanh(s / softcap);
  return s;
}

// Keys kp0 .. kp0+3 outside the row's visible positions [lo, hi] get -inf.
inline float4 attn_mask(float4 s, int kp0, int lo, int hi) {
  for (int j = 0; j < 4; ++j)
    if (kp0 + j < lo || kp0 + j > hi) s[j] = -INFINITY;
  return s;
}

// Online-softmax step of row r with 4 masked scores and the 4 keys' V slices.
template <uint E, uint R>
inline void attn_update(thread AttnRows<E, R>& st, uint r, float4 s, thread const float (&v)[4][E]) {
  const float m_new = max(st.m[r], max(max(s.x, s.y), max(s.z, s.w)));
  if (m_new == -INFINITY) return;  // nothing visible yet: keep the empty state
  const float factor = exp(st.m[r] - m_new);  // 0 on the first visible key
  const float4 p = exp(s - m_new);            // masked keys give exactly 0
  st.l[r] = st.l[r] * factor + ((p.x + p.y) + (p.z + p.w));
  for (uint e = 0; e < E; ++e)
    st.acc[r][e] = st.acc[r][e] * factor + (p.x * v[0][e] + p.y * v[1][e]) + (p.z * v[2][e] + p.w * v[3][e]);
  st.m[r] = m_new;
}

// Folds an attention sink (a virtual key with logit `sink` and a zero value)
// into (m, l, o) and returns the normalised output o / l. Log2: m and sink are
// in the log2 domain (natural logits times log2(e); the decode kernels' form).
template <bool Log2>
inline float attn_finish_sink(float m, float l, float o, bool has_sink, float sink) {
  if (has_sink) {
    const float m_all = max(m, sink);
    const float w = Log2 ? exp2(m - m_all) : exp(m - m_all);
    l = l * w + (Log2 ? exp2(sink - m_all) : exp(sink - m_all));
    o = o * w;
  }
  return o / l;
}
inline float attn_finish(float m, float l, float o, bool has_sink, float sink) {
  return attn_finish_sink<false>(m, l, o, has_sink, sink);
}

// The last key the query at position qpos sees: its own (causal), or the
// last of the bidirectional block that holds it. Non-decreasing in qpos (the
// blocks are disjoint), so a tile's last query sees the tile's last key.
inline int attn_prefill_row_hi(constant mkv_params::AttnPrefill& p, int qpos) {
  for (uint i = 0; i < p.n_blocks; ++i)
    if (qpos >= int(p.block_lo[i]) && qpos < int(p.block_hi[i])) return int(p.block_hi[i]) - 1;
  return qpos;
}
