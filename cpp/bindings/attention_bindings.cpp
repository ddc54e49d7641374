// metalkv._core.ops.attention_*: the attention ops as Python functions over
// device buffers, for tests and tools. Each call encodes into one command
// buffer, commits and waits.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <optional>

#include "bindings.h"
#include "metal/kv_params.h"
#include "kv/kv_layout.h"
#include "ops/attention.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace mkv::bindings {
namespace {

using gpu::BufferPtr;

ops::AttentionSplit parse_split(const std::string& s) {
  if (s == "auto") return ops::AttentionSplit::automatic;
  if (s == "never") return ops::AttentionSplit::never;
  if (s == "always") return ops::AttentionSplit::always;
  throw nb::value_error(("[attention_decode] split '" + s + "' is not one of 'auto', 'never', 'always'").c_str());
}

ops::AttentionDesc make_desc(uint32_t n_q_heads, uint32_t n_kv_heads, uint32_t head_dim,
                             uint32_t n_tokens, uint32_t slots, uint32_t window,
                             std::optional<float> scale, float softcap, bool has_sinks,
                             const std::string& kv_k = "f16", const std::string& kv_v = "f16") {
  ops::AttentionDesc d;
  d.k_format = kv::parse_kv_format(kv_k, "kv_k");
  d.v_format = kv::parse_kv_format(kv_v, "kv_v");
  d.n_q_heads = n_q_heads;
  d.n_kv_heads = n_kv_heads;
  d.head_dim = head_dim;
  d.n_tokens = n_tokens;
  d.slots = slots;
  d.window = window;
  d.scale = scale ? *scale : (head_dim ? 1.0f / std::sqrt(float(head_dim)) : 0.0f);
  d.softcap = softcap;
  d.has_sinks = has_sinks;
  return d;
}

ops::AttentionDesc decode_desc(uint32_t n_q_heads, uint32_t n_kv_heads, uint32_t head_dim,
                               uint32_t n_tokens, uint32_t slots, uint32_t window,
                               std::optional<float> scale, float softcap, bool has_sinks,
                               const std::string& split, uint32_t chunks, const std::string& variant,
                               const std::string& kv_k, const std::string& kv_v) {
  ops::AttentionDesc d =
      make_desc(n_q_heads, n_kv_heads, head_dim, n_tokens, slots, window, scale, softcap, has_sinks, kv_k, kv_v);
  d.split = parse_split(split);
  d.split_chunks = chunks;
  d.decode_variant = variant;
  return d;
}

ops::BufferView view(const BufferPtr& b, size_t offset = 0) { return {b, offset}; }

// The residual window's arguments (ops::AttentionDesc::residual).
void set_window(ops::AttentionDesc& d, const std::optional<BufferPtr>& ring, uint32_t residual, uint32_t ring_slots,
                uint32_t ring_lo) {
  d.residual = residual;
  d.ring_slots = ring_slots;
  d.ring_lo = ring_lo;
  d.ring = view(ring ? *ring : nullptr);
}

// An eviction policy's logits and scores (ops::AttentionDesc::logits,
// ops::attention_scores), encoded after the attention in its command buffer.
struct PolicyArgs {
  std::optional<BufferPtr> logits, scores;
  uint32_t row_lo = 0, stride = 0;
};
void encode_scores(PyDevice& dev, gpu::ComputeEncoder& enc, const ops::AttentionDesc& d, const PolicyArgs& a,
                   const BufferPtr& scratch) {
  if (a.scores)
    ops::attention_scores(*dev.device, enc, d, a.row_lo, view(*a.scores), a.stride ? a.stride : d.n_tokens,
                          view(scratch));
}
BufferPtr scores_scratch(PyDevice& dev, const ops::AttentionDesc& d, const PolicyArgs& a) {
  if (a.scores && !a.logits) throw nb::value_error("[attention_scores] scores need a logits buffer");
  return a.scores ? dev.device->new_buffer(size_t(d.n_queries) * d.n_q_heads * 8) : nullptr;
}

// The op trusts the table's entries (a kv::BlockTable writes them); from
// Python anything can arrive, so the entries the queries reach are checked
// here: each must name a block of the pool.
void check_table(const char* op, const ops::AttentionDesc& d, const BufferPtr& table) {
  constexpr uint32_t B = mkv_params::kKvBlockTokens;
  const uint32_t n_blocks = (d.n_tokens + B - 1) / B;
  if (!table || table->length() < size_t(n_blocks) * 4)
    throw nb::value_error((std::string("[") + op + "] table needs " + std::to_string(n_blocks) +
                           " uint32 entries (one per " + std::to_string(B) + " positions of n_tokens " +
                           std::to_string(d.n_tokens) + ")").c_str());
  std::vector<uint32_t> ids(n_blocks);
  table->read(0, ids.data(), ids.size() * 4);
  const uint32_t first_q = d.n_tokens - d.n_queries;
  const uint32_t lo = d.window > 0 && first_q + 1 > d.window ? first_q + 1 - d.window : 0;
  for (uint32_t i = lo / B; i < n_blocks; ++i)
    if (ids[i] >= d.slots / B)
      throw nb::value_error((std::string("[") + op + "] table entry " + std::to_string(i) + " is block " +
                             std::to_string(ids[i]) + "; the pool has " + std::to_string(d.slots / B) +
                             " blocks (slots / " + std::to_string(B) + ")").c_str());
}

void bind_attention(nb::module_&, nb::module_& ops_m) {
  ops_m.def("attention_head_dims", &ops::attention_head_dims,
            "The head_dims the attention kernels take (ascending); any other is refused.");

  ops_m.def(
      "attention_decode",
      [](PyDevice& dev, const BufferPtr& q, const BufferPtr& kv, const BufferPtr& table, const BufferPtr& out,
         uint32_t n_q_heads, uint32_t n_kv_heads, uint32_t head_dim, uint32_t n_tokens,
         uint32_t slots, uint32_t window, std::optional<float> scale, float softcap,
         const std::optional<BufferPtr>& sinks, const std::string& split, uint32_t chunks,
         size_t kv_offset, const std::optional<BufferPtr>& scratch, const std::string& variant,
         const std::string& kv_k, const std::string& kv_v, const std::optional<BufferPtr>& ring, uint32_t residual,
         uint32_t ring_slots, uint32_t ring_lo, const std::optional<BufferPtr>& logits,
         const std::optional<BufferPtr>& scores, uint32_t score_rows_from, uint32_t score_stride) {
        ops::AttentionDesc d = decode_desc(n_q_heads, n_kv_heads, head_dim, n_tokens, slots, window, scale, softcap,
                                           sinks.has_value(), split, chunks, variant, kv_k, kv_v);
        set_window(d, ring, residual, ring_slots, ring_lo);
        d.logits = view(logits ? *logits : nullptr);
        const PolicyArgs pa{logits, scores, score_rows_from, score_stride};
        const BufferPtr policy_scratch = scores_scratch(dev, d, pa);
        ops::attention_decode_plan(d, 1);  // the desc's own checks first
        check_table("attention_decode", d, table);
        const size_t scratch_bytes = ops::attention_decode_scratch_bytes(d);
        BufferPtr scratch_buf = scratch ? *scratch : nullptr;
        if (!scratch_buf && scratch_bytes) scratch_buf = dev.device->new_buffer(scratch_bytes);
        run_compute(dev, [&](gpu::ComputeEncoder& enc) {
          ops::attention_decode(*dev.device, enc, d, view(q), view(kv, kv_offset), view(table), view(out),
                                view(sinks ? *sinks : nullptr), view(scratch_buf));
          encode_scores(dev, enc, d, pa, policy_scratch);
        });
      },
      "device"_a, "q"_a, "kv"_a, "table"_a, "out"_a, nb::kw_only(), "n_q_heads"_a, "n_kv_heads"_a,
      "head_dim"_a, "n_tokens"_a, "slots"_a, "window"_a = 0, "scale"_a = nb::none(),
      "softcap"_a = 0.0f, "sinks"_a = nb::none(), "split"_a = "auto", "chunks"_a = 0,
      "kv_offset"_a = 0, "scratch"_a = nb::none(), "variant"_a = "", "kv_k"_a = "f16", "kv_v"_a = "f16",
      "ring"_a = nb::none(), "residual"_a = 0, "ring_slots"_a = 0, "ring_lo"_a = 0, "logits"_a = nb::none(),
      "scores"_a = nb::none(), "score_rows_from"_a = 0, "score_stride"_a = 0,
      "Decode attention of q (n_q_heads, head_dim) f32 at position n_tokens-1 over the\n"
      "pool kv (K section, V section; f16: (2, slots, n_kv_heads, head_dim)) into out (n_q_heads, head_dim) f32; table: uint32\n"
      "buffer, the pool block of each BLOCK_TOKENS positions (ceil(n_tokens / BLOCK_TOKENS)).\n"
      "scale defaults to 1/sqrt(head_dim); softcap 0 = off; window 0 = full attention;\n"
      "sinks: (n_q_heads) f32 buffer or None. split: 'auto' (heuristic), 'never' or\n"
      "'always' (chunks: number of key chunks, 0 = the rule). scratch is allocated\n"
      "when not given (see attention_decode_plan()['scratch_bytes']). variant: '' (the device's\n"
      "shape), 'gpu' (the GPU shape, also on the host), 'host' (the host executor's) or 'nopf' (the GPU\n"
      "shape without prefetch, head_dim 128). kv_k, kv_v: the pool's K and V\n"
      "formats ('f16', 'q8', 'q4', 'q2'; docs/KV_QUANT.md), read and dequantized in the kernels.\n"
      "residual > 0: a residual window; the keys from max(ring_lo, floor((n_tokens - residual) / 32) * 32)\n"
      "on are read from ring (K (ring_slots, n_kv_heads, head_dim) f16, then V; position p at slot\n"
      "p % ring_slots), the rest from kv. logits: a (n_q_heads, n_tokens) f32 buffer that also gets every key's\n"
      "scaled logit (after softcap; an eviction policy's); scores: (n_kv_heads, score_stride or n_tokens) f32, to\n"
      "which attention_scores then adds each key's probability summed over its KV head's query heads.");

  ops_m.def(
      "attention_decode_plan",
      [](uint32_t n_q_heads, uint32_t n_kv_heads, uint32_t head_dim, uint32_t n_tokens,
         uint32_t slots, uint32_t window, bool has_sinks, const std::string& split, uint32_t chunks,
         PyDevice* device, uint32_t wave, const std::string& variant, const std::string& kv_k,
         const std::string& kv_v) {
        const ops::AttentionDesc d = decode_desc(n_q_heads, n_kv_heads, head_dim, n_tokens, slots,
                                                 window, 1.0f, 0.0f, has_sinks, split, chunks, variant, kv_k, kv_v);
        if ((device != nullptr) == (wave != 0))
          throw nb::value_error("[attention_decode_plan] give exactly one of device (its wave) or wave "
                                "(threadgroups the device runs at once)");
        const ops::AttentionDecodePlan p =
            device ? ops::attention_decode_plan(*device->device, d) : ops::attention_decode_plan(d, wave);
        nb::dict r;
        r["kernel"] = p.kernel;
        r["split"] = p.split;
        r["n_keys"] = p.n_keys;
        r["heads_per_block"] = p.heads_per_block;
        r["head_blocks"] = p.head_blocks;
        r["n_chunks"] = p.n_chunks;
        r["chunk_keys"] = p.chunk_keys;
        r["threadgroups"] = p.threadgroups;
        r["threads"] = p.threads;
        r["wave"] = p.wave;
        r["scratch_bytes"] = p.scratch_bytes;
        r["scratch_bound"] = ops::attention_decode_scratch_bytes(d);
        r["kv_bytes_read"] = p.kv_bytes_read;
        r["kv_bytes_visible"] = p.kv_bytes_visible;
        return r;
      },
      nb::kw_only(), "n_q_heads"_a, "n_kv_heads"_a, "head_dim"_a, "n_tokens"_a, "slots"_a,
      "window"_a = 0, "has_sinks"_a = false, "split"_a = "auto", "chunks"_a = 0,
      "device"_a = nb::none(), "wave"_a = 0, "variant"_a = "", "kv_k"_a = "f16", "kv_v"_a = "f16",
      "How attention_decode would run on device (or a device running `wave` split threadgroups\n"
      "at once): kernel, split-K chunks, threadgroups, scratch bytes (and scratch_bound, what\n"
      "attention_decode_scratch_bytes reserves for any device) and the K/V bytes it reads per\n"
      "step (kv_bytes_read / kv_bytes_visible = reads per byte).");

  ops_m.def(
      "attention_prefill",
      [](PyDevice& dev, const BufferPtr& q, const BufferPtr& kv, const BufferPtr& table, const BufferPtr& out,
         uint32_t n_q_heads, uint32_t n_kv_heads, uint32_t head_dim, uint32_t n_queries,
         uint32_t q_pos0, uint32_t slots, uint32_t window, std::optional<float> scale, float softcap,
         const std::optional<BufferPtr>& sinks, size_t kv_offset, const std::string& kv_k,
         const std::string& kv_v, const std::optional<BufferPtr>& ring, uint32_t residual, uint32_t ring_slots,
         uint32_t ring_lo, const std::optional<BufferPtr>& logits, const std::optional<BufferPtr>& scores,
         uint32_t score_rows_from, uint32_t score_stride, const std::string& variant,
         const std::vector<std::pair<uint32_t, uint32_t>>& blocks, bool half_operands) {
        ops::AttentionDesc d = make_desc(n_q_heads, n_kv_heads, head_dim, q_pos0 + n_queries,
                                         slots, window, scale, softcap, sinks.has_value(), kv_k, kv_v);
        d.n_queries = n_queries;
        d.prefill_variant = variant;
        d.half_operands = half_operands;
        for (const auto& [lo, hi] : blocks) d.blocks.push_back({lo, hi});
        set_window(d, ring, residual, ring_slots, ring_lo);
        d.logits = view(logits ? *logits : nullptr);
        const PolicyArgs pa{logits, scores, score_rows_from, score_stride};
        const BufferPtr policy_scratch = scores_scratch(dev, d, pa);
        if (n_queries > 0 && slots % mkv_params::kKvBlockTokens == 0) check_table("attention_prefill", d, table);
        run_compute(dev, [&](gpu::ComputeEncoder& enc) {
          ops::attention_prefill(*dev.device, enc, d, view(q), view(kv, kv_offset), view(table), view(out),
                                 view(sinks ? *sinks : nullptr));
          encode_scores(dev, enc, d, pa, policy_scratch);
        });
      },
      "device"_a, "q"_a, "kv"_a, "table"_a, "out"_a, nb::kw_only(), "n_q_heads"_a, "n_kv_heads"_a,
      "head_dim"_a, "n_queries"_a, "q_pos0"_a, "slots"_a, "window"_a = 0, "scale"_a = nb::none(),
      "softcap"_a = 0.0f, "sinks"_a = nb::none(), "kv_offset"_a = 0, "kv_k"_a = "f16", "kv_v"_a = "f16",
      "ring"_a = nb::none(), "residual"_a = 0, "ring_slots"_a = 0, "ring_lo"_a = 0, "logits"_a = nb::none(),
      "scores"_a = nb::none(), "score_rows_from"_a = 0, "score_stride"_a = 0, "variant"_a = "",
      "blocks"_a = std::vector<std::pair<uint32_t, uint32_t>>{}, "half_operands"_a = false,
      "Prefill attention of q (n_queries, n_q_heads, head_dim) f32 at positions q_pos0 ..\n"
      "q_pos0+n_queries-1 over the pool kv through table (as\n"
      "for decode), which already\n"
      "holds their keys (n_tokens = q_pos0 + n_queries), into out (n_queries, n_q_heads,\n"
      "head_dim) f32. Causal; window > 0 adds the sliding-window mask; blocks: [(lo, hi), ...]\n"
      "bidirectional blocks of positions, a query in one seeing all of its block's keys. kv_k, kv_v, ring, residual,\n"
      "ring_slots, ring_lo: as for decode, each query with its own window start. logits ((n_queries, n_q_heads,\n"
      "n_tokens) f32), scores, score_rows_from (the first query row that adds), score_stride: as for decode.\n"
      "variant: the kernels' shape, '' (the device's), 'gpu' (the GPU's SIMD shape, also on the host), 'host'\n"
      "(the host executor's) or 'mma' (simdgroup_matrix, any device). half_operands (f16 K/V, no ring or\n"
      "logits): where the mma shape runs, q and the softmax's weights are rounded to half for the products.");
}

}  // namespace

MKV_BINDING(attention, bind_attention);

}  // namespace mkv::bindings
