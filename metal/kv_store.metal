// KV store kernels: the model's new K and V rows (float) become rows of a
// cache region in its formats (metal/kv_format.h): K section, then V section.
// K is optionally RoPE-rotated on the way (positions first_pos + t), and the
// rope kernels can rotate the step's queries in place in the same dispatch.
// Quantized sections get their codes from the rotated values: quantization
// happens after RoPE, in this dispatch; an f16 copy is written only to a
// residual window's ring (p.ring_slots), from which kv_seal_q2k quantizes a
// q2 K block per channel once it is full. With
// p.rotate (kv_rotate), K is roped and then Hadamard-rotated in place in
// k_new, V is rotated in place in v_new, and the queries get the same
// rotation as K, before anything is stored (hadamard.h).
//
// The compute store writes straight into a layer's pool, each token to the slot
// its position's block-table entry gives; the blit store runs the very same
// kernel into consecutive rows of a staging buffer and copies the rows with a
// blit encoder. One kernel for both paths keeps them bit-identical.
//
// Names: kv_store_f32 (no rope), kv_store_f32_rope_neox, kv_store_f32_rope_interleaved.
#include "mkv_kernel.h"
#include "kv_params.h"
#include "kv_table.h"
#include "kv_codec.h"
#include "hadamard.h"
#include "rope.h"

// Element d of a head after RoPE (rotary dims rd; d >= rd is copied): the
// same rotate() of its pair as the f16 path computes, so both give equal floats.
template <mkv_rope::Style S>
inline float kv_store_value(const device float* x, uint d, uint rd, uint pos, const device float* inv_freq) {
  if (d >= rd) return x[d];
  const bool second = S == mkv_rope::kStyleNeox ? d >= rd / 2 : (d & 1u) != 0;
  const uint i = S == mkv_rope::kStyleNeox ? (second ? d - rd / 2 : d) : d / 2;
  const uint2 e = mkv_rope::pair_elements<S>(i, rd);
  const float2 r = mkv_rope::rotate(x[e.x], x[e.y], pos, inv_freq[i]);
  return second ? r.y : r.x;
}

// One threadgroup per (token, K|V) = (tg.x, tg.y). Its threads stride over the
// work items of the token's n_kv_heads rows. f16: a roped K head has
// rotary_dim/2 pair items (each reads and writes both elements of its pair,
// so no two threads touch one element) followed by one item per dim past
// rotary_dim; a V head, or K without rope, has one item per dim. Quantized:
// one item per (head, group), which finds the group's range over the
// (rotated) values, writes its parameters, then its codes. A third row of
// threadgroups (tg.y == 2, only when p.n_q_heads > 0) rotates Q in place: one
// item per pair, as rope.metal does.
template <mkv_rope::Style S>
inline void kv_store_rows(constant mkv_params::KvStore& p,
                          device float* k_new,        // (n_new, n_kv_heads, head_dim); rotated in place
                          device float* v_new,        // (n_new, n_kv_heads, head_dim)    with p.rotate
                          device uchar* dst,          // K section, then V section, of dst_rows slots
                          const device float* inv_freq,  // (rotary_dim / 2); unused without rope
                          const device uint* table,      // block table (paged); unused otherwise
                          device half* ring,             // residual window (p.ring_slots > 0)
                          uint2 tg, uint tid, uint nt) {
  const uint t = tg.x;
  const bool is_k = tg.y == 0;
  const uint D = p.head_dim, H = p.n_kv_heads;
  const uint pos = p.first_pos + t;
  const uint slot = p.paged ? kv_slot(table, p.first_index + t) : p.dst_first_row + t;
  const uint unit = p.paged ? mkv_params::kKvBlockTokens : p.dst_rows;
  const uint fmt = is_k ? p.k_format : p.v_format;
  device float* src = (is_k ? k_new : v_new) + t * H * D;
  device uchar* section = dst + (is_k ? 0u : p.dst_rows * mkv_params::kv_slot_bytes(p.k_format, H, D));
  if (p.rotate) {  // uniform: every thread of the threadgroup meets the barriers
    if (S != mkv_rope::kStyleNone && is_k) mkv_rope::rotate_heads<S>(src, H, D, p.rotary_dim, pos, inv_freq, tid, nt);
    mkv_hadamard::rotate_heads(src, H, D, tid, nt);
  }
  const uint rd = (S != mkv_rope::kStyleNone && is_k && !p.rotate) ? p.rotary_dim : 0u;  // rotated: roped already

  if (p.ring_slots > 0) {  // the row in f16 to the ring (the f16 path's values, element by element)
    device half* r = ring + ((is_k ? 0u : p.ring_slots) + pos % p.ring_slots) * H * D;
    for (uint j = tid; j < H * D; j += nt) r[j] = half(kv_store_value<S>(src + (j / D) * D, j % D, rd, pos, inv_freq));
    if (fmt == mkv_params::kKvQ2K) return;  // kv_seal_q2k quantizes the block when it is full
  }
  if (fmt == mkv_params::kKvQ2V) {  // one item per (head, group): range, (scale, lo), codes
    const uint G = mkv_params::kv_group(fmt, D);
    for (uint j = tid; j < H * (D / G); j += nt) {
      const uint h = j / (D / G);
      const uint d0 = (j - h * (D / G)) * G;
      const device float* x = src + h * D;
      float mn = INFINITY, mx = -INFINITY;
      for (uint d = d0; d < d0 + G; ++d) {
        const float v = kv_store_value<S>(x, d, rd, pos, inv_freq);
        mn = min(mn, v);
        mx = max(mx, v);
      }
      const half2 prm = mkv_kv::kv_q2_params(mn, mx);
      *(device half2*)(section + mkv_params::kv_param_offset(fmt, unit, H, D, slot, h, d0)) = prm;
      device uchar* data = section + mkv_params::kv_data_offset(fmt, unit, H, D, slot, h, d0);
      for (uint d = 0; d < G; d += 4) {
        uint byte = 0;
        for (uint i = 0; i < 4; ++i)
          byte |= mkv_kv::kv_q2_code(kv_store_value<S>(x, d0 + d + i, rd, pos, inv_freq), prm) << (2 * i);
        data[d / 4] = uchar(byte);
      }
    }
    return;
  }

  if (fmt == mkv_params::kKvF16) {
    const uint pairs = rd / 2;
    const uint items = pairs + (D - rd);  // per head
    for (uint j = tid; j < H * items; j += nt) {
      const uint h = j / items;
      const uint item = j - h * items;
      const device float* x = src + h * D;
      device half* y = (device half*)(section + mkv_params::kv_data_offset(fmt, unit, H, D, slot, h, 0));
      if (item < pairs) {
        const uint2 e = mkv_rope::pair_elements<S>(item, rd);
        const float2 r = mkv_rope::rotate(x[e.x], x[e.y], pos, inv_freq[item]);
        y[e.x] = half(r.x);
        y[e.y] = half(r.y);
      } else {
        const uint d = rd + (item - pairs);
        y[d] = half(x[d]);
      }
    }
    return;
  }
  const uint G = mkv_params::kv_group(fmt, D);
  const uint groups = D / G;
  for (uint j = tid; j < H * groups; j += nt) {
    const uint h = j / groups;
    const uint d0 = (j - h * groups) * G;
    const device float* x = src + h * D;
    float amax = 0.0f, extreme = 0.0f;  // the largest |x|, and the x holding it (the first)
    for (uint d = d0; d < d0 + G; ++d) {
      const float v = kv_store_value<S>(x, d, rd, pos, inv_freq);
      if (fabs(v) > amax) {
        amax = fabs(v);
        extreme = v;
      }
    }
    const half prm = mkv_kv::kv_group_scale(fmt, amax, extreme);
    *(device half*)(section + mkv_params::kv_param_offset(fmt, unit, H, D, slot, h, d0)) = prm;
    device uchar* data = section + mkv_params::kv_data_offset(fmt, unit, H, D, slot, h, d0);
    if (fmt == mkv_params::kKvQ8) {
      for (uint d = 0; d < G; ++d)
        data[d] = uchar(mkv_kv::kv_code(fmt, kv_store_value<S>(x, d0 + d, rd, pos, inv_freq), prm) & 0xff);
    } else {
      for (uint d = 0; d < G; d += 2) {
        const int lo = mkv_kv::kv_code(fmt, kv_store_value<S>(x, d0 + d, rd, pos, inv_freq), prm);
        const int hi = mkv_kv::kv_code(fmt, kv_store_value<S>(x, d0 + d + 1, rd, pos, inv_freq), prm);
        data[d / 2] = uchar(lo | (hi << 4));
      }
    }
  }
}

MKV_MAX_THREADS(256) kernel void kv_store_f32(constant mkv_params::KvStore& p [[buffer(0)]],
                         device float* k_new [[buffer(1)]],
                         device float* v_new [[buffer(2)]],
                         device uchar* dst [[buffer(3)]],
                         const device uint* table [[buffer(6)]],  // block table; dst when not paged
                         device half* ring [[buffer(7)]],         // residual window; dst without one
                         uint2 tg [[threadgroup_position_in_grid]],
                         uint tid [[thread_index_in_threadgroup]],
                         uint nt [[threads_per_threadgroup]]) {
  kv_store_rows<mkv_rope::kStyleNone>(p, k_new, v_new, dst, k_new, table, ring, tg, tid, nt);
}

template <mkv_rope::Style S>
MKV_MAX_THREADS(256) [[kernel]] void kv_store_f32_rope(constant mkv_params::KvStore& p [[buffer(0)]],
                              device float* k_new [[buffer(1)]],
                              device float* v_new [[buffer(2)]],
                              device uchar* dst [[buffer(3)]],
                              const device float* inv_freq [[buffer(4)]],
                              device float* q [[buffer(5)]],  // (n_new, n_q_heads, head_dim) if p.n_q_heads
                              const device uint* table [[buffer(6)]],  // block table; dst when not paged
                              device half* ring [[buffer(7)]],         // residual window; dst without one
                              uint2 tg [[threadgroup_position_in_grid]],
                              uint tid [[thread_index_in_threadgroup]],
                              uint nt [[threads_per_threadgroup]]) {
  if (tg.y == 2) {  // the queries, rotated in place
    device float* row = q + tg.x * p.n_q_heads * p.head_dim;
    mkv_rope::rotate_heads<S>(row, p.n_q_heads, p.head_dim, p.rotary_dim, p.first_pos + tg.x, inv_freq, tid, nt);
    if (p.rotate) mkv_hadamard::rotate_heads(row, p.n_q_heads, p.head_dim, tid, nt);
    return;
  }
  kv_store_rows<S>(p, k_new, v_new, dst, inv_freq, table, ring, tg, tid, nt);
}

// One threadgroup per (block, head); thread i takes channel quads i, i + 32, ...
// (a quad's codes share a byte of every token's row): each quad's range over
// the block's tokens, its (scale, lo) pairs, then one code byte per token.
// Rows below ring_lo come from the block's own codes (read before rewritten).
MKV_MAX_THREADS(32) kernel void kv_seal_q2k(constant mkv_params::KvSeal& p [[buffer(0)]],
                        device uchar* dst [[buffer(1)]],         // the layer's pool; its K section first
                        const device half* ring [[buffer(2)]],   // the residual window's ring (K first)
                        const device uint* table [[buffer(3)]],  // block table
                        uint2 tg [[threadgroup_position_in_grid]],
                        uint tid [[thread_index_in_threadgroup]]) {
  constexpr uint B = mkv_params::kKvBlockTokens;
  constexpr uint F = mkv_params::kKvQ2K;
  const uint D = p.head_dim, H = p.n_kv_heads, h = tg.y;
  const uint first = p.first_pos + tg.x * B;
  const uint slot0 = kv_slot(table, first);
  for (uint c0 = tid * 4; c0 < D; c0 += 32 * 4) {
    device half2* prm = (device half2*)(dst + mkv_params::kv_param_offset(F, B, H, D, slot0, h, c0));
    half2 old[4];
    float mn[4], mx[4];
    for (uint i = 0; i < 4; ++i) {
      old[i] = prm[i];
      mn[i] = INFINITY;
      mx[i] = -INFINITY;
    }
    for (uint t = 0; t < B; ++t) {
      const uint pos = first + t;
      const uint code = dst[mkv_params::kv_data_offset(F, B, H, D, slot0 + t, h, c0)];
      for (uint i = 0; i < 4; ++i) {
        const float v = pos >= p.ring_lo ? float(ring[((pos % p.ring_slots) * H + h) * D + c0 + i])
                                         : float(half(mkv_kv::kv_q2_value((code >> (2 * i)) & 3u, old[i])));
        mn[i] = min(mn[i], v);
        mx[i] = max(mx[i], v);
      }
    }
    half2 now[4];
    for (uint i = 0; i < 4; ++i) now[i] = mkv_kv::kv_q2_params(mn[i], mx[i]);
    for (uint t = 0; t < B; ++t) {
      const uint pos = first + t;
      device uchar* data = dst + mkv_params::kv_data_offset(F, B, H, D, slot0 + t, h, c0);
      const uint code = *data;
      uint byte = 0;
      for (uint i = 0; i < 4; ++i) {
        const float v = pos >= p.ring_lo ? float(ring[((pos % p.ring_slots) * H + h) * D + c0 + i])
                                         : float(half(mkv_kv::kv_q2_value((code >> (2 * i)) & 3u, old[i])));
        byte |= mkv_kv::kv_q2_code(v, now[i]) << (2 * i);
      }
      *data = uchar(byte);
    }
    for (uint i = 0; i < 4; ++i) prm[i] = now[i];
  }
}

MKV_KERNEL("kv_store_f32_rope_neox", kv_store_f32_rope<mkv_rope::kStyleNeox>)
MKV_KERNEL("kv_store_f32_rope_interleaved", kv_store_f32_rope<mkv_rope::kStyleInterleaved>)
