// Argument structs and geometry constants of the attention kernels, shared by
// metal/attention_*.metal and cpp/ops/attention.cpp. Sizes are static_asserted
// on the C++ side.
//
// KV cache of one layer: half (2, slots, n_kv_heads, head_dim), K block then V
// block. Position p lives in slot p % slots while it is among the last `slots`
// positions; the kernels only ever visit positions that are (ops validate it).
#pragma once

#include "shared_params.h"

namespace mkv_params {

// SIMD-groups per threadgroup of the decode and prefill kernels (256 threads).
MKV_CONSTANT uint32_t kAttnSimdgroups = 8;

// Lane layout of head_dim D inside a SIMD-group (metal/attention.h): lane l
// owns the E = attn_lane_elems(D) contiguous elements [l*E, l*E + E) of every
// q, K, V and output row while l < attn_lanes(D) = D / E; the other lanes hold
// zeros. E is the smallest count >= D / 32 that divides D, so a multiple of 32
// keeps all 32 lanes (E = D / 32) and D = 80, 112 use 20, 28 lanes of E = 4.
constexpr uint32_t attn_lane_elems(uint32_t head_dim) {
  uint32_t e = head_dim > 32 ? (head_dim + 31) / 32 : 1;
  while (head_dim % e != 0) ++e;  // ends at e = head_dim at the latest
  return e;
}
constexpr uint32_t attn_lanes(uint32_t head_dim) { return head_dim / attn_lane_elems(head_dim); }

// Query rows one SIMD-group keeps in registers: q and the output accumulator
// take 2 * E floats per lane and row, so R * E <= 32 (8 rows up to E = 4,
// i.e. D <= 128; 4 rows for E = 5, 6, 8, i.e. D = 160, 192, 256).
// Decode: the query heads of one KV head served by a threadgroup;
// prefill: (query position, head) pairs per SIMD-group.
constexpr uint32_t attn_rows_per_simdgroup(uint32_t head_dim) {
  return attn_lane_elems(head_dim) <= 4 ? 8 : 4;
}

// Keys per K/V tile that prefill stages in threadgroup memory. K + V tile:
// 2 * tile * head_dim halfs = 4 * tile * head_dim bytes, at most 16 KiB (half
// of the 32 KiB limit, so two threadgroups fit a core): 4, 8, 10, 12, 14, 16
// KiB at D = 32 .. 128 (32 keys), 10, 12, 16 KiB at D = 160, 192, 256 (16).
constexpr uint32_t attn_prefill_key_tile(uint32_t head_dim) { return head_dim <= 128 ? 32 : 16; }

// attn_decode_* and attn_decode_split_*: one query per query head at position
// n_tokens - 1. Grid: (n_kv_heads * head_blocks, n_chunks); a threadgroup
// serves query heads [block * heads_per_block, ...) of one KV head over key
// chunk y.
struct AttnDecode {
  uint32_t n_q_heads;
  uint32_t n_kv_heads;
  uint32_t group_size;       // n_q_heads / n_kv_heads: query heads per KV head
  uint32_t heads_per_block;  // <= attn_rows_per_simdgroup(head_dim)
  uint32_t head_blocks;      // ceil(group_size / heads_per_block)
  uint32_t n_tokens;         // tokens stored; the query is at position n_tokens - 1
  uint32_t slots;            // ring capacity R
  uint32_t window;           // sliding window W; 0 = full attention
  uint32_t chunk_keys;       // keys per chunk (split-K); >= all keys when not split
  uint32_t n_chunks;         // 1 when not split
  float scale;               // applied to q.k
  float softcap;             // s = softcap * tanh(s / softcap); 0 = off
  uint32_t has_sinks;        // sinks[n_q_heads] bound and used
};

// attn_decode_reduce_*: merges the n_chunks partials of each query head.
// Grid: (n_q_heads); threads: head_dim.
struct AttnDecodeReduce {
  uint32_t n_q_heads;
  uint32_t n_chunks;
  uint32_t has_sinks;
};

// attn_prefill_*: n_queries queries at positions q_pos0 .. q_pos0 + n_queries - 1,
// the cache holding n_tokens = q_pos0 + n_queries tokens. Grid:
// (ceil(n_queries / queries_per_tile), n_kv_heads * head_blocks).
struct AttnPrefill {
  uint32_t n_q_heads;
  uint32_t n_kv_heads;
  uint32_t group_size;
  uint32_t heads_per_block;
  uint32_t head_blocks;
  uint32_t n_queries;
  uint32_t q_pos0;
  uint32_t queries_per_tile;  // queries_per_tile * heads_per_block <= rows per threadgroup
  uint32_t slots;
  uint32_t window;
  float scale;
  float softcap;
  uint32_t has_sinks;
};

}  // namespace mkv_params

#ifndef __METAL_VERSION__
static_assert(sizeof(mkv_params::AttnDecode) == 52, "AttnDecode params layout");
static_assert(sizeof(mkv_params::AttnDecodeReduce) == 12, "AttnDecodeReduce params layout");
static_assert(sizeof(mkv_params::AttnPrefill) == 52, "AttnPrefill params layout");
#endif
