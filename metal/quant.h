// Weight formats read inside the kernels: f32, f16 and the GGUF blocks Q8_0,
// Q4_0 and Q4_1 (layouts exactly as ggml's block_q8_0 / block_q4_0 /
// block_q4_1). Weights are dequantized in registers; nothing is inflated in
// device memory.
//
// A row of n weights is split into chunks of F::kChunk consecutive weights;
// a chunk is what one lane handles per step. Every format F provides:
//   F::kChunk                          weights per chunk
//   F::row_bytes(n)                    bytes of a row of n weights
//   F::load(row, c, w)                 w[0..kChunk) = weights of chunk c
//   F::dot(row, c, x, xsum)            Σ_j w[j]·x[j] over chunk c, where
//                                      x[0..kChunk) are the matching
//                                      activations and xsum = Σ_j x[j]
// `row` points at the first byte of the row. Quantized chunks are half a
// block (16 weights), so two lanes share one block's scale.
#pragma once

#include <metal_stdlib>
#include "linear_params.h"
using namespace metal;

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
  static void load(const device uchar* row, uint c, thread float* w) {
    const float4 v = ((const device float4*)row)[c];
    w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
  }
  static float dot(const device uchar* row, uint c, thread const float* x, float) {
    const float4 v = ((const device float4*)row)[c];
    return v.x * x[0] + v.y * x[1] + v.z * x[2] + v.w * x[3];
  }
};

struct FmtF16 {
  enum { kChunk = 4 };
  static ulong row_bytes(uint n) { return ulong(n) * 2; }
  static void load(const device uchar* row, uint c, thread float* w) {
    const float4 v = float4(((const device half4*)row)[c]);
    w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
  }
  static float dot(const device uchar* row, uint c, thread const float* x, float) {
    const float4 v = float4(((const device half4*)row)[c]);
    return v.x * x[0] + v.y * x[1] + v.z * x[2] + v.w * x[3];
  }
};

// ---- Q8_0: chunk c is half h = c % 2 of block c / 2: qs[16h .. 16h + 16) ------
struct FmtQ8_0 {
  enum { kChunk = 16 };
  static ulong row_bytes(uint n) { return ulong(n / 32) * sizeof(block_q8_0); }
  static void load(const device uchar* row, uint c, thread float* w) {
    const device block_q8_0& b = ((const device block_q8_0*)row)[c / 2];
    const device char* qs = b.qs + (c % 2) * 16;
    const float d = float(b.d);
    for (uint j = 0; j < 16; ++j) w[j] = float(qs[j]) * d;
  }
  static float dot(const device uchar* row, uint c, thread const float* x, float) {
    const device block_q8_0& b = ((const device block_q8_0*)row)[c / 2];
    const device char* qs = b.qs + (c % 2) * 16;
    float s = 0.0f;
    for (uint j = 0; j < 16; ++j) s += float(qs[j]) * x[j];
    return s * float(b.d);
  }
};

// ---- Q4_0 / Q4_1: chunk c = half h of block c / 2 is the low (h = 0) or high
// (h = 1) nibbles of all 16 qs bytes, i.e. weights 16h .. 16h + 16. The two
// lanes of a block read the same 16 bytes (one cache line; DRAM reads once).
struct FmtQ4_0 {
  enum { kChunk = 16 };
  static ulong row_bytes(uint n) { return ulong(n / 32) * sizeof(block_q4_0); }
  static void load(const device uchar* row, uint c, thread float* w) {
    const device block_q4_0& b = ((const device block_q4_0*)row)[c / 2];
    const uint shift = (c % 2) * 4;
    const float d = float(b.d);
    for (uint j = 0; j < 16; ++j) w[j] = (float((b.qs[j] >> shift) & 15) - 8.0f) * d;
  }
  // Σ (q - 8)·d·x = d·(Σ q·x - 8·Σ x): xsum is shared by every row of a lane.
  static float dot(const device uchar* row, uint c, thread const float* x, float xsum) {
    const device block_q4_0& b = ((const device block_q4_0*)row)[c / 2];
    const uint shift = (c % 2) * 4;
    float s = 0.0f;
    for (uint j = 0; j < 16; ++j) s += float((b.qs[j] >> shift) & 15) * x[j];
    return (s - 8.0f * xsum) * float(b.d);
  }
};

struct FmtQ4_1 {
  enum { kChunk = 16 };
  static ulong row_bytes(uint n) { return ulong(n / 32) * sizeof(block_q4_1); }
  static void load(const device uchar* row, uint c, thread float* w) {
    const device block_q4_1& b = ((const device block_q4_1*)row)[c / 2];
    const uint shift = (c % 2) * 4;
    const float d = float(b.d), m = float(b.m);
    for (uint j = 0; j < 16; ++j) w[j] = float((b.qs[j] >> shift) & 15) * d + m;
  }
  // Σ (q·d + m)·x = d·Σ q·x + m·Σ x.
  static float dot(const device uchar* row, uint c, thread const float* x, float xsum) {
    const device block_q4_1& b = ((const device block_q4_1*)row)[c / 2];
    const uint shift = (c % 2) * 4;
    float s = 0.0f;
    for (uint j = 0; j < 16; ++j) s += float((b.qs[j] >> shift) & 15) * x[j];
    return s * float(b.d) + xsum * float(b.m);
  }
};
