// KV store op: writes n_new new K and V rows (float, the model's projection
// outputs) into slots of a destination of dst_rows slots, K section then V
// section, each in its format (metal/kv_format.h: f16, q8, q4; quantized
// after RoPE), RoPE-rotating K when asked. Kernels kv_store_f32 and
// kv_store_f32_rope_<style> (metal/kv_store.metal).
//
// The destination is either a layer's pool (the compute store: token t goes to
// the slot the block table gives position first_pos + t) or a staging buffer
// that a blit encoder then copies into the pool (the blit store: consecutive
// rows from dst_first_row). Both run the same kernel, so the half rows they
// produce are bit-identical.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/ops.h"
#include "ops/rope.h"

namespace mkv::ops {

// The step's queries (n_new, n_heads, head_dim) float, rotated in place by
// the K store's dispatch with K's rope and positions. n_heads 0: none.
struct QueryRope {
  BufferView q;
  uint32_t n_heads = 0;
};

struct KvStoreDesc {
  uint32_t n_new = 0;          // tokens to store
  uint32_t n_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t dst_rows = 0;       // rows per block (K, V) of dst
  uint32_t dst_first_row = 0;  // without a table: row of token 0 (dst_first_row + n_new <= dst_rows)
  uint32_t first_pos = 0;      // position of token 0 (rope angle)
  uint32_t first_index = 0;    // with a table: index of token 0 (its slot: the table's entry for it);
                               // the position unless an eviction policy compacted the cache
  const RopeSpec* rope = nullptr;  // rotate K; V is never rotated
  // With rope: also rotate these queries in place, in the same dispatch (a
  // model step then needs no rope() of its own for Q).
  QueryRope queries;
  // The sequence's block table (uint32, one entry per kKvBlockTokens
  // positions, up to the last stored); null: consecutive rows. The caller
  // guarantees the entries name distinct blocks of dst (kv::BlockTable does).
  BufferView table;
  uint32_t k_format = 0;  // mkv_params::kKvF16, kKvQ8, kKvQ4 or kKvQ2K (V: kKvQ2V)
  uint32_t v_format = 0;
  // Hadamard-rotate K (after rope), V and the queries before storing them
  // (ops::hadamard; a power-of-two head_dim). k_new and v_new are rotated in
  // place: the caller's rows are scratch from then on.
  bool rotate = false;
  // A residual window's ring (kv::KvCacheSpec::residual): every row is also
  // written as f16 to ring, K (ring_slots, n_kv_heads, head_dim) half then V,
  // position p at slot p % ring_slots; a q2k K section is not written (kv_seal_q2k
  // quantizes its blocks once they are full). 0: none.
  uint32_t ring_slots = 0;
  BufferView ring;
};

// kv_seal_q2k: the K of n_blocks full blocks from position first_pos (a
// multiple of kKvBlockTokens), quantized per channel into the pool from the
// ring's rows (those of positions >= ring_lo; below it, from the block's own
// codes). table: the sequence's block table.
struct KvSealDesc {
  uint32_t n_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t slots = 0;  // of the pool
  uint32_t first_pos = 0;
  uint32_t n_blocks = 0;
  uint32_t ring_slots = 0;
  uint32_t ring_lo = 0;
};
void kv_seal_q2k(gpu::Device& dev, gpu::ComputeEncoder& enc, const BufferView& pool, const BufferView& ring,
                 const BufferView& table, const KvSealDesc& desc);

// k_new, v_new: (n_new, n_kv_heads, head_dim) float. dst: kv_region_bytes
// (kv/kv_layout.h) of dst_rows slots. Raises GpuError "[kv_store] ..." on bad input.
void kv_store(gpu::Device& dev, gpu::ComputeEncoder& enc, const BufferView& k_new,
              const BufferView& v_new, const BufferView& dst, const KvStoreDesc& desc);

// The kernel name kv_store() dispatches for this rope (nullptr: none).
std::string kv_store_kernel_name(const RopeSpec* rope);
// Every kernel name kv_store and kv_seal_q2k build (tests/gpu/test_kernel_names.py).
std::vector<std::string> kv_store_kernel_names();

}  // namespace mkv::ops
