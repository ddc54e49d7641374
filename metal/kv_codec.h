// Quantizing and reading the KV formats of kv_format.h inside the kernels:
// the store writes a group's codes and parameters, attention reads pieces of
// a row and dequantizes them in registers (never a dequantized copy).
#pragma once

#include "mkv_kernel.h"  // metal_stdlib, using namespace metal
#include "kv_format.h"

namespace mkv_kv {

// The group's half scale from its largest |x| and the signed value holding it.
inline half kv_group_scale(uint fmt, float amax, float extreme) {
  return fmt == mkv_params::kKvQ8 ? half(amax / 127.0f) : half(extreme / -8.0f);
}

// The code of value x under the group's scale, clamped to the format's
// range (q4 offset by 8); a zero scale gives 0 (q4: 8, also value 0).
inline int kv_code(uint fmt, float x, half scale) {
  const float s = float(scale);
  const float inv = s != 0.0f ? 1.0f / s : 0.0f;
  const float c = rint(x * inv);
  return fmt == mkv_params::kKvQ8 ? int(clamp(c, -127.0f, 127.0f)) : int(clamp(c + 8.0f, 0.0f, 15.0f));
}

// q2: a group's (scale, lo) from its range, and the code of value x under them.
inline half2 kv_q2_params(float mn, float mx) { return half2(half((mx - mn) / 3.0f), half(mn)); }
inline uint kv_q2_code(float x, half2 prm) {
  const float s = float(prm.x);
  const float inv = s != 0.0f ? 1.0f / s : 0.0f;
  return uint(clamp(rint((x - float(prm.y)) * inv), 0.0f, 3.0f));
}
inline float kv_q2_value(uint code, half2 prm) { return float(code) * float(prm.x) + float(prm.y); }

// One lane's piece of a row: up to 16 bytes of f16, q8 or q4 data, and its
// group's scale as a float (q2: dequantized at load, E halfs as f16's).
struct KvPiece {
  uint4 raw;
  float scale;
};

// Loads the piece of E elements at element `elem` of (slot, head) from a
// section of format fmt (cut into units of `unit_rows` slots).
template <uint E>
inline KvPiece kv_load_piece(const device uchar* section, uint fmt, uint unit_rows, uint heads, uint D,
                             uint slot, uint head, uint elem) {
  KvPiece p;
  p.raw = uint4(0u);
  p.scale = 1.0f;
  const device uchar* data = section + mkv_params::kv_data_offset(fmt, unit_rows, heads, D, slot, head, elem);
  if (fmt == mkv_params::kKvF16) {
    if (E == 8) p.raw = *(const device uint4*)data;
    else p.raw.xy = *(const device uint2*)data;
    return p;
  }
  if (mkv_params::kv_is_q2(fmt)) {
    const uint codes = E == 8 ? uint(*(const device ushort*)data) : uint(*data);
    const device uchar* prm = section + mkv_params::kv_param_offset(fmt, unit_rows, heads, D, slot, head, elem);
    half v[8];
    MKV_UNROLL for (uint e = 0; e < E; ++e) {
      const half2 pr = *(const device half2*)(prm + (fmt == mkv_params::kKvQ2K ? e * 4 : 0));
      v[e] = half(kv_q2_value((codes >> (2 * e)) & 3u, pr));
    }
    p.raw.x = as_type<uint>(half2(v[0], v[1]));
    p.raw.y = as_type<uint>(half2(v[2], v[3]));
    if (E == 8) {
      p.raw.z = as_type<uint>(half2(v[4 % E], v[5 % E]));
      p.raw.w = as_type<uint>(half2(v[6 % E], v[7 % E]));
    }
    return p;
  }
  if (fmt == mkv_params::kKvQ8) {
    if (E == 8) p.raw.xy = *(const device uint2*)data;
    else p.raw.x = *(const device uint*)data;
  } else {
    if (E == 8) p.raw.x = *(const device uint*)data;
    else p.raw.x = uint(*(const device ushort*)data);
  }
  p.scale = float(*(const device half*)(section + mkv_params::kv_param_offset(fmt, unit_rows, heads, D, slot, head, elem)));
  return p;
}

// The piece's E values as floats.
template <uint E>
inline void kv_unpack_piece(uint fmt, KvPiece p, thread float (&out)[E]) {
  if (fmt == mkv_params::kKvF16 || mkv_params::kv_is_q2(fmt)) {
    const float4 a = float4(as_type<half4>(p.raw.xy));
    out[0] = a.x;
    out[1] = a.y;
    out[2] = a.z;
    out[3] = a.w;
    if (E == 8) {
      const float4 b = float4(as_type<half4>(p.raw.zw));
      out[4 % E] = b.x;
      out[5 % E] = b.y;
      out[6 % E] = b.z;
      out[7 % E] = b.w;
    }
  } else if (fmt == mkv_params::kKvQ8) {
    MKV_UNROLL for (uint e = 0; e < E; ++e) {
      const uint word = e < 4 ? p.raw.x : p.raw.y;
      out[e] = float(int(char((word >> (8 * (e % 4))) & 0xffu))) * p.scale;
    }
  } else {
    MKV_UNROLL for (uint e = 0; e < E; ++e) out[e] = (float((p.raw.x >> (4 * e)) & 0xfu) - 8.0f) * p.scale;
  }
}

// A piece of a format known at compile time (q8 or q4), as small as it is:
// its code words and its group's parameters as raw half bits (a q4 piece of 8
// elements is 2 registers where KvPiece takes 6).
constexpr uint kv_fixed_words(uint F, uint E) { return F == mkv_params::kKvQ8 ? (E + 3) / 4 : (E + 7) / 8; }

template <uint F, uint E>
struct KvFixedPiece {
  struct type {
    uint w[kv_fixed_words(F, E)];
    uint prm;  // the half scale's bits
  };
  static type fetch(const device uchar* section, uint heads, uint D, uint slot, uint head, uint elem) {
    constexpr uint B = mkv_params::kKvBlockTokens;
    type t;
    const device uchar* data = section + mkv_params::kv_data_offset(F, B, heads, D, slot, head, elem);
    const device uchar* prm = section + mkv_params::kv_param_offset(F, B, heads, D, slot, head, elem);
    if (F == mkv_params::kKvQ8 && E == 8) {
      const uint2 a = *(const device uint2*)data;
      t.w[0] = a.x;
      t.w[kv_fixed_words(F, E) - 1] = a.y;
    } else if (F == mkv_params::kKvQ8 || E == 8) {
      t.w[0] = *(const device uint*)data;
    } else {
      t.w[0] = uint(*(const device ushort*)data);
    }
    t.prm = uint(*(const device ushort*)prm);
    return t;
  }
  static void expand(type t, thread float (&out)[E]) {
    const float scale = float(as_type<half>(ushort(t.prm)));
    if (F == mkv_params::kKvQ8) {
      MKV_UNROLL for (uint e = 0; e < E; ++e)
        out[e] = float(int(char((t.w[e / 4] >> (8 * (e % 4))) & 0xffu))) * scale;
    } else {
      MKV_UNROLL for (uint e = 0; e < E; ++e) out[e] = (float((t.w[0] >> (4 * e)) & 0xfu) - 8.0f) * scale;
    }
  }
};

// Four consecutive q8 or q4 codes at `data` (q4: two bytes, the first
// element in the low nibble), times their group's scale, rounded to half.
inline half4 kv_codes4(uint fmt, const device uchar* data, float scale) {
  float4 v;
  if (fmt == mkv_params::kKvQ8) {
    v = float4(*(const device char4*)data) * scale;
  } else {
    const uint q = uint(*(const device ushort*)data);
    v = (float4(float(q & 0xfu), float((q >> 4) & 0xfu), float((q >> 8) & 0xfu), float((q >> 12) & 0xfu)) - 8.0f) *
        scale;
  }
  return half4(v);
}

// Four consecutive elements c .. c + 3 (c % 4 == 0) of (slot, head),
// dequantized to half: what prefill stages in threadgroup memory.
inline half4 kv_load4(const device uchar* section, uint fmt, uint unit_rows, uint heads, uint D, uint slot,
                      uint head, uint c) {
  const device uchar* data = section + mkv_params::kv_data_offset(fmt, unit_rows, heads, D, slot, head, c);
  if (fmt == mkv_params::kKvF16) return *(const device half4*)data;
  if (mkv_params::kv_is_q2(fmt)) {
    const uint codes = uint(*data);
    const device uchar* prm = section + mkv_params::kv_param_offset(fmt, unit_rows, heads, D, slot, head, c);
    const uint step = fmt == mkv_params::kKvQ2K ? 4u : 0u;  // q2k: a pair per channel
    half4 v;
    MKV_UNROLL for (uint e = 0; e < 4; ++e)
      v[e] = half(kv_q2_value((codes >> (2 * e)) & 3u, *(const device half2*)(prm + e * step)));
    return v;
  }
  const float scale = float(*(const device half*)(section + mkv_params::kv_param_offset(fmt, unit_rows, heads, D, slot,
                                                                                       head, c)));
  return kv_codes4(fmt, data, scale);
}

}  // namespace mkv_kv
