// Argument structs of the KV-store and RoPE kernels (metal/kv_store.metal,
// metal/rope.metal), shared with the C++ ops that bind them (cpp/ops/kv_store,
// cpp/ops/rope). Sizes are static_asserted on the C++ side.
#pragma once

#include "shared_params.h"

namespace mkv_params {

// Tokens per KV block (cpp/kv/block_pool.h says why 32). Every kernel that
// touches a layer's cache reaches position p through the sequence's block
// table: slot table[p / kKvBlockTokens] * kKvBlockTokens + p % kKvBlockTokens
// (metal/kv_table.h).
MKV_CONSTANT uint32_t kKvBlockTokens = 32;

// kv_store_f32[_rope_*]: converts n_new new K and V rows (float, the model's
// projection outputs) to the cache's formats (metal/kv_format.h: f16, or
// quantized per group), RoPE-rotating K first, and writes them to slots of a
// destination of dst_rows slots: its K section, then its V section.
// Token t (position first_pos + t) goes to the slot the block table gives its
// index first_index + t (paged = 1: the compute store, into a layer's pool, units of one
// block), or to slot dst_first_row + t (paged = 0: the blit store's staging
// buffer, one unit of dst_rows slots).
// With n_q_heads > 0 (rope kernels only) the same dispatch also rotates the
// step's queries q (n_new, n_q_heads, head_dim) float in place, at the same
// positions: the decode step's Q rope costs no dispatch of its own.
struct KvStore {
  uint32_t n_new;          // tokens in this call
  uint32_t n_kv_heads;
  uint32_t head_dim;
  uint32_t rotary_dim;     // rotated leading dims of each K head (0 without rope)
  uint32_t dst_rows;       // rows in each of the K and V blocks of dst
  uint32_t dst_first_row;  // paged = 0: row of token 0 (dst_first_row + n_new <= dst_rows)
  uint32_t first_pos;      // position of token 0: its rope angle is first_pos * inv_freq
  uint32_t first_index;    // paged = 1: token t goes to the slot of index first_index + t (the
                           // same as its position unless an eviction policy compacted the cache)
  uint32_t n_q_heads;      // rotate this many query heads in place too (0: none)
  uint32_t paged;          // 1: rows through the block table; 0: consecutive rows
  uint32_t k_format;       // kKvF16, kKvQ8, kKvQ4 or kKvQ2K (kv_format.h)
  uint32_t v_format;
  uint32_t rotate;         // 1: K (after rope), V and the queries are Hadamard-rotated
                           // in place in k_new, v_new and q before they are stored (hadamard.h)
  uint32_t ring_slots;     // > 0: also write every row as f16 to the residual window's ring
                           // (ring: K (ring_slots, n_kv_heads, head_dim) half, then V), position
                           // p at slot p % ring_slots; a q2k K section is left to kv_seal
};

// kv_seal_q2k: quantizes the K of n_blocks full blocks, positions first_pos ..
// first_pos + n_blocks * kKvBlockTokens - 1, per channel (kv_format.h, q2k),
// from the f16 rows of the ring (positions >= ring_lo) or, below ring_lo, from
// the block's own codes (a block stored again after a truncate whose ring no
// longer holds the rest). Grid (n_blocks, n_kv_heads), 32 threads.
struct KvSeal {
  uint32_t n_kv_heads;
  uint32_t head_dim;
  uint32_t first_pos;  // a multiple of kKvBlockTokens
  uint32_t n_blocks;
  uint32_t ring_slots;
  uint32_t ring_lo;
};

// kv_move_rows (kv_evict.metal): an eviction's compaction. Move i (moves[3i ..
// 3i + 2] = head, from, to) copies head `head`'s K and V rows (codes and
// parameters) of index `from` to index `to` through the block table; one
// threadgroup per move. Moves of one dispatch never write a row another reads
// (kv::KVCache puts kept rows from past the new length into evicted rows
// before it), so their order does not matter. Not for a q2k K section (its
// parameters belong to a whole block).
struct KvMove {
  uint32_t n_moves;
  uint32_t n_kv_heads;
  uint32_t head_dim;
  uint32_t k_format;
  uint32_t v_format;
  uint32_t slots;  // of the layer's pool: its V section starts at slots * kv_slot_bytes(k_format)
};

// kv_key_scores (kv_evict.metal): the key-norm policy's score of n_new new
// keys, -|k| of each (token, KV head) row of k_new (n_new, n_kv_heads,
// head_dim) float (RoPE and the Hadamard rotation keep the norm), written to
// scores[head * stride + first_index + t]: the lower the norm the more a key
// is kept (low-norm keys draw the most attention).
struct KvKeyScores {
  uint32_t n_new;
  uint32_t n_kv_heads;
  uint32_t head_dim;
  uint32_t first_index;
  uint32_t stride;
};

// rope_f32_*: rotates x (n_tokens, n_heads, head_dim) float in place; token t
// is at position positions[t].
struct Rope {
  uint32_t n_tokens;
  uint32_t n_heads;
  uint32_t head_dim;
  uint32_t rotary_dim;     // even, 2..head_dim; dims past it are untouched
};

// hadamard_f32: rotates x (n_rows, n_heads, head_dim) float in place, every
// head by the orthonormal Hadamard transform (hadamard.h; head_dim a power of two).
struct Hadamard {
  uint32_t n_rows;
  uint32_t n_heads;
  uint32_t head_dim;
};

}  // namespace mkv_params

#ifndef __METAL_VERSION__
static_assert(sizeof(mkv_params::KvStore) == 56, "KvStore params layout");
static_assert(sizeof(mkv_params::KvSeal) == 24, "KvSeal params layout");
static_assert(sizeof(mkv_params::KvMove) == 24, "KvMove params layout");
static_assert(sizeof(mkv_params::KvKeyScores) == 20, "KvKeyScores params layout");
static_assert(sizeof(mkv_params::Rope) == 16, "Rope params layout");
static_assert(sizeof(mkv_params::Hadamard) == 12, "Hadamard params layout");
#endif
