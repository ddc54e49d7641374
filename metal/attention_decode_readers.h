// Decode attention's K/V readers (attention_decode.h's bodies take one as a
// template argument): where a lane's pieces of a K and a V row come from and
// how they become floats, for f16 rows, the residual window's ring and the
// quantized formats (kv_codec.h), and a lane's several pieces as one run of
// elements (the host's shape).
#pragma once

#include "attention.h"
#include "kv_codec.h"
#include "kv_table.h"

// One lane's piece of a K/V row: 8 bytes (E = 4) or 16 bytes (E = 8).
template <uint E>
struct AttnPiece;
template <>
struct AttnPiece<4> {
  typedef uint2 type;
};
template <>
struct AttnPiece<8> {
  typedef uint4 type;
};

inline void attn_unpack(uint2 w, thread float (&out)[4]) {
  const float4 a = float4(as_type<half4>(w));
  out[0] = a.x;
  out[1] = a.y;
  out[2] = a.z;
  out[3] = a.w;
}
inline void attn_unpack(uint4 w, thread float (&out)[8]) {
  const float4 a = float4(as_type<half4>(w.xy));
  const float4 b = float4(as_type<half4>(w.zw));
  out[0] = a.x;
  out[1] = a.y;
  out[2] = a.z;
  out[3] = a.w;
  out[4] = b.x;
  out[5] = b.y;
  out[6] = b.z;
  out[7] = b.w;
}

// Where a lane's K and V pieces come from, and how they become floats: one
// of two readers, a template argument of the body.
//   AttnKvF16    f16 K and V: a piece is E raw halfs (the f16 kernels)
//   AttnKvQuant  each of K and V in its format (kv_format.h): a piece is E
//                f16/q8/q4 values and their group's scale, dequantized
//                in registers. KF, VF: the formats as compile-time constants
//                (offsets fold, unused piece parts go), or kKvAnyFormat for
//                the one kernel that reads any pair (uniform branches)
// Both read lane piece `elem` of KV head `head` of the slot they are given.
template <uint D, uint E>
struct AttnKvF16 {
  enum { kElems = E };
  typedef typename AttnPiece<E>::type Piece;
  typedef Piece KPiece;
  typedef Piece VPiece;
  const device half* k_base;
  const device half* v_base;
  uint slot_stride;  // halfs from one slot to the next

  static AttnKvF16 make(constant mkv_params::AttnDecode& p, const device uchar* kv, uint head, uint elem) {
    AttnKvF16 r;
    r.slot_stride = p.n_kv_heads * D;
    r.k_base = (const device half*)kv + head * D + elem;
    r.v_base = r.k_base + p.slots * r.slot_stride;
    return r;
  }
  static uint slot(uint entry, uint pos) { return kv_slot_in(entry, pos); }
  void load(uint slot, thread Piece& k, thread Piece& v) const {
    k = *(const device Piece*)(k_base + slot * slot_stride);
    v = *(const device Piece*)(v_base + slot * slot_stride);
  }
  void unpack_k(Piece w, thread float (&out)[E]) const { attn_unpack(w, out); }
  void unpack_v(Piece w, thread float (&out)[E]) const { attn_unpack(w, out); }
};

// The residual window's ring (AttnDecode::residual): f16 rows by position,
// not through the block table.
template <uint D, uint E>
struct AttnKvRing : AttnKvF16<D, E> {
  uint ring_slots;
  static AttnKvRing make(constant mkv_params::AttnDecode& p, const device uchar* ring, uint head, uint elem) {
    AttnKvRing r;
    r.slot_stride = p.n_kv_heads * D;
    r.k_base = (const device half*)ring + head * D + elem;
    r.v_base = r.k_base + p.ring_slots * r.slot_stride;
    r.ring_slots = p.ring_slots;
    return r;
  }
  uint slot(uint, uint pos) const { return pos % ring_slots; }
};

constant constexpr uint kKvAnyFormat = 0xffu;

// One section's pieces: format F fixed (KvFixedPiece) or any (KvPiece, the
// format read at run time). q2 as a constant takes KvPiece's path too (its
// pieces are dequantized at load) with the format folded.
template <uint F, uint E, bool GENERIC = (F == kKvAnyFormat || mkv_params::kv_is_q2(F))>
struct AttnKvSection {
  typedef typename mkv_kv::KvFixedPiece<F, E>::type Piece;
  static Piece read(const device uchar* s, uint, uint heads, uint D, uint slot, uint head, uint elem) {
    return mkv_kv::KvFixedPiece<F, E>::fetch(s, heads, D, slot, head, elem);
  }
  static void widen(uint, Piece p, thread float (&out)[E]) { mkv_kv::KvFixedPiece<F, E>::expand(p, out); }
};
template <uint F, uint E>
struct AttnKvSection<F, E, true> {
  typedef mkv_kv::KvPiece Piece;
  static uint format(uint fmt) { return F == kKvAnyFormat ? fmt : F; }
  static Piece read(const device uchar* s, uint fmt, uint heads, uint D, uint slot, uint head, uint elem) {
    return mkv_kv::kv_load_piece<E>(s, format(fmt), mkv_params::kKvBlockTokens, heads, D, slot, head, elem);
  }
  static void widen(uint fmt, Piece p, thread float (&out)[E]) { mkv_kv::kv_unpack_piece<E>(format(fmt), p, out); }
};

template <uint D, uint E, uint KF = kKvAnyFormat, uint VF = kKvAnyFormat>
struct AttnKvQuant {
  enum { kElems = E };
  typedef AttnKvSection<KF, E> KS;
  typedef AttnKvSection<VF, E> VS;
  typedef typename KS::Piece KPiece;
  typedef typename VS::Piece VPiece;
  const device uchar* k_section;
  const device uchar* v_section;
  uint k_format, v_format, heads, head, elem;

  static AttnKvQuant make(constant mkv_params::AttnDecode& p, const device uchar* kv, uint head, uint elem) {
    AttnKvQuant r;
    r.k_format = KF == kKvAnyFormat ? p.k_format : KF;
    r.v_format = VF == kKvAnyFormat ? p.v_format : VF;
    r.heads = p.n_kv_heads;
    r.head = head;
    r.elem = elem;
    r.k_section = kv;
    r.v_section = kv + p.slots * mkv_params::kv_slot_bytes(r.k_format, p.n_kv_heads, D);
    return r;
  }
  static uint slot(uint entry, uint pos) { return kv_slot_in(entry, pos); }
  void load(uint slot, thread KPiece& k, thread VPiece& v) const {
    k = KS::read(k_section, k_format, heads, D, slot, head, elem);
    v = VS::read(v_section, v_format, heads, D, slot, head, elem);
  }
  void unpack_k(KPiece w, thread float (&out)[E]) const { KS::widen(k_format, w, out); }
  void unpack_v(VPiece w, thread float (&out)[E]) const { VS::widen(v_format, w, out); }
};

// Which of a reader's pieces attn_unpack_lane widens: K's or V's.
struct AttnSideK {
  template <typename L, typename W>
  static void widen(thread const L& ld, W w, thread float (&x)[L::kElems]) { ld.unpack_k(w, x); }
};
struct AttnSideV {
  template <typename L, typename W>
  static void widen(thread const L& ld, W w, thread float (&x)[L::kElems]) { ld.unpack_v(w, x); }
};

// A lane's EL elements of a row from its P = EL / E pieces (Side: K or V).
template <typename Side, typename L, uint P, uint EL, typename W>
inline void attn_unpack_lane(thread const L (&ld)[P], thread const W (&w)[P], thread float (&out)[EL]) {
  MKV_UNROLL for (uint j = 0; j < P; ++j) {
    float x[L::kElems];
    Side::widen(ld[j], w[j], x);
    MKV_UNROLL for (uint e = 0; e < L::kElems; ++e) out[j * L::kElems + e] = x[e];
  }
}
