// Eviction ops (kv::KvCache's policies, kv/kv_evict.cpp): the compaction that
// moves kept K/V rows into evicted ones, and the key-norm policy's scores.
// Kernels kv_move_rows and kv_key_scores (metal/kv_evict.metal).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/ops.h"

namespace mkv::ops {

struct KvMoveDesc {
  uint32_t n_moves = 0;
  uint32_t n_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t k_format = 0;  // mkv_params::kKvF16, kKvQ8, kKvQ4 (K); or kKvQ2V (V); not kKvQ2K
  uint32_t v_format = 0;
  uint32_t slots = 0;     // of the pool
  uint32_t indices = 0;   // indices the table maps (every from / to is below it)
};

// moves: n_moves (head, from, to) uint32 triples; each copies head's K and V
// rows of index `from` to index `to` (through table). No `to` may be another
// move's `from` (their order is not kept). Raises GpuError "[kv_evict] ...".
void kv_move_rows(gpu::Device& dev, gpu::ComputeEncoder& enc, const BufferView& pool, const BufferView& table,
                  const BufferView& moves, const KvMoveDesc& desc);

struct KvKeyScoresDesc {
  uint32_t n_new = 0;
  uint32_t n_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t first_index = 0;
  uint32_t stride = 0;  // indices per head in scores
};

// scores (n_kv_heads, stride) float: [h, first_index + t] = -|k_new[t, h]|.
void kv_key_scores(gpu::Device& dev, gpu::ComputeEncoder& enc, const BufferView& k_new, const BufferView& scores,
                   const KvKeyScoresDesc& desc);

// Every kernel name the ops above build (tests/gpu/test_kernel_names.py).
std::vector<std::string> kv_evict_kernel_names();

}  // namespace mkv::ops
