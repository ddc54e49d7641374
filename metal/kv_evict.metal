// Eviction kernels (kv/kv_evict.cpp drives them): the compaction that moves
// kept rows into evicted ones, and the key-norm policy's scores.
#include "mkv_kernel.h"
#include "kv_format.h"
#include "kv_params.h"
#include "kv_table.h"

// One threadgroup per move; its threads stride over the 2-byte words of the
// four planes of one (index, head) row: K codes, K parameters, V codes, V
// parameters (every plane's per-head bytes are even: kv_format.h).
MKV_MAX_THREADS(64) kernel void kv_move_rows(constant mkv_params::KvMove& p [[buffer(0)]],
                         device uchar* pool [[buffer(1)]],        // the layer's pool: K section, then V
                         const device uint* table [[buffer(2)]],  // the sequence's block table
                         const device uint* moves [[buffer(3)]],  // (head, from, to) per move
                         uint tg [[threadgroup_position_in_grid]],
                         uint tid [[thread_index_in_threadgroup]],
                         uint nt [[threads_per_threadgroup]]) {
  constexpr uint B = mkv_params::kKvBlockTokens;
  const uint H = p.n_kv_heads, D = p.head_dim;
  const uint h = moves[3 * tg], from = kv_slot(table, moves[3 * tg + 1]), to = kv_slot(table, moves[3 * tg + 2]);
  for (uint kv = 0; kv < 2; ++kv) {
    const uint fmt = kv == 0 ? p.k_format : p.v_format;
    device uchar* section = pool + (kv == 0 ? 0u : p.slots * mkv_params::kv_slot_bytes(p.k_format, H, D));
    const uint data = mkv_params::kv_data_bytes(fmt, D) / 2, prm = mkv_params::kv_param_bytes(fmt, D) / 2;
    device ushort* d_from = (device ushort*)(section + mkv_params::kv_data_offset(fmt, B, H, D, from, h, 0));
    device ushort* d_to = (device ushort*)(section + mkv_params::kv_data_offset(fmt, B, H, D, to, h, 0));
    for (uint i = tid; i < data; i += nt) d_to[i] = d_from[i];
    if (prm == 0) continue;
    device ushort* p_from = (device ushort*)(section + mkv_params::kv_param_offset(fmt, B, H, D, from, h, 0));
    device ushort* p_to = (device ushort*)(section + mkv_params::kv_param_offset(fmt, B, H, D, to, h, 0));
    for (uint i = tid; i < prm; i += nt) p_to[i] = p_from[i];
  }
}

// One threadgroup per token, one thread per KV head.
MKV_MAX_THREADS(256) kernel void kv_key_scores(constant mkv_params::KvKeyScores& p [[buffer(0)]],
                          const device float* k_new [[buffer(1)]],  // (n_new, n_kv_heads, head_dim)
                          device float* scores [[buffer(2)]],       // (n_kv_heads, stride)
                          uint t [[threadgroup_position_in_grid]],
                          uint h [[thread_index_in_threadgroup]]) {
  if (h >= p.n_kv_heads) return;
  const device float* k = k_new + (t * p.n_kv_heads + h) * p.head_dim;
  float ss = 0.0f;
  for (uint d = 0; d < p.head_dim; ++d) ss += k[d] * k[d];
  scores[h * p.stride + p.first_index + t] = -sqrt(ss);
}
