// Weight formats read inside the kernels: f32, f16 and the GGUF blocks Q8_0,
// Q4_0 and Q4_1 (layouts exactly as ggml's block_q8_0 / block_q4_0 /
// block_q4_1). Weights are dequantized in registers; nothing is inflated in
// device memory.
//
// A row of n weights is split into chunks of F::kChunk consecutive weights;
// a chunk is what one lane handles per step. Every format F provides:
//   F::kChunk                          weights per chunk
//   F::row_bytes(n)                    bytes of a row of n weights
//   F::load(row, c, w)                 w[0..kChunk/4) = weights of chunk c
//   F::dot(row, c, x, xsum)            Σ_j w[j]·x[j] over chunk c, where
//                                      x[0..kChunk/4) are the matching
//                                      activations and xsum = Σ_j x[j]
// (w and x are float4 arrays: chunk element j is w[j / 4][j % 4]).
// `row` points at the first byte of the row. Quantized chunks are half a
// block (16 weights), so two lanes share one block's scale.
#pragma once

#include "mkv_kernel.h"  // metal_stdlib, using namespace metal
#include "linear_params.h"

// ---- GGUF blocks: 32 weights each ------------------------------------------
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
static_assert(sizeof(block_q8_0) == mkv_params::kQ8_0BlockBytes, "ggml block_q8_0 is 34 bytes");
static_assert(sizeof(block_q4_0) == mkv_params::kQ4_0BlockBytes, "ggml block_q4_0 is 18 bytes");
static_assert(sizeof(block_q4_1) == mkv_params::kQ4_1BlockBytes, "ggml block_q4_1 is 20 bytes");

// ---- f32 / f16: chunks of 4, read as one float4 / half4 ----------------------
// Rows must start 16- (f32) or 8-byte (f16) aligned: n % 4 == 0 and an
// aligned buffer offset (the ops check both).
struct FmtF32 {
  enum { kChunk = 4 };
  static ulong row_bytes(uint n) { return ulong(n) * 4; }
  static void load(const device uchar* row, uint c, thread float4* w) {
    w[0] = ((const device float4*)row)[c];
  }
  static float dot(const device uchar* row, uint c, thread const float4* x, float) {
    return metal::dot(((const device float4*)row)[c], x[0]);
  }
};

struct FmtF16 {
  enum { kChunk = 4 };
  static ulong row_bytes(uint n) { return ulong(n) * 2; }
  static void load(const device uchar* row, uint c, thread float4* w) {
    w[0] = float4(((const device half4*)row)[c]);
  }
  static float dot(const device uchar* row, uint c, thread const float4* x, float) {
    return metal::dot(float4(((const device half4*)row)[c]), x[0]);
  }
};

// Quantized chunks are 16 weights, handled as four float4 (independent
// multiply-adds, summed at the end). Blocks are only 2-byte aligned, so the
// quants are read as packed (1-byte aligned) 4-vectors.

// ---- Q8_0: chunk c is half h = c % 2 of block c / 2: qs[16h .. 16h + 16) ------
struct FmtQ8_0 {
  enum { kChunk = 16 };
  static ulong row_bytes(uint n) { return ulong(n / 32) * sizeof(block_q8_0); }
  static float4 quants(const device block_q8_0& b, uint c, uint i) {  // weights 4i .. 4i + 4 of the chunk, / d
    const char4 q = ((const device packed_char4*)(b.qs + (c % 2) * 16))[i];
    return float4(q);
  }
  static void load(const device uchar* row, uint c, thread float4* w) {
    const device block_q8_0& b = ((const device block_q8_0*)row)[c / 2];
    const float d = float(b.d);
    for (uint i = 0; i < 4; ++i) w[i] = quants(b, c, i) * d;
  }
  static float dot(const device uchar* row, uint c, thread const float4* x, float) {
    const device block_q8_0& b = ((const device block_q8_0*)row)[c / 2];
    float4 s = quants(b, c, 0) * x[0];
    for (uint i = 1; i < 4; ++i) s += quants(b, c, i) * x[i];
    return (s.x + s.y + s.z + s.w) * float(b.d);
  }
};

// ---- Q4_0 / Q4_1: chunk c = half h of block c / 2 is the low (h = 0) or high
// (h = 1) nibbles of all 16 qs bytes, i.e. weights 16h .. 16h + 16. The two
// lanes of a block read the same 16 bytes (one cache line; DRAM reads once).
// Weights 4i .. 4i + 4 of chunk c, as floats 0..15: one 32-bit shift and mask
// for four nibbles (qs is 2-byte aligned, so it is read as two ushorts).
inline float4 nibbles(const device uchar* qs, uint c, uint i) {
  const uint word = as_type<uint>(ushort2(((const device packed_ushort2*)qs)[i]));
  return float4(as_type<uchar4>((word >> ((c % 2) * 4)) & 0x0F0F0F0Fu));
}

struct FmtQ4_0 {
  enum { kChunk = 16 };
  static ulong row_bytes(uint n) { return ulong(n / 32) * sizeof(block_q4_0); }
  static void load(const device uchar* row, uint c, thread float4* w) {
    const device block_q4_0& b = ((const device block_q4_0*)row)[c / 2];
    const float d = float(b.d);
    for (uint i = 0; i < 4; ++i) w[i] = (nibbles(b.qs, c, i) - 8.0f) * d;
  }
  // Σ (q - 8)·d·x = d·(Σ q·x - 8·Σ x): xsum is shared by every row of a lane.
  static float dot(const device uchar* row, uint c, thread const float4* x, float xsum) {
    const device block_q4_0& b = ((const device block_q4_0*)row)[c / 2];
    float4 s = nibbles(b.qs, c, 0) * x[0];
    for (uint i = 1; i < 4; ++i) s += nibbles(b.qs, c, i) * x[i];
    return ((s.x + s.y + s.z + s.w) - 8.0f * xsum) * float(b.d);
  }
};

struct FmtQ4_1 {
  enum { kChunk = 16 };
  static ulong row_bytes(uint n) { return ulong(n / 32) * sizeof(block_q4_1); }
  static void load(const device uchar* row, uint c, thread float4* w) {
    const device block_q4_1& b = ((const device block_q4_1*)row)[c / 2];
    const float d = float(b.d), m = float(b.m);
    for (uint i = 0; i < 4; ++i) w[i] = nibbles(b.qs, c, i) * d + m;
  }
  // Σ (q·d + m)·x = d·Σ q·x + m·Σ x.
  static float dot(const device uchar* row, uint c, thread const float4* x, float xsum) {
    const device block_q4_1& b = ((const device block_q4_1*)row)[c / 2];
    float4 s = nibbles(b.qs, c, 0) * x[0];
    for (uint i = 1; i < 4; ++i) s += nibbles(b.qs, c, i) * x[i];
    return (s.x + s.y + s.z + s.w) * float(b.d) + xsum * float(b.m);
  }
};
