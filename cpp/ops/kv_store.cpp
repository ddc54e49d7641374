// KV store op: checks, kernel choice (kv_store_f32[_rope_<style>]), dispatch.
#include "ops/kv_store.h"

#include <algorithm>

#include "metal/kv_format.h"
#include "metal/kv_params.h"
#include "ops/launch.h"

namespace mkv::ops {
namespace {

constexpr const char* kSealQ2kKernel = "kv_seal_q2k";

constexpr const char* kOp = "kv_store";

void check_bytes(const char* what, const BufferView& v, uint64_t bytes) { ops::check_bytes(kOp, what, v, bytes); }

}  // namespace

std::string kv_store_kernel_name(const RopeSpec* rope) {
  return rope ? std::string("kv_store_f32_rope_") + rope_style_name(rope->style) : "kv_store_f32";
}

void kv_store(gpu::Device& dev, gpu::ComputeEncoder& enc, const BufferView& k_new,
              const BufferView& v_new, const BufferView& dst, const KvStoreDesc& d) {
  // 1. check the arguments
  if (d.n_new == 0 || d.n_kv_heads == 0 || d.head_dim == 0)
    fail(kOp, "n_new, n_kv_heads and head_dim must be positive (got " + std::to_string(d.n_new) +
                  ", " + std::to_string(d.n_kv_heads) + ", " + std::to_string(d.head_dim) + ")");
  if (uint64_t(d.first_pos) + d.n_new > (uint64_t(1) << 32))
    fail(kOp, "positions past 2^32 - 1 are not supported");
  const bool paged = d.table.buffer != nullptr;
  constexpr uint32_t B = mkv_params::kKvBlockTokens;
  if (paged) {
    if (d.dst_rows == 0 || d.dst_rows % B != 0)
      fail(kOp, "a paged destination has whole blocks of " + std::to_string(B) + " rows; dst_rows is " +
                    std::to_string(d.dst_rows));
    check_bytes("table (uint32 per block)", d.table, ceil_div(uint64_t(d.first_index) + d.n_new, B) * 4);
  } else if (uint64_t(d.dst_first_row) + d.n_new > d.dst_rows) {
    // Rows past the end would be written out of bounds.
    fail(kOp, std::to_string(d.n_new) + " new tokens from row " + std::to_string(d.dst_first_row) +
                  " do not fit in " + std::to_string(d.dst_rows) + " destination rows");
  }
  for (uint32_t f : {d.k_format, d.v_format})
    if (!mkv_params::kv_format_fits(f, d.head_dim))
      fail(kOp, "KV format " + std::to_string(f) + " does not fit head_dim " + std::to_string(d.head_dim) +
                    " (the quantized formats take head_dim 32, 64 or a multiple of 64)");
  const uint64_t row = uint64_t(d.n_kv_heads) * d.head_dim;  // elements per token row
  const uint64_t dst_bytes = uint64_t(d.dst_rows) * (mkv_params::kv_slot_bytes(d.k_format, d.n_kv_heads, d.head_dim) +
                                                     mkv_params::kv_slot_bytes(d.v_format, d.n_kv_heads, d.head_dim));
  if (dst_bytes >= (uint64_t(1) << 32))
    fail(kOp, "the destination has 2^32 bytes or more; the kernel addresses it with 32 bits");
  if (d.rope) check_rope(kOp, *d.rope, d.head_dim);
  if (d.rotate && !hadamard_fits(d.head_dim))
    fail(kOp, "rotating needs a power-of-two head_dim up to 256, not " + std::to_string(d.head_dim));
  if (d.queries.n_heads && !d.rope) fail(kOp, "rotating the queries needs a rope");
  if (d.ring_slots) {
    check_bytes("ring (K then V, ring_slots rows of f16 each)", d.ring, uint64_t(d.ring_slots) * 2 * row * 2);
    if (d.n_new > d.ring_slots)
      fail(kOp, std::to_string(d.n_new) + " new tokens do not fit in a ring of " + std::to_string(d.ring_slots) + " slots");
  } else if (d.k_format == mkv_params::kKvQ2K) {
    fail(kOp, "a q2 K section is quantized from a residual window's ring (ring_slots > 0)");
  }
  if (d.k_format == mkv_params::kKvQ2V || d.v_format == mkv_params::kKvQ2K)
    fail(kOp, "q2's K format (3) is for K sections and its V format (4) for V sections");
  if (d.queries.n_heads) {
    // Q is rewritten while other threadgroups read k_new and v_new and write dst.
    const uint64_t q_bytes = uint64_t(d.n_new) * d.queries.n_heads * d.head_dim * 4;
    check_bytes("q (n_new, n_q_heads, head_dim) float", d.queries.q, q_bytes);
    if (overlaps(d.queries.q, q_bytes, k_new, d.n_new * row * 4) || overlaps(d.queries.q, q_bytes, v_new, d.n_new * row * 4) ||
        overlaps(d.queries.q, q_bytes, dst, dst_bytes))
      fail(kOp, "q overlaps k_new, v_new or dst; the queries rotated in place need their own memory");
  }
  check_bytes("k_new (n_new, n_kv_heads, head_dim) float", k_new, d.n_new * row * 4);
  check_bytes("v_new (n_new, n_kv_heads, head_dim) float", v_new, d.n_new * row * 4);
  check_bytes("dst (K then V section of dst_rows slots)", dst, dst_bytes);

  // 2. get the kernel and bind its arguments
  enc.set_pipeline(dev.pipeline(kv_store_kernel_name(d.rope)));
  const mkv_params::KvStore p{d.n_new, d.n_kv_heads, d.head_dim, d.rope ? d.rope->rotary_dim : 0u,
                              d.dst_rows, paged ? 0u : d.dst_first_row, d.first_pos, paged ? d.first_index : 0u,
                              d.queries.n_heads,
                              paged ? 1u : 0u, d.k_format, d.v_format, d.rotate ? 1u : 0u, d.ring_slots};
  bind_params(enc, p, 0);
  bind(enc, k_new, 1);
  bind(enc, v_new, 2);
  bind(enc, dst, 3);
  if (d.rope) {
    bind(enc, d.rope->inv_freq, 4);
    bind(enc, d.queries.n_heads ? d.queries.q : k_new, 5);  // k_new: a placeholder, never read
  }
  bind(enc, paged ? d.table : dst, 6);  // dst: a placeholder, never read
  bind(enc, d.ring_slots ? d.ring : dst, 7);

  // 3. one threadgroup per (token, K|V[|Q]); threads stride over the token's heads
  enc.dispatch_threadgroups({d.n_new, d.queries.n_heads ? 3u : 2u, 1}, {strided_threads(dev, row), 1, 1});
}

void kv_seal_q2k(gpu::Device& dev, gpu::ComputeEncoder& enc, const BufferView& pool, const BufferView& ring,
                 const BufferView& table, const KvSealDesc& d) {
  constexpr uint32_t B = mkv_params::kKvBlockTokens;
  if (d.n_blocks == 0) return;
  if (d.n_kv_heads == 0 || !mkv_params::kv_format_fits(mkv_params::kKvQ2K, d.head_dim))
    fail(kOp, "kv_seal_q2k needs n_kv_heads > 0 and head_dim 32, 64 or a multiple of 64");
  if (d.first_pos % B != 0) fail(kOp, "kv_seal_q2k: first_pos " + std::to_string(d.first_pos) + " starts no block");
  const uint64_t end = uint64_t(d.first_pos) + uint64_t(d.n_blocks) * B;
  if (d.ring_slots == 0 || (end > d.ring_lo && end - std::max<uint64_t>(d.ring_lo, d.first_pos) > d.ring_slots))
    fail(kOp, "kv_seal_q2k: the ring's " + std::to_string(d.ring_slots) + " slots do not hold positions " +
                  std::to_string(std::max(d.ring_lo, d.first_pos)) + ".." + std::to_string(end - 1));
  check_bytes("table (uint32 per block)", table, ceil_div(end, B) * 4);
  check_bytes("pool (K section)", pool, uint64_t(d.slots) * mkv_params::kv_slot_bytes(mkv_params::kKvQ2K, d.n_kv_heads, d.head_dim));
  check_bytes("ring", ring, uint64_t(d.ring_slots) * 2 * d.n_kv_heads * d.head_dim * 2);
  enc.set_pipeline(dev.pipeline(kSealQ2kKernel));
  const mkv_params::KvSeal p{d.n_kv_heads, d.head_dim, d.first_pos, d.n_blocks, d.ring_slots, d.ring_lo};
  bind_params(enc, p, 0);
  bind(enc, pool, 1);
  bind(enc, ring, 2);
  bind(enc, table, 3);
  enc.dispatch_threadgroups({d.n_blocks, d.n_kv_heads, 1}, {32, 1, 1});
}

std::vector<std::string> kv_store_kernel_names() {
  const RopeSpec neox{RopeStyle::neox, 0, {}}, interleaved{RopeStyle::interleaved, 0, {}};
  return {kSealQ2kKernel, kv_store_kernel_name(nullptr), kv_store_kernel_name(&neox), kv_store_kernel_name(&interleaved)};
}

}  // namespace mkv::ops
