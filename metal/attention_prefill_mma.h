// Prefill attention on matrix units (attn_prefill_mma_*): the SIMD kernel's
// staging, masks, residual-window passes and policy logits (attention_prefill.h),
// with Q·Kᵀ and P·V as simdgroup_matrix 8x8 products and the online softmax
// on the score fragments.
//
// Geometry. A threadgroup serves queries_per_tile positions (a multiple of 8)
// x heads_per_block query heads of one KV head, as blocks of 8 rows: block b
// is head b / (queries_per_tile / 8), positions 8 (b % ...) .. + 8 of the tile.
// SIMD-group s takes blocks s, s + 4 (up to attn_prefill_mma_blocks(D)); per
// block it holds Q (QT, below; D / 8 fragments, loaded once through an 8x8 staging
// square) and the output O (D / 8 float fragments), and per lane the running
// max m and sum l of the row the lane's fragment elements belong to
// (simdgroup_matrix's layout, metal/fragment.h: a lane holds two adjacent
// columns of one row, the 4 lanes of a row differ in two lane bits, so a row's
// max and sum are two xor shuffles).
//
// Per staged tile of BK keys (tiles start at multiples of BK, absolute
// positions, so a query's result does not depend on its chunk or tile): S =
// Q Kᵀ for the tile's BK / 8 blocks of 8 keys (float accumulator, half K; each
// K fragment serves every block of the SIMD-group), scaled and soft-capped,
// masked by each row's visible range; one online-softmax step over the tile's
// keys; O = O x factor + P V (half V). A tile no row of the SIMD-group sees is
// skipped; otherwise all its blocks compute, with no branch between the
// products (for a block that sees none of the tile the step is an exact no-op:
// P 0, O and l unchanged). Every loop over fragments has a compile-time count
// and is unrolled, so Q, O and S stay in registers.
//
// Operands. QT = float: Q and P enter the products as float (on the CUDA
// device TF32 split into hi + lo, about 21 bits). QT = half (the _half
// kernels, AttentionDesc::half_operands): Q is rounded to half once as it is
// loaded and P as it is formed, so every product is half x half with float
// sums, the matrix units' full rate (flash attention and llama.cpp's kernels
// take Q and P as 16-bit too). A row's sum l adds the rounded P, so the
// weights of V still sum to 1 exactly as the products see them; their softmax
// runs in the log2 domain, on the device's fast exp2. The half kernels load K
// and V fragments four at a time for the b operand (simdgroup_load4), from
// tiles whose rows are attn_prefill_mma_stride(D) halves apart.
//
// Results are not the SIMD kernel's bits: products of 8 and the softmax's
// per-tile steps sum in another order (tests hold both against numpy).
#pragma once

#include "attention.h"
#include "attention_prefill.h"
#include "fragment.h"
#include "simdgroup_tile.h"

// Whether the kernel fetches the next tile's K/V into registers while this
// one's products run (past D = 128 they would spill).
constexpr bool attn_prefill_mma_prefetch(uint D) { return D <= 128; }

// The K and V tiles' rows are D + 8 halves apart: a fragment's 8 rows then
// start in different groups of 4 banks (D halves apart, rows 4 apart meet).
constexpr uint attn_prefill_mma_stride(uint D) { return D + 8; }

template <bool Quant, uint D, uint BK, uint RB, typename QT>
inline void attn_prefill_mma_body(constant mkv_params::AttnPrefill& p,
                                  const device float* q,      // (n_queries, n_q_heads, D)
                                  const device uchar* kv,     // the layer's pool: K section, V section
                                  const device uint* table,   // block table
                                  const device uchar* ring,   // residual window (Quant, p.residual > 0)
                                  const device float* sinks,  // (n_q_heads) if has_sinks
                                  device float* out,          // (n_queries, n_q_heads, D)
                                  device float* logits,       // (n_queries, n_q_heads, n_tokens) if p.logits
                                  threadgroup half* k_tile,   // (BK, attn_prefill_mma_stride(D))
                                  threadgroup half* v_tile,   // (BK, attn_prefill_mma_stride(D))
                                  threadgroup QT* square,     // (kAttnMmaSimdgroups, 64): Q staging
                                  uint2 tg, uint tid, uint simd, uint lane) {
  constexpr uint NS = mkv_params::kAttnMmaSimdgroups, D8 = D / 8, NB = BK / 8, DS = attn_prefill_mma_stride(D);
  constexpr bool prefetch = attn_prefill_mma_prefetch(D);
  // Half operands with an even number of blocks: products in 2 x 2 groups
  // (simdgroup_tile.h), one instruction each where the device has it; each
  // accumulator still sums its dims (keys) in order, as the loops below do.
  constexpr bool paired = sizeof(QT) == 2 && RB % 2 == 0 && D8 % 2 == 0 && NB % 2 == 0;
  // Half operands: the softmax in the log2 domain (exp2, as the decode kernels
  // run it), its scale folded into the scores'. Float: natural units, exp.
  constexpr bool L2 = sizeof(QT) == 2;
  constexpr float LOG2E = 1.4426950408889634f;
  const float score_scale = L2 ? p.scale * LOG2E : p.scale, cap = L2 ? p.softcap * LOG2E : p.softcap;
  const AttnHeadBlock hb = attn_head_block(p, tg.y);
  const uint kv_head = hb.kv_head, g = hb.count;
  const uint qi0 = tg.x * p.queries_per_tile;
  const uint qblocks = p.queries_per_tile / 8;
  const int window = int(p.window);
  // This lane's row and first column in every fragment.
  const uint r = fragment_row(lane), c = fragment_col(lane);

  bool used[RB];   // the block exists (uniform in the SIMD-group)
  uint head[RB];   // its query head
  uint qb0[RB];    // its first query index (of the whole call)
  int lo[RB], hi[RB];  // the keys this lane's row sees (empty past n_queries)
  simdgroup_matrix<QT, 8, 8> qf[RB][D8];
  simdgroup_float8x8 of[RB][D8];
  float m[RB], l[RB];
  const uint sq = simd * 64;  // this SIMD-group's square in `square`
  MKV_UNROLL for (uint j = 0; j < RB; ++j) {
    const uint b = simd + NS * j;
    used[j] = b < g * qblocks;
    head[j] = hb.head0 + (used[j] ? b / qblocks : 0u);
    qb0[j] = qi0 + (b % qblocks) * 8;
    const uint qi = qb0[j] + r;
    const bool live = used[j] && qi < p.n_queries;
    const int qpos = int(p.q_pos0 + qi);
    hi[j] = live ? attn_prefill_row_hi(p, qpos) : -1;
    lo[j] = live ? (window > 0 ? max(0, qpos - window + 1) : 0) : 0;
    m[j] = -INFINITY;
    l[j] = 0.0f;
    MKV_UNROLL for (uint d = 0; d < D8; ++d) {
      of[j][d] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
      if (!used[j]) {
        qf[j][d] = make_filled_simdgroup_matrix<QT, 8, 8>(QT(0.0f));
        continue;
      }
      // Q's 8x8 square (rows: the block's positions, zero past n_queries), through threadgroup memory.
      for (uint i = lane; i < 64; i += 32) {
        const uint qr = qb0[j] + i / 8;
        square[sq + i] = QT(qr < p.n_queries ? q[(qr * p.n_q_heads + head[j]) * D + 8 * d + i % 8] : 0.0f);
      }
      simdgroup_barrier(mem_flags::mem_threadgroup);
      simdgroup_load(qf[j][d], square + sq, 8);
      simdgroup_barrier(mem_flags::mem_threadgroup);  // before the square is refilled
    }
  }

  // Positions any row of the threadgroup may see, and the ring's part of them (attention_prefill.h).
  const AttnTileKeys keys = attn_prefill_tile_keys<Quant>(p, qi0, min(p.queries_per_tile, p.n_queries - qi0));
  const uint slot_stride = p.n_kv_heads * D;
  const device half* ring_k = (const device half*)ring + kv_head * D;
  const device half* ring_v = ring_k + p.ring_slots * slot_stride;
  int ring_from[RB];  // each row's first key from the ring
  MKV_UNROLL for (uint j = 0; j < RB; ++j) ring_from[j] = attn_prefill_ring_from(p, keys, hi[j]);
  const uint n_tokens = p.q_pos0 + p.n_queries;

  for (uint pass = 0; pass < (keys.res ? 2u : 1u); ++pass) {
    const bool from_ring = pass == 1;
    const int2 tk = attn_prefill_pass_keys(keys, from_ring);
    const int t_lo = tk.x, t_hi = tk.y;
    int plo[RB], phi[RB];
    MKV_UNROLL for (uint j = 0; j < RB; ++j) {
      const int2 rk = attn_prefill_row_keys(lo[j], hi[j], ring_from[j], from_ring);
      plo[j] = rk.x;
      phi[j] = rk.y;
    }
    // Tiles start at multiples of BK: a key's softmax step is fixed by its position.
    // With prefetch the next tile's K/V are fetched into registers while this
    // one's products run.
    constexpr uint NT = NS * 32, SH = prefetch ? attn_prefill_share(D, BK, NT) : 1;
    uint2 kh[SH], vh[SH];
    const int first = t_lo & ~int(BK - 1);
    if (prefetch)
      attn_prefill_fetch<Quant, D, BK, NT, true>(p, kv, table, ring_k, ring_v, kv_head, from_ring, first, t_lo,
                                                 t_hi, tid, kh, vh);
    for (int k0 = first; k0 <= t_hi; k0 += int(BK)) {
      if (prefetch) {
        attn_prefill_put<D, BK, NT, DS>(k_tile, v_tile, tid, kh, vh);
      } else {
        attn_prefill_stage<Quant, D, BK, NT, DS, true>(p, kv, table, ring_k, ring_v, kv_head, from_ring, k0, t_lo,
                                                       t_hi, k_tile, v_tile, tid);
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
      if (prefetch && k0 + int(BK) <= t_hi)
        attn_prefill_fetch<Quant, D, BK, NT, true>(p, kv, table, ring_k, ring_v, kv_head, from_ring, k0 + int(BK),
                                                   t_lo, t_hi, tid, kh, vh);
      // Skip the tile where no row of the SIMD-group sees a key of it (uniform).
      // Otherwise every block computes: for a block whose rows see none of the
      // tile's keys the step is exact no-op (P 0, O and l unchanged), and the
      // products run without a branch between them.
      bool any = false;
      MKV_UNROLL for (uint j = 0; j < RB; ++j) any = any || (plo[j] <= k0 + int(BK) - 1 && phi[j] >= k0);
      if (simd_any(any)) {
        // S = Q Kᵀ for the tile's NB blocks of 8 keys; each K fragment serves every block j.
        simdgroup_float8x8 sf[RB][NB];
        if (paired) {  // two blocks x two dim steps a product group, K fragments four a load
          MKV_UNROLL for (uint kb = 0; kb < NB; kb += 2) {
            MKV_UNROLL for (uint j = 0; j < RB; ++j) {
              sf[j][kb] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
              sf[j][kb + 1] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
            }
            MKV_UNROLL for (uint d = 0; d < D8; d += 2) {
              // Kᵀ (dim, key): keys 8 kb .. + 16, dims 8 d .. + 16.
              simdgroup_half8x8 k00, k01, k10, k11;
              simdgroup_load4<true>(k00, k01, k10, k11, k_tile + 8 * kb * DS + 8 * d, 8, 8 * DS, DS, true);
              MKV_UNROLL for (uint j = 0; j < RB; j += 2) {
                simdgroup_mma_2x2(sf[j][kb], sf[j + 1][kb], qf[j][d], qf[j][d + 1], qf[j + 1][d], qf[j + 1][d + 1],
                                  k00, k01);
                simdgroup_mma_2x2(sf[j][kb + 1], sf[j + 1][kb + 1], qf[j][d], qf[j][d + 1], qf[j + 1][d],
                                  qf[j + 1][d + 1], k10, k11);
              }
            }
          }
        } else {
          MKV_UNROLL for (uint kb = 0; kb < NB; ++kb) {
            MKV_UNROLL for (uint d = 0; d < D8; ++d) {
              simdgroup_half8x8 kf;
              simdgroup_load(kf, k_tile + 8 * kb * DS + 8 * d, DS, ulong2(0, 0), true);  // Kᵀ: (dim, key)
              MKV_UNROLL for (uint j = 0; j < RB; ++j) {
                if (d == 0) {
                  simdgroup_multiply(sf[j][kb], qf[j][d], kf);
                } else {
                  simdgroup_multiply_accumulate(sf[j][kb], qf[j][d], kf, sf[j][kb]);
                }
              }
            }
          }
        }
        // The online softmax over the tile's keys: one step per row and tile.
        simdgroup_matrix<QT, 8, 8> pf[RB][NB];
        MKV_UNROLL for (uint j = 0; j < RB; ++j) {
          // Scores in the softmax's units (natural, or log2 for L2), soft-capped
          // (c tanh(x / c) commutes with the unit), masked where the tile is not
          // all visible to the block's rows (each check once a tile).
          float s[NB][2];
          MKV_UNROLL for (uint kb = 0; kb < NB; ++kb)
            MKV_UNROLL for (uint i = 0; i < 2; ++i) s[kb][i] = sf[j][kb].thread_elements()[i] * score_scale;
          if (p.softcap > 0.0f) {
            MKV_UNROLL for (uint kb = 0; kb < NB; ++kb)
              MKV_UNROLL for (uint i = 0; i < 2; ++i) s[kb][i] = cap * tanh(s[kb][i] / cap);
          }
          if (!simd_all(plo[j] <= k0 && phi[j] >= k0 + int(BK) - 1)) {
            MKV_UNROLL for (uint kb = 0; kb < NB; ++kb) {
              MKV_UNROLL for (uint i = 0; i < 2; ++i) {
                const int key = k0 + int(8 * kb + c + i);
                s[kb][i] = key >= plo[j] && key <= phi[j] ? s[kb][i] : -INFINITY;
              }
            }
          }
          if (!L2 && p.logits != 0) {  // a policy's logits: every visible key's (natural units)
            MKV_UNROLL for (uint kb = 0; kb < NB; ++kb) {
              MKV_UNROLL for (uint i = 0; i < 2; ++i) {
                const int key = k0 + int(8 * kb + c + i);
                if (s[kb][i] != -INFINITY)
                  logits[((qb0[j] + r) * p.n_q_heads + head[j]) * n_tokens + uint(key)] = s[kb][i];
              }
            }
          }
          float mx = -INFINITY;
          MKV_UNROLL for (uint kb = 0; kb < NB; ++kb)
            MKV_UNROLL for (uint i = 0; i < 2; ++i) mx = max(mx, s[kb][i]);
          mx = max(mx, simd_shuffle_xor(mx, ushort(1)));
          mx = max(mx, simd_shuffle_xor(mx, kFragmentRowXor));
          const float m_new = max(m[j], mx);
          // A row that has seen no key yet (m_new -inf) subtracts 0: its P and
          // factor come out 0 with no select per element, and O and l, 0 until
          // then, stay 0. Half operands take the device's fast exp2: P is
          // rounded to half next, far coarser than its error.
          const float m_sub = m_new == -INFINITY ? 0.0f : m_new;
          const float factor = L2 ? fast::exp2(m[j] - m_sub) : exp(m[j] - m_sub);
          float sum = 0.0f;
          MKV_UNROLL for (uint kb = 0; kb < NB; ++kb) {
            MKV_UNROLL for (uint i = 0; i < 2; ++i) {
              const QT pr = QT(L2 ? fast::exp2(s[kb][i] - m_sub) : exp(s[kb][i] - m_sub));
              pf[j][kb].thread_elements()[i] = pr;
              sum += float(pr);
            }
          }
          sum += simd_shuffle_xor(sum, ushort(1));
          sum += simd_shuffle_xor(sum, kFragmentRowXor);
          l[j] = l[j] * factor + sum;
          m[j] = m_new;
          // O's rescale, skipped where no row's max moved (most tiles past the first few).
          if (!simd_all(factor == 1.0f)) {
            MKV_UNROLL for (uint d = 0; d < D8; ++d) {
              of[j][d].thread_elements()[0] *= factor;
              of[j][d].thread_elements()[1] *= factor;
            }
          }
        }
        // O += P V; each V fragment serves every block j.
        if (paired) {  // two blocks x two key steps a product group, V fragments four a load
          MKV_UNROLL for (uint d = 0; d < D8; d += 2) {
            MKV_UNROLL for (uint kb = 0; kb < NB; kb += 2) {
              // V (key, dim): keys 8 kb .. + 16, dims 8 d .. + 16.
              simdgroup_half8x8 v00, v10, v01, v11;
              simdgroup_load4<true>(v00, v10, v01, v11, v_tile + 8 * kb * DS + 8 * d, 8 * DS, 8, DS);
              MKV_UNROLL for (uint j = 0; j < RB; j += 2) {
                simdgroup_mma_2x2(of[j][d], of[j + 1][d], pf[j][kb], pf[j][kb + 1], pf[j + 1][kb], pf[j + 1][kb + 1],
                                  v00, v10);
                simdgroup_mma_2x2(of[j][d + 1], of[j + 1][d + 1], pf[j][kb], pf[j][kb + 1], pf[j + 1][kb],
                                  pf[j + 1][kb + 1], v01, v11);
              }
            }
          }
        } else {
          MKV_UNROLL for (uint d = 0; d < D8; ++d) {
            MKV_UNROLL for (uint kb = 0; kb < NB; ++kb) {
              simdgroup_half8x8 vf;
              simdgroup_load(vf, v_tile + 8 * kb * DS + 8 * d, DS);  // (key, dim)
              MKV_UNROLL for (uint j = 0; j < RB; ++j) simdgroup_multiply_accumulate(of[j][d], pf[j][kb], vf, of[j][d]);
            }
          }
        }
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);  // the tile is overwritten next
    }
  }

  MKV_UNROLL for (uint j = 0; j < RB; ++j) {
    const uint qi = qb0[j] + r;
    if (!used[j] || qi >= p.n_queries) continue;
    const float sink = p.has_sinks ? sinks[head[j]] : 0.0f;
    device float* o = out + (qi * p.n_q_heads + head[j]) * D + c;
    MKV_UNROLL for (uint d = 0; d < D8; ++d)
      MKV_UNROLL for (uint i = 0; i < 2; ++i)
        o[8 * d + i] = attn_finish_sink<L2>(m[j], l[j], of[j][d].thread_elements()[i], p.has_sinks != 0,
                                            L2 ? sink * LOG2E : sink);
  }
}
