// Weight formats read inside the kernels: f32, f16, bf16 and the GGUF blocks
// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (32 weights a block) and Q4_K, Q5_K, Q6_K
// (256-weight super-blocks), with the fields of ggml's block_* structs
// (ggml-common.h). Weights are dequantized in registers; nothing is inflated
// in device memory. Q4_K and Q5_K rows are read as they are in the file; the
// blocks whose size leaves their quants misaligned (Q8_0, Q4_0, Q4_1, Q5_0,
// Q5_1, Q6_K) are packed at load into planes of one field each
// (metal/linear_params.h, kPackedRowAlign; cpp/ops/weight_pack.cpp), so every
// chunk's quants are one aligned 16-byte load.
//
// A row of n weights is split into chunks of F::kChunk consecutive weights;
// a chunk is what one lane handles per step. Every format F provides:
//   F::kChunk                          weights per chunk
//   F::kBlock                          weights per block (1 for the float types);
//                                      a row is a whole number of blocks
//   F::row_bytes(n)                    bytes of a row of n weights on the device
//   F::load(row, n, c, w)              w[0..kChunk/4) = weights of chunk c
//   F::Raw, F::fetch(row, n, c)        chunk c's bytes as loaded (quant words,
//                                      scale, min), no arithmetic on them
//   F::dot(raw, x, xsum)               Σ_j w[j]·x[j] over the fetched chunk,
//                                      where x[0..kChunk/4) are the matching
//                                      activations and xsum = Σ_j x[j]
// (w and x are float4 arrays: chunk element j is w[j / 4][j % 4]).
// `row` points at the first byte of the row, n is the row's length in weights
// (where a packed row's planes start). Quantized chunks are 16 weights
// that share one scale (and min): half a 32-block, half a K-quant sub-block of
// 32 (Q4_K, Q5_K) or one sub-block of 16 (Q6_K). So a 32-block is 2 chunks and
// a super-block 16, and every chunk knows its block as c / (kBlock / 16).
#pragma once

#include "mkv_kernel.h"  // metal_stdlib, using namespace metal
#include "linear_params.h"

// ---- GGUF blocks of 32 weights ----------------------------------------------
struct block_q8_0 {
  half d;       // scale
  char qs[32];  // weight j = qs[j] * d
};
struct block_q4_0 {
  half d;        // scale
  uchar qs[16];  // weight j = (qs[j] & 15) - 8, weight 16 + j = (qs[j] >> 4) - 8; times d
};
struct block_q4_1 {
  half d;        // scale
  half m;        // minimum
  uchar qs[16];  // weight j = (qs[j] & 15) * d + m, weight 16 + j = (qs[j] >> 4) * d + m
};
// Q5: the 4 low bits as in Q4, bit j of qh (a little-endian uint32) is bit 4
// of weight j.
struct block_q5_0 {
  half d;        // scale
  uchar qh[4];   // 5th bits of weights 0..31
  uchar qs[16];  // weight j = ((qs[j] & 15) | bit j << 4) - 16, weight 16 + j from qs[j] >> 4; times d
};
struct block_q5_1 {
  half d;        // scale
  half m;        // minimum
  uchar qh[4];   // 5th bits of weights 0..31
  uchar qs[16];  // weight j = ((qs[j] & 15) | bit j << 4) * d + m, weight 16 + j from qs[j] >> 4
};

// ---- GGUF K-quant super-blocks of 256 weights (ggml's QK_K) -----------------
// Q4_K / Q5_K: 8 sub-blocks of 32, each with a 6-bit scale and a 6-bit min
// (packed in scales[12], see scale_min_k4): weight = d·sc[s]·q − dmin·m[s].
// qs[32g .. 32g + 32) holds sub-block 2g in its low and 2g + 1 in its high
// nibbles; Q5_K's bit 4 of weight l of sub-block s is bit s of qh[l].
struct block_q4_K {
  half d;           // super-block scale of the sub-block scales
  half dmin;        // super-block scale of the sub-block mins
  uchar scales[12]; // 8 x (6-bit scale, 6-bit min)
  uchar qs[128];    // 4-bit quants
};
struct block_q5_K {
  half d;
  half dmin;
  uchar scales[12];
  uchar qh[32];     // bit 4 of each quant
  uchar qs[128];    // low 4 bits, as in Q4_K
};
// Q6_K: 16 sub-blocks of 16 with int8 scales: weight = d·scales[k]·(q − 32),
// q 6 bits. Two halves of 128 weights; in half h, group t (0..3) of 32 weights
// takes its low 4 bits from ql[64h + 32(t % 2) + l] (low nibble for t < 2,
// high for t >= 2) and its top 2 bits from qh[32h + l] >> 2t.
struct block_q6_K {
  uchar ql[128];    // low 4 bits
  uchar qh[64];     // high 2 bits
  char scales[16];  // sub-block scales
  half d;           // super-block scale (last: the block is only 2-byte aligned)
};
static_assert(sizeof(block_q8_0) == mkv_params::kQ8_0BlockBytes, "ggml block_q8_0 is 34 bytes");
static_assert(sizeof(block_q4_0) == mkv_params::kQ4_0BlockBytes, "ggml block_q4_0 is 18 bytes");
static_assert(sizeof(block_q4_1) == mkv_params::kQ4_1BlockBytes, "ggml block_q4_1 is 20 bytes");
static_assert(sizeof(block_q5_0) == mkv_params::kQ5_0BlockBytes, "ggml block_q5_0 is 22 bytes");
static_assert(sizeof(block_q5_1) == mkv_params::kQ5_1BlockBytes, "ggml block_q5_1 is 24 bytes");
static_assert(sizeof(block_q4_K) == mkv_params::kQ4_KBlockBytes, "ggml block_q4_K is 144 bytes");
static_assert(sizeof(block_q5_K) == mkv_params::kQ5_KBlockBytes, "ggml block_q5_K is 176 bytes");
static_assert(sizeof(block_q6_K) == mkv_params::kQ6_KBlockBytes, "ggml block_q6_K is 210 bytes");

// ---- f32 / f16 / bf16: chunks of 4, read as one 4-vector ----------------------
// Rows must start 16- (f32) or 8-byte (f16, bf16) aligned: n % 4 == 0 and an
// aligned buffer offset (the ops check both).
struct FmtF32 {
  enum { kChunk = 4, kBlock = 1 };
  struct Raw { float4 w; };
  static ulong row_bytes(uint n) { return ulong(n) * 4; }
  static Raw fetch(const device uchar* row, uint, uint c) { return Raw{((const device float4*)row)[c]}; }
  static void load(const device uchar* row, uint n, uint c, thread float4* w) { w[0] = fetch(row, n, c).w; }
  static float dot(thread const Raw& r, thread const float4* x, float) { return metal::dot(r.w, x[0]); }
};

struct FmtF16 {
  enum { kChunk = 4, kBlock = 1 };
  struct Raw { half4 w; };
  static ulong row_bytes(uint n) { return ulong(n) * 2; }
  static Raw fetch(const device uchar* row, uint, uint c) { return Raw{((const device half4*)row)[c]}; }
  static void load(const device uchar* row, uint n, uint c, thread float4* w) { w[0] = float4(fetch(row, n, c).w); }
  static float dot(thread const Raw& r, thread const float4* x, float) { return metal::dot(float4(r.w), x[0]); }
};

// bf16 is the top half of a float32: widening is a 16-bit shift, exact.
struct FmtBF16 {
  enum { kChunk = 4, kBlock = 1 };
  struct Raw { ushort4 w; };
  static ulong row_bytes(uint n) { return ulong(n) * 2; }
  static Raw fetch(const device uchar* row, uint, uint c) { return Raw{((const device ushort4*)row)[c]}; }
  static float4 weights(thread const Raw& r) { return as_type<float4>(uint4(r.w) << 16); }
  static void load(const device uchar* row, uint n, uint c, thread float4* w) {
    const Raw r = fetch(row, n, c);
    w[0] = weights(r);
  }
  static float dot(thread const Raw& r, thread const float4* x, float) { return metal::dot(weights(r), x[0]); }
};

// gemv's f16 / bf16 rows when they are 16-byte aligned (n % 8 == 0 and a
// 16-byte aligned offset; the op picks these then): 8 weights per chunk, one
// 16-byte load (LDG.E.128 on CUDA) instead of two 8-byte ones. gemm and the
// embedding keep the 4-weight chunks above.
struct FmtF16x8 {
  enum { kChunk = 8, kBlock = 1 };
  struct Raw { uint4 q; };
  static ulong row_bytes(uint n) { return ulong(n) * 2; }
  static Raw fetch(const device uchar* row, uint, uint c) { return Raw{((const device uint4*)row)[c]}; }
  static float dot(thread const Raw& r, thread const float4* x, float) {
    const float4 a = float4(float2(as_type<half2>(r.q.x)), float2(as_type<half2>(r.q.y)));
    const float4 b = float4(float2(as_type<half2>(r.q.z)), float2(as_type<half2>(r.q.w)));
    return metal::dot(a, x[0]) + metal::dot(b, x[1]);
  }
};
struct FmtBF16x8 {
  enum { kChunk = 8, kBlock = 1 };
  struct Raw { uint4 q; };
  static ulong row_bytes(uint n) { return ulong(n) * 2; }
  static Raw fetch(const device uchar* row, uint, uint c) { return Raw{((const device uint4*)row)[c]}; }
  // Element 2i is the low half of word i: shift it up; 2i + 1 is the high half: mask.
  static float4 pair_floats(uint a, uint b) {
    return as_type<float4>(uint4(a << 16, a & 0xFFFF0000u, b << 16, b & 0xFFFF0000u));
  }
  static float dot(thread const Raw& r, thread const float4* x, float) {
    return metal::dot(pair_floats(r.q.x, r.q.y), x[0]) + metal::dot(pair_floats(r.q.z, r.q.w), x[1]);
  }
};

// Quantized chunks are 16 weights, handled as four float4 (independent
// multiply-adds, summed at the end). A format's Raw is what a chunk loads
// from memory (quant words, scale, min) plus where in them the chunk sits;
// fetch only loads, so gemv can issue every load of a step before the first
// multiply (metal/matmul.metal).

// A packed row's planes (metal/linear_params.h): the 16 quant bytes at p
// (16-byte aligned), and element i of the plane at nb·plane of a row of nb blocks.
inline uint4 load16(const device uchar* p) { return *(const device uint4*)p; }
template <typename T> inline T plane_at(const device uchar* row, uint nb, uint plane, uint i) {
  return ((const device T*)(row + ulong(nb) * plane))[i];
}
// Bytes of a packed row of nb blocks of block_bytes each: padded to kPackedRowAlign.
inline ulong packed_row_bytes(uint nb, uint block_bytes) {
  constexpr ulong a = mkv_params::kPackedRowAlign;
  return (ulong(nb) * block_bytes + a - 1) / a * a;
}
// The bits 0x4B000000 | byte e of a word, for e = 0..3: the floats 2^23 + byte.
// nvcc turns the portable form into a shift and two logic operations a byte
// (it has no two-constant LOP3 and does not find the byte permute); CUDA's
// __byte_perm does it in one PRMT (docs/KERNELS.md "Instructions per weight").
inline uint4 byte_bits(uint word) {
#if defined(__METALKV_CUDA__)
  return uint4(__byte_perm(word, 0x4B000000u, 0x7650u), __byte_perm(word, 0x4B000000u, 0x7651u),
               __byte_perm(word, 0x4B000000u, 0x7652u), __byte_perm(word, 0x4B000000u, 0x7653u));
#else
  return ((uint4(word) >> uint4(0, 8, 16, 24)) & 0xFFu) | 0x4B000000u;  // SIMD shifts on a CPU
#endif
}
// Bytes of a word as floats minus `minus` (an integer below 2^23): byte e is
// element e. Exact, and without an int-to-float conversion (a quarter- or
// eighth-rate instruction on GPUs): 0x4B000000 | b is the float 2^23 + b, and
// (2^23 + b) - (2^23 + minus) is b - minus exactly, one subtraction for both.
inline float4 byte_floats(uint word, float minus = 0.0f) {
  return as_type<float4>(byte_bits(word)) - (8388608.0f + minus);
}
// Σ_e byte e of q[i] · x[i][e] over a chunk's four words.
inline float dot_bytes(uint4 q, thread const float4* x) {
  float4 s = byte_floats(q.x) * x[0];
  s += byte_floats(q.y) * x[1];
  s += byte_floats(q.z) * x[2];
  s += byte_floats(q.w) * x[3];
  return s.x + s.y + s.z + s.w;
}
// The 4-bit fields at bit `shift` of every byte (0: low nibbles, 4: high).
inline uint4 nibbles(uint4 w, uint shift) { return (w >> shift) & 0x0F0F0F0Fu; }
// Q5: bits 16h + 4i .. + 4 of qh as bit 4 of the four bytes of word i: spread
// to bit 0 of four bytes by one multiply (b·0x204081 = b | b << 7 | b << 14 |
// b << 21, no carries for b < 16), then moved to bit 4.
inline uint4 fifth_bits(uint qh, uint h) {
  const uint high = qh >> (16 * h);
  uint4 bits;
  for (uint i = 0; i < 4; ++i) bits[i] = (((high >> (4 * i)) & 0xFu) * 0x00204081u) & 0x01010101u;
  return bits << 4;
}

// ---- Q8_0: chunk c is half h = c % 2 of block c / 2: qs[16h .. 16h + 16) ------
// Packed: the qs of the row's blocks back to back (chunk c at 16c), then the d's.
struct FmtQ8_0 {
  enum { kChunk = 16, kBlock = 32 };
  struct Raw { uint4 q; half d; };
  static ulong row_bytes(uint n) { return packed_row_bytes(n / kBlock, sizeof(block_q8_0)); }
  static Raw fetch(const device uchar* row, uint n, uint c) {
    return Raw{load16(row + 16 * c), plane_at<half>(row, n / kBlock, mkv_params::kQ8_0PlaneD, c / 2)};
  }
  // Weights 4i .. 4i + 4 of the chunk, / d: int8 q as (q ^ 0x80) - 128 = (q + 128) - 128, exact.
  static float4 quants(uint word) { return byte_floats(word ^ 0x80808080u, 128.0f); }
  static void load(const device uchar* row, uint n, uint c, thread float4* w) {
    const Raw r = fetch(row, n, c);
    const float d = float(r.d);
    for (uint i = 0; i < 4; ++i) w[i] = quants(r.q[i]) * d;
  }
  static float dot(thread const Raw& r, thread const float4* x, float) {
    float4 s = quants(r.q.x) * x[0];
    s += quants(r.q.y) * x[1];
    s += quants(r.q.z) * x[2];
    s += quants(r.q.w) * x[3];
    return (s.x + s.y + s.z + s.w) * float(r.d);
  }
};

// ---- Q4_0 / Q4_1 / Q5_0 / Q5_1: chunk c = half h of block c / 2 is the low
// (h = 0) or high (h = 1) nibbles of all 16 qs bytes, i.e. weights 16h .. 16h + 16
// (Q5: plus bits 16h .. 16h + 16 of qh). The two lanes of a block read the same
// 16 bytes (one cache line; DRAM reads once). Packed: the row's qs planes (block
// b at 16b), then qh (Q5: one word a block), then d (or the (d, m) pairs).
struct FmtQ4_0 {
  enum { kChunk = 16, kBlock = 32 };
  struct Raw { uint4 q; half d; uint h; };
  static ulong row_bytes(uint n) { return packed_row_bytes(n / kBlock, sizeof(block_q4_0)); }
  static Raw fetch(const device uchar* row, uint n, uint c) {
    return Raw{load16(row + 16 * (c / 2)), plane_at<half>(row, n / kBlock, mkv_params::kQ4_0PlaneD, c / 2), c % 2};
  }
  static void load(const device uchar* row, uint n, uint c, thread float4* w) {
    const Raw r = fetch(row, n, c);
    const float d = float(r.d);
    const uint4 q = nibbles(r.q, 4 * r.h);
    for (uint i = 0; i < 4; ++i) w[i] = byte_floats(q[i], 8.0f) * d;
  }
  // Σ (q - 8)·d·x = d·(Σ q·x - 8·Σ x): xsum is shared by every row of a lane.
  static float dot(thread const Raw& r, thread const float4* x, float xsum) {
    return (dot_bytes(nibbles(r.q, 4 * r.h), x) - 8.0f * xsum) * float(r.d);
  }
};

struct FmtQ4_1 {
  enum { kChunk = 16, kBlock = 32 };
  struct Raw { uint4 q; half d, m; uint h; };
  static ulong row_bytes(uint n) { return packed_row_bytes(n / kBlock, sizeof(block_q4_1)); }
  static Raw fetch(const device uchar* row, uint n, uint c) {
    const half2 dm = plane_at<half2>(row, n / kBlock, mkv_params::kQ4_1PlaneDm, c / 2);
    return Raw{load16(row + 16 * (c / 2)), dm.x, dm.y, c % 2};
  }
  static void load(const device uchar* row, uint n, uint c, thread float4* w) {
    const Raw r = fetch(row, n, c);
    const float d = float(r.d), m = float(r.m);
    const uint4 q = nibbles(r.q, 4 * r.h);
    for (uint i = 0; i < 4; ++i) w[i] = byte_floats(q[i]) * d + m;
  }
  // Σ (q·d + m)·x = d·Σ q·x + m·Σ x.
  static float dot(thread const Raw& r, thread const float4* x, float xsum) {
    return dot_bytes(nibbles(r.q, 4 * r.h), x) * float(r.d) + xsum * float(r.m);
  }
};

struct FmtQ5_0 {
  enum { kChunk = 16, kBlock = 32 };
  struct Raw { uint4 q; uint qh; half d; uint h; };
  static ulong row_bytes(uint n) { return packed_row_bytes(n / kBlock, sizeof(block_q5_0)); }
  static Raw fetch(const device uchar* row, uint n, uint c) {
    const uint nb = n / kBlock, b = c / 2;
    return Raw{load16(row + 16 * b), plane_at<uint>(row, nb, mkv_params::kQ5_0PlaneQh, b),
               plane_at<half>(row, nb, mkv_params::kQ5_0PlaneD, b), c % 2};
  }
  static uint4 quants(thread const Raw& r) { return nibbles(r.q, 4 * r.h) | fifth_bits(r.qh, r.h); }
  static void load(const device uchar* row, uint n, uint c, thread float4* w) {
    const Raw r = fetch(row, n, c);
    const float d = float(r.d);
    const uint4 q = quants(r);
    for (uint i = 0; i < 4; ++i) w[i] = byte_floats(q[i], 16.0f) * d;
  }
  // d·(Σ q·x − 16·Σ x).
  static float dot(thread const Raw& r, thread const float4* x, float xsum) {
    return (dot_bytes(quants(r), x) - 16.0f * xsum) * float(r.d);
  }
};

struct FmtQ5_1 {
  enum { kChunk = 16, kBlock = 32 };
  struct Raw { uint4 q; uint qh; half d, m; uint h; };
  static ulong row_bytes(uint n) { return packed_row_bytes(n / kBlock, sizeof(block_q5_1)); }
  static Raw fetch(const device uchar* row, uint n, uint c) {
    const uint nb = n / kBlock, b = c / 2;
    const half2 dm = plane_at<half2>(row, nb, mkv_params::kQ5_1PlaneDm, b);
    return Raw{load16(row + 16 * b), plane_at<uint>(row, nb, mkv_params::kQ5_1PlaneQh, b), dm.x, dm.y, c % 2};
  }
  static uint4 quants(thread const Raw& r) { return nibbles(r.q, 4 * r.h) | fifth_bits(r.qh, r.h); }
  static void load(const device uchar* row, uint n, uint c, thread float4* w) {
    const Raw r = fetch(row, n, c);
    const float d = float(r.d), m = float(r.m);
    const uint4 q = quants(r);
    for (uint i = 0; i < 4; ++i) w[i] = byte_floats(q[i]) * d + m;
  }
  // d·Σ q·x + m·Σ x.
  static float dot(thread const Raw& r, thread const float4* x, float xsum) {
    return dot_bytes(quants(r), x) * float(r.d) + xsum * float(r.m);
  }
};

// ---- K-quants: chunk c is sub-chunk k = c % 16 of super-block c / 16 ----------
// Q4_K / Q5_K: chunk k is half k % 2 of sub-block s = k / 2, whose quants are
// the low (s even) or high (s odd) nibbles of qs[32(s / 2) + 16(k % 2) ..][0..16).
// Their 144- and 176-byte blocks keep qs (and Q5_K's qh) 16-byte aligned and
// scales 4-byte aligned (weight_align): one 16-byte load per chunk.
// The scale and min of sub-block s (0..7) from the 12 packed bytes (ggml's
// get_scale_min_k4): s < 4: 6 low bits of scales[s] and scales[s + 4];
// s >= 4: 4 bits of scales[s + 4] (low: scale, high: min) below the top 2
// bits of scales[s - 4] (scale) and scales[s] (min). Read as three words:
// byte s % 4 of words 0, 1, 2 is scales[s % 4], [s % 4 + 4], [s % 4 + 8].
inline float2 scale_min_k4(uint3 w, uint s) {
  const uint shift = 8 * (s % 4);
  const uint b0 = (w.x >> shift) & 0xFFu, b1 = (w.y >> shift) & 0xFFu, b2 = (w.z >> shift) & 0xFFu;
  const uint sc = s < 4 ? b0 & 63u : (b2 & 0xFu) | ((b0 >> 6) << 4);
  const uint m = s < 4 ? b1 & 63u : (b2 >> 4) | ((b1 >> 6) << 4);
  return float2(float(sc), float(m));
}
inline uint3 scale_words(const device uchar* scales) {
  const device uint* w = (const device uint*)scales;
  return uint3(w[0], w[1], w[2]);
}
inline const device uchar* quants_k4_at(const device uchar* qs, uint k) { return qs + 32 * (k / 4) + 16 * (k % 2); }

// Q4_K and Q5_K share their 6-bit scale/min pairs and the weight w = d·sc·q − dmin·m
// (gguf's rounding order); they differ in how quants() builds the 16 bytes q.
template <typename F>
inline void kquant_sm_load(const device uchar* row, uint n, uint c, thread float4* w) {
  const typename F::Raw r = F::fetch(row, n, c);
  const float2 sm = scale_min_k4(r.scales, r.k / 2);
  const float dsc = float(r.d) * sm.x, dm = float(r.dmin) * sm.y;
  const uint4 q = F::quants(r);
  for (uint i = 0; i < 4; ++i) w[i] = byte_floats(q[i]) * dsc - dm;
}
// d·sc·Σ q·x − dmin·m·Σ x.
template <typename Raw>
inline float kquant_sm_dot(thread const Raw& r, uint4 q, thread const float4* x, float xsum) {
  const float2 sm = scale_min_k4(r.scales, r.k / 2);
  return dot_bytes(q, x) * (float(r.d) * sm.x) - xsum * (float(r.dmin) * sm.y);
}

struct FmtQ4_K {
  enum { kChunk = 16, kBlock = 256 };
  struct Raw { uint4 q; uint3 scales; half d, dmin; uint k; };
  static ulong row_bytes(uint n) { return ulong(n / kBlock) * sizeof(block_q4_K); }
  static Raw fetch(const device uchar* row, uint, uint c) {
    const device block_q4_K& b = ((const device block_q4_K*)row)[c / 16];
    const uint k = c % 16;
    return Raw{load16(quants_k4_at(b.qs, k)), scale_words(b.scales), b.d, b.dmin, k};
  }
  static uint4 quants(thread const Raw& r) { return nibbles(r.q, 4 * ((r.k / 2) % 2)); }
  static void load(const device uchar* row, uint n, uint c, thread float4* w) { kquant_sm_load<FmtQ4_K>(row, n, c, w); }
  static float dot(thread const Raw& r, thread const float4* x, float xsum) { return kquant_sm_dot(r, quants(r), x, xsum); }
};

struct FmtQ5_K {
  enum { kChunk = 16, kBlock = 256 };
  struct Raw { uint4 q; uint4 qh; uint3 scales; half d, dmin; uint k; };
  static ulong row_bytes(uint n) { return ulong(n / kBlock) * sizeof(block_q5_K); }
  static Raw fetch(const device uchar* row, uint, uint c) {
    const device block_q5_K& b = ((const device block_q5_K*)row)[c / 16];
    const uint k = c % 16;
    return Raw{load16(quants_k4_at(b.qs, k)), load16(b.qh + 16 * (k % 2)), scale_words(b.scales), b.d, b.dmin, k};
  }
  // Q4_K's nibbles, plus bit s of qh[16(k % 2) + j] as bit 4 of weight j.
  static uint4 quants(thread const Raw& r) {
    return nibbles(r.q, 4 * ((r.k / 2) % 2)) | (((r.qh >> (r.k / 2)) & 0x01010101u) << 4);
  }
  static void load(const device uchar* row, uint n, uint c, thread float4* w) { kquant_sm_load<FmtQ5_K>(row, n, c, w); }
  static float dot(thread const Raw& r, thread const float4* x, float xsum) { return kquant_sm_dot(r, quants(r), x, xsum); }
};

// Q6_K: chunk k (one sub-block, scale scales[k]) is weights 16(k % 2) .. + 16 of
// group t = (k % 8) / 2 of half h = k / 8 (see block_q6_K). Packed: the row's
// ql planes (block b at 128b), then qh (64b), scales (16b) and d, so ql and qh
// load 16 bytes at a time (in the file's 210-byte blocks they are 2-byte aligned).
struct FmtQ6_K {
  enum { kChunk = 16, kBlock = 256 };
  struct Raw { uint4 lo; uint4 hi; half d; char scale; uint k; };
  static ulong row_bytes(uint n) { return packed_row_bytes(n / kBlock, sizeof(block_q6_K)); }
  static Raw fetch(const device uchar* row, uint n, uint c) {
    const uint nb = n / kBlock, b = c / 16, k = c % 16;
    const uint h = k / 8, t = (k % 8) / 2, l0 = 16 * (k % 2);
    const device uchar* ql = row + 128 * b;
    const device uchar* qh = row + ulong(nb) * mkv_params::kQ6_KPlaneQh + 64 * b;
    return Raw{load16(ql + 64 * h + 32 * (t % 2) + l0), load16(qh + 32 * h + l0),
               plane_at<half>(row, nb, mkv_params::kQ6_KPlaneD, b),
               plane_at<char>(row, nb, mkv_params::kQ6_KPlaneScales, 16 * b + k), k};
  }
  // 6-bit quants 0..63 (q − 32 is the signed value).
  static uint4 quants(thread const Raw& r) {
    const uint t = (r.k % 8) / 2;
    return nibbles(r.lo, 4 * (t / 2)) | (((r.hi >> (2 * t)) & 0x03030303u) << 4);
  }
  static void load(const device uchar* row, uint n, uint c, thread float4* w) {
    const Raw r = fetch(row, n, c);
    const float dsc = float(r.d) * float(r.scale);
    const uint4 q = quants(r);
    for (uint i = 0; i < 4; ++i) w[i] = byte_floats(q[i], 32.0f) * dsc;
  }
  // d·sc·(Σ q·x − 32·Σ x).
  static float dot(thread const Raw& r, thread const float4* x, float xsum) {
    return (dot_bytes(quants(r), x) - 32.0f * xsum) * (float(r.d) * float(r.scale));
  }
};

// Every format above with its kernel-name suffix (weight_type_name in
// cpp/ops/linear.cpp): the kernel files instantiate through this list.
#define MKV_FOR_EACH_FORMAT(X) \
  X(f32, FmtF32)               \
  X(f16, FmtF16)               \
  X(bf16, FmtBF16)             \
  X(q8_0, FmtQ8_0)             \
  X(q4_0, FmtQ4_0)             \
  X(q4_1, FmtQ4_1)             \
  X(q5_0, FmtQ5_0)             \
  X(q5_1, FmtQ5_1)             \
  X(q4_k, FmtQ4_K)             \
  X(q5_k, FmtQ5_K)             \
  X(q6_k, FmtQ6_K)
