// Eviction ops: checks and dispatch of kv_move_rows and kv_key_scores.
#include "ops/kv_evict.h"

#include <algorithm>

#include "metal/kv_format.h"
#include "metal/kv_params.h"

namespace mkv::ops {
namespace {

constexpr const char* kMoveRowsKernel = "kv_move_rows";
constexpr const char* kKeyScoresKernel = "kv_key_scores";

constexpr const char* kOp = "kv_evict";

void check_bytes(const char* what, const BufferView& v, uint64_t bytes) { ops::check_bytes(kOp, what, v, bytes); }

}  // namespace

void kv_move_rows(gpu::Device& dev, gpu::ComputeEncoder& enc, const BufferView& pool, const BufferView& table,
                  const BufferView& moves, const KvMoveDesc& d) {
  if (d.n_moves == 0) return;
  if (d.n_kv_heads == 0 || d.head_dim == 0 || d.slots == 0 || d.slots % mkv_params::kKvBlockTokens != 0)
    fail(kOp, "kv_move_rows needs n_kv_heads, head_dim > 0 and whole blocks of slots");
  if (d.k_format == mkv_params::kKvQ2K || d.k_format >= mkv_params::kKvFormats || d.v_format >= mkv_params::kKvFormats)
    fail(kOp, "kv_move_rows cannot move single rows of K format " + std::to_string(d.k_format) +
                  " (a q2 K row's parameters belong to its whole block)");
  check_bytes("pool", pool,
              uint64_t(d.slots) * (mkv_params::kv_slot_bytes(d.k_format, d.n_kv_heads, d.head_dim) +
                                   mkv_params::kv_slot_bytes(d.v_format, d.n_kv_heads, d.head_dim)));
  check_bytes("table (uint32 per block)", table, ceil_div(d.indices, mkv_params::kKvBlockTokens) * 4);
  check_bytes("moves ((head, from, to) uint32 per move)", moves, uint64_t(d.n_moves) * 12);
  enc.set_pipeline(dev.pipeline(kMoveRowsKernel));
  const mkv_params::KvMove p{d.n_moves, d.n_kv_heads, d.head_dim, d.k_format, d.v_format, d.slots};
  bind_params(enc, p, 0);
  bind(enc, pool, 1);
  bind(enc, table, 2);
  bind(enc, moves, 3);
  enc.dispatch_threadgroups({d.n_moves, 1, 1}, {64, 1, 1});
}

void kv_key_scores(gpu::Device& dev, gpu::ComputeEncoder& enc, const BufferView& k_new, const BufferView& scores,
                   const KvKeyScoresDesc& d) {
  if (d.n_new == 0) return;
  if (d.n_kv_heads == 0 || d.n_kv_heads > 256 || d.head_dim == 0)
    fail(kOp, "kv_key_scores needs 1..256 KV heads and head_dim > 0");
  if (uint64_t(d.first_index) + d.n_new > d.stride)
    fail(kOp, "kv_key_scores: indices " + std::to_string(d.first_index) + ".." +
                  std::to_string(uint64_t(d.first_index) + d.n_new - 1) + " pass the stride " + std::to_string(d.stride));
  check_bytes("k_new (n_new, n_kv_heads, head_dim) float", k_new, uint64_t(d.n_new) * d.n_kv_heads * d.head_dim * 4);
  check_bytes("scores (n_kv_heads, stride) float", scores, uint64_t(d.n_kv_heads) * d.stride * 4);
  enc.set_pipeline(dev.pipeline(kKeyScoresKernel));
  const mkv_params::KvKeyScores p{d.n_new, d.n_kv_heads, d.head_dim, d.first_index, d.stride};
  bind_params(enc, p, 0);
  bind(enc, k_new, 1);
  bind(enc, scores, 2);
  enc.dispatch_threadgroups({d.n_new, 1, 1}, {ceil_div(d.n_kv_heads, 32) * 32, 1, 1});
}

std::vector<std::string> kv_evict_kernel_names() { return {kMoveRowsKernel, kKeyScoresKernel}; }

}  // namespace mkv::ops
