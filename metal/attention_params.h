// Argument structs and geometry constants of the attention kernels, shared by
// metal/attention_*.metal and cpp/ops/attention.cpp. Sizes are static_asserted
// on the C++ side.
//
// KV cache of one layer: a pool of `slots` slots, its K section then its V
// section (f16, or quantized: kv_format.h), cut into blocks of kKvBlockTokens slots; a sequence's block
// table (buffer 5 of every attention kernel) names the block holding each
// kKvBlockTokens positions (metal/kv_table.h). The kernels only read the
// entries of positions their queries see.
#pragma once

#include "shared_params.h"
#include "kv_params.h"

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

// Prefill on matrix units (attention_prefill_mma.h): 4 SIMD-groups, each with
// up to attn_prefill_mma_blocks(D) blocks of 8 rows (8 query positions of one
// head), whose Q and output fragments it holds in registers (2 x head_dim / 8
// 8x8 matrices a block, plus the tile's scores and probabilities): 2 blocks up
// to D = 64, 1 past it (2 blocks at D = 80 take 255 registers and spill on the
// CUDA device; 1 takes about 160: tools/sass_count.py). The half-operand kernels
// (_half: Q and P in half, half the registers) hold 2 blocks up to D = 128, which
// lets a device run the two blocks' products as one (simdgroup_tile.h). A tile
// has queries_per_tile (a multiple of 8) positions x heads_per_block heads, at
// most 4 x blocks blocks.
MKV_CONSTANT uint32_t kAttnMmaSimdgroups = 4;
constexpr uint32_t attn_prefill_mma_blocks(uint32_t head_dim, bool half_operands = false) {
  return head_dim <= (half_operands ? 128u : 64u) ? 2 : 1;
}

// Decode lane layout (metal/attention_decode.h). A K/V row of D halfs is read
// as pieces of attn_decode_lane_elems(D) halfs (E = 4 up to D = 64: 8-byte
// pieces; else E = 8: 16-byte pieces); attn_decode_key_lanes(D) lanes (the
// next power of two >= D / E) share one key, lane j of such a group owning
// piece j while j < D / E (the others idle), so one load instruction of a
// SIMD-group reads 32 / key_lanes whole rows. q and acc take 2 * E floats per
// lane and query row, so a SIMD-group holds attn_decode_rows(D) = 32 / E rows
// (8 up to D = 64, else 4) and a threadgroup serves that many query heads.
//   D          32 64 80 96 112 128 160 192 256
//   E           4  4  8  8   8   8   8   8   8
//   key lanes   8 16 16 16  16  16  32  32  32
//   idle lanes  0  0  6  4   2   0  12   8   0   (of each key's group)
//   keys/load   4  2  2  2   2   2   1   1   1
//   rows        8  8  4  4   4   4   4   4   4
constexpr uint32_t attn_decode_lane_elems(uint32_t head_dim) { return head_dim <= 64 ? 4 : 8; }
// Lanes sharing one key when each lane holds lane_elems elements of a row.
constexpr uint32_t attn_decode_key_lanes_for(uint32_t head_dim, uint32_t lane_elems) {
  uint32_t lanes = 1;
  while (lanes * lane_elems < head_dim) lanes *= 2;
  return lanes;
}
constexpr uint32_t attn_decode_key_lanes(uint32_t head_dim) {
  return attn_decode_key_lanes_for(head_dim, attn_decode_lane_elems(head_dim));
}
constexpr uint32_t attn_decode_rows(uint32_t head_dim) { return 32 / attn_decode_lane_elems(head_dim); }

// The host executor's decode shape (the _h kernels, built for it only): every
// shuffle is a rendezvous of 32 fibers there and registers are free, so a lane
// holds several pieces, attn_decode_host_lane_elems(D) = D / 4 elements of each
// row (16 at D = 80 and 112, where D / 4 is no whole number of 8-element pieces),
// and a threadgroup is one SIMD-group (no merge of idle groups). A key's scores
// then take log2(4) = 2 shuffle steps a row per block of 32 keys, where the GPU
// shape takes 3-5 per block of 4-16 keys.
//   D          32 64 80 96 112 128 160 192 256
//   elements    8 16 16 24  16  32  40  48  64
//   key lanes   4  4  8  4   8   4   4   4   4
// Rows and head blocks are the GPU shape's (attn_decode_rows).
MKV_CONSTANT uint32_t kAttnDecodeHostSimdgroups = 1;
constexpr uint32_t attn_decode_host_lane_elems(uint32_t head_dim) {
  return (head_dim / 4) % attn_decode_lane_elems(head_dim) == 0 ? head_dim / 4 : 16;
}

// The host's collective-free decode (metal/attention_decode_rows.h, the
// _rows_h kernels): a thread takes up to attn_decode_rows_heads(D) query heads
// of one KV head, so each K/V row is converted once for all of them; the
// heads' G = 32 / key lanes online softmax states of D floats each (a thread
// holds G / kAttnDecodeRowsParts of them) stay under 16 KiB of the fiber's
// 64 KiB stack: 4 heads up to D = 128, 2 at 160 .. 256.
constexpr uint32_t attn_decode_rows_heads(uint32_t head_dim) {
  return (32 / attn_decode_key_lanes_for(head_dim, attn_decode_host_lane_elems(head_dim))) * head_dim * 4 * 4 <= 16384
             ? 4 : 2;
}
// Its lane groups are split over this many threadgroups (parts of G / parts
// groups, which the merge tree's first levels join inside a part): 3 KV heads
// made 3 threadgroups over 2 executor threads, one idle half the time; a
// second small kernel (attn_decode_rows_merge) joins the parts and finishes.
MKV_CONSTANT uint32_t kAttnDecodeRowsParts = 2;

// SIMD-groups per threadgroup of the split-K first pass (128 threads): at
// the ~130-190 registers the decode kernels take, a 128-thread threadgroup
// fits 3-4 times in a 64K-register SM where a 256-thread one fits once or
// twice, and finer threadgroups cut the wave into more, shorter chunks.
MKV_CONSTANT uint32_t kAttnDecodeSplitSimdgroups = 4;

// Keys each lane group takes per block (their scores travel as one float4).
MKV_CONSTANT uint32_t kAttnDecodeBlockKeys = 4;

// Split-K: the most chunks one call may use (the reduce keeps one weight per
// chunk in threadgroup memory), and the reduce's threadgroup (256 threads:
// chunk groups x float4 quads of head_dim) and threadgroup memory in floats:
// weights, per-SIMD-group partial sums, (chunk groups, D) partial outputs.
MKV_CONSTANT uint32_t kAttnDecodeMaxChunks = 512;
MKV_CONSTANT uint32_t kAttnReduceThreads = 256;
MKV_CONSTANT uint32_t kAttnReduceOutFloats = 4 * kAttnReduceThreads;  // (256 / (D/4)) * D <= 1024
MKV_CONSTANT uint32_t kAttnReduceTgFloats = kAttnDecodeMaxChunks + 2 * (kAttnReduceThreads / 32) + kAttnReduceOutFloats;

// attn_decode_* and attn_decode_split_*: one query per query head at position
// n_tokens - 1. Grid: (n_kv_heads * head_blocks, n_chunks); a threadgroup
// serves query heads [block * heads_per_block, ...) of one KV head over key
// chunk y.
struct AttnDecode {
  uint32_t n_q_heads;
  uint32_t n_kv_heads;
  uint32_t group_size;       // n_q_heads / n_kv_heads: query heads per KV head
  uint32_t heads_per_block;  // <= attn_decode_rows(head_dim)
  uint32_t head_blocks;      // ceil(group_size / heads_per_block)
  uint32_t n_tokens;         // tokens stored; the query is at position n_tokens - 1
  uint32_t slots;            // rows of the pool (K section, then V section)
  uint32_t window;           // sliding window W; 0 = full attention
  uint32_t chunk_keys;       // keys per chunk (split-K); >= all keys when not split
  uint32_t n_chunks;         // 1 when not split
  float scale;               // applied to q.k
  float softcap;             // s = softcap * tanh(s / softcap); 0 = off
  uint32_t has_sinks;        // sinks[n_q_heads] bound and used
  uint32_t k_format;         // kv_format.h: kKvF16, kKvQ8, kKvQ4, kKvQ2K/V (read by the _kvq kernels)
  uint32_t v_format;
  // The residual window (the _res kernels; KVCacheSpec::residual): a query at
  // position p reads the keys before S(p) = max(ring_lo, floor((p + 1 -
  // residual) / B) * B) from the pool and the rest as f16 rows of the ring
  // (buffer 6: K (ring_slots, n_kv_heads, head_dim) half, then V), position
  // at slot position % ring_slots. residual 0: no window.
  uint32_t residual;
  uint32_t ring_slots;
  uint32_t ring_lo;          // the ring holds no row below it
  // 1: also write every visible key's scaled logit (after softcap, in the
  // natural domain as prefill's) to buffer 7, (n_q_heads, n_tokens) float,
  // for an eviction policy's scores (attn_scores_*). 0: buffer 7 is unused.
  uint32_t logits;
};

// attn_decode_reduce_*: merges the n_chunks (<= kAttnDecodeMaxChunks) partials
// of each query head. Grid: (n_q_heads); threads: kAttnReduceThreads;
// threadgroup memory 0: kAttnReduceTgFloats floats.
struct AttnDecodeReduce {
  uint32_t n_q_heads;
  uint32_t n_chunks;
  uint32_t has_sinks;
};

// Bidirectional blocks a prefill call may name (Gemma 3's images, a vision
// tower's whole sequence): a query in block i sees every key of its block.
MKV_CONSTANT uint32_t kAttnMaxBlocks = 8;

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
  uint32_t slots;             // rows of the pool
  uint32_t window;
  float scale;
  float softcap;
  uint32_t has_sinks;
  uint32_t k_format;  // as AttnDecode
  uint32_t v_format;
  uint32_t residual;  // as AttnDecode, per query
  uint32_t ring_slots;
  uint32_t ring_lo;
  // 1: also write every visible key's scaled logit (after softcap, natural
  // domain) to buffer 7, (n_queries, n_q_heads, q_pos0 + n_queries) float.
  uint32_t logits;
  // Bidirectional blocks, sorted and disjoint, within [0, n_tokens): a query at
  // a position in [block_lo[i], block_hi[i]) sees keys up to block_hi[i] - 1
  // (and its window's start as ever); other queries are causal.
  uint32_t n_blocks;
  uint32_t block_lo[kAttnMaxBlocks];
  uint32_t block_hi[kAttnMaxBlocks];
};

// attn_scores_stats / attn_scores_add (attention_scores.metal): an eviction
// policy's scores from the logits an attention kernel wrote, (n_queries,
// n_q_heads, stride) float, query row i seeing keys 0 .. n_tokens - n_queries
// + i. stats: per (row, head) the max m and sum l of exp(s - m), grid (rows from row_lo, n_q_heads),
// 256 threads. add: scores[kv_head * score_stride + j] += the probability of
// key j summed over the rows from row_lo and the kv_head's query heads, one
// thread per (key, KV head); accumulate 0: = instead of += (a verified row's
// share, kept aside until the rows a step keeps are known).
struct AttnScores {
  uint32_t n_q_heads;
  uint32_t n_kv_heads;
  uint32_t n_tokens;
  uint32_t n_queries;
  uint32_t row_lo;
  uint32_t stride;
  uint32_t score_stride;
  uint32_t accumulate;
};

// attn_scores_apply (attention_scores.metal): the shares of a verified
// segment's kept rows (speculative decoding), added to the scores in row
// order: scores[h * score_stride + j] += shares[r * row_stride + h *
// share_stride + j] for each row r < rows whose bit is set in row_mask, and
// key j < keys + r (row r saw keys + r keys). One add per row, as decoding
// the rows one step at a time does. Grid (ceil((keys + rows - 1) / 64), n_kv_heads), 64 threads.
struct AttnScoresApply {
  uint32_t n_kv_heads;
  uint32_t keys;
  uint32_t rows;
  uint32_t row_mask;
  uint32_t row_stride;
  uint32_t share_stride;
  uint32_t score_stride;
};

// The first key position query position `pos` reads from the ring (kv_format.h's
// residual window), for a cache with a window: keys before it are read from the pool.
constexpr uint32_t attn_ring_start(uint32_t pos, uint32_t residual, uint32_t ring_lo) {
  const uint32_t s = pos + 1 >= residual ? (pos + 1 - residual) / kKvBlockTokens * kKvBlockTokens : 0u;
  return s > ring_lo ? s : ring_lo;
}

}  // namespace mkv_params

#ifndef __METAL_VERSION__
static_assert(sizeof(mkv_params::AttnScores) == 32, "AttnScores params layout");
static_assert(sizeof(mkv_params::AttnScoresApply) == 28, "AttnScoresApply params layout");
static_assert(sizeof(mkv_params::AttnDecode) == 76, "AttnDecode params layout");
static_assert(sizeof(mkv_params::AttnDecodeReduce) == 12, "AttnDecodeReduce params layout");
static_assert(sizeof(mkv_params::AttnPrefill) == 80 + 8 * mkv_params::kAttnMaxBlocks, "AttnPrefill params layout");
#endif
