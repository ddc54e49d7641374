// Attention ops: validate the descriptor, pick the variant and geometry, bind,
// dispatch. Design and read counts: metal/attention_decode.h, _prefill.h and
// docs/ATTENTION.md.
#include "ops/attention.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <memory>

#include "metal/attention_host_params.h"
#include "metal/attention_params.h"
#include "metal/kv_format.h"
#include "ops/attention_names.h"
#include "ops/launch.h"

namespace mkv::ops {
namespace {

constexpr uint32_t kThreads = mkv_params::kAttnSimdgroups * 32;                  // single pass, prefill
constexpr uint32_t kSplitThreads = mkv_params::kAttnDecodeSplitSimdgroups * 32;  // split-K first pass
constexpr uint32_t kHostThreads = mkv_params::kAttnDecodeHostSimdgroups * 32;    // the host's decode shape

// What the kernels assume of every head_dim they are built for.
constexpr bool head_dims_fit() {
  for (uint32_t d : kAttnHeadDims) {
    const uint32_t e = mkv_params::attn_lane_elems(d);
    if (d % 8 != 0 || d > kThreads) return false;              // 16-byte pieces; merge threads
    const uint32_t de = mkv_params::attn_decode_lane_elems(d);  // decode: one SIMD-group spans a row
    if (mkv_params::attn_decode_key_lanes(d) > 32 || d % de != 0 || (de != 4 && de != 8)) return false;
    if (mkv_params::attn_decode_rows(d) * de > 32) return false;  // q + acc in registers
    // A lane group's keys of one block lie in at most two table blocks (attn_decode_load_block).
    if ((mkv_params::kAttnDecodeBlockKeys - 1) * (32 / mkv_params::attn_decode_key_lanes(d)) + 1 >
        mkv_params::kKvBlockTokens)
      return false;
    // The host's decode shape: whole pieces a lane, whole lanes a row, the same two-entry rule.
    const uint32_t he = mkv_params::attn_decode_host_lane_elems(d);
    const uint32_t hkl = mkv_params::attn_decode_key_lanes_for(d, he);
    if (hkl > 32 || he % de != 0 || d % he != 0 ||
        (mkv_params::kAttnDecodeBlockKeys - 1) * (32 / hkl) + 1 > mkv_params::kKvBlockTokens)
      return false;
    if ((mkv_params::kAttnReduceThreads / (d / 4)) * d > mkv_params::kAttnReduceOutFloats) return false;
    if (mkv_params::attn_lanes(d) > 32 || d % e != 0) return false;  // one SIMD-group spans a row
    if (mkv_params::attn_rows_per_simdgroup(d) * e > 32) return false;  // q + acc in registers
    if (4 * mkv_params::attn_prefill_key_tile(d) * d > 16384) return false;  // K + V tile bytes
    if (mkv_params::attn_prefill_key_tile(d) % 4 != 0) return false;  // 4-key blocks
  }
  return true;
}
static_assert(mkv_params::kAttnDecodeBlockKeys == 4, "decode scores of a block travel as one float4");
static_assert(head_dims_fit(), "a head_dim in kAttnHeadDims breaks an assumption of the kernels");

std::string num(uint64_t v) { return std::to_string(v); }

// Bytes of one key's K and V rows of one KV head: codes and group parameters.
uint64_t kv_head_bytes(const AttentionDesc& d) {
  return mkv_params::kv_slot_bytes(d.k_format, 1, d.head_dim) + mkv_params::kv_slot_bytes(d.v_format, 1, d.head_dim);
}


// Checks shared by decode and prefill; returns the visible key positions of
// the whole call (all queries together).
uint32_t validate_desc(const char* op, const AttentionDesc& d) {
  if (!attention_head_dim_supported(d.head_dim))
    fail(op, "head_dim " + num(d.head_dim) + " is not supported; expected " +
                 attention_head_dims_text());
  if (d.n_q_heads == 0 || d.n_kv_heads == 0)
    fail(op, "n_q_heads (" + num(d.n_q_heads) + ") and n_kv_heads (" + num(d.n_kv_heads) +
                 ") must both be at least 1");
  if (d.n_q_heads % d.n_kv_heads != 0)
    fail(op, "n_q_heads " + num(d.n_q_heads) + " is not a multiple of n_kv_heads " +
                 num(d.n_kv_heads) + "; each KV head serves n_q_heads / n_kv_heads query heads");
  if (d.n_queries == 0 || (d.n_tokens != 0 && d.n_queries > d.n_tokens))
    fail(op, "n_queries " + num(d.n_queries) + " must be between 1 and n_tokens " +
                 num(d.n_tokens) + " (the cache holds the queries' own keys)");
  if (d.n_tokens == 0)
    fail(op, "n_tokens is 0; the cache must hold at least the query's own key");
  if (d.slots == 0) fail(op, "slots is 0; the layer's cache has no capacity");
  if (!std::isfinite(d.scale) || d.scale <= 0.0f)
    fail(op, "scale " + std::to_string(d.scale) + " must be finite and > 0 (usually 1/sqrt(head_dim))");
  if (!std::isfinite(d.softcap) || d.softcap < 0.0f)
    fail(op, "softcap " + std::to_string(d.softcap) + " must be finite and >= 0 (0 = off)");
  for (uint32_t f : {d.k_format, d.v_format})
    if (!mkv_params::kv_format_fits(f, d.head_dim))
      fail(op, "KV format " + num(f) + " cannot be read at head_dim " + num(d.head_dim) +
                   " (0 = f16 fits every head_dim; the quantized formats take 32, 64 or a multiple of 64)");
  constexpr uint32_t B = mkv_params::kKvBlockTokens;
  if (d.residual) {
    if (!mkv_params::kv_format_fits(mkv_params::kKvQ8, d.head_dim))
      fail(op, "a residual window is read by the kvq kernels, which take head_dim 32, 64 or a multiple of 64, not " +
                   num(d.head_dim));
    if (d.residual % B != 0)
      fail(op, "residual " + num(d.residual) + " is not a multiple of the block size " + num(B));
    if (d.ring_lo > d.n_tokens - d.n_queries)
      fail(op, "ring_lo " + num(d.ring_lo) + " is past the first query's position " + num(d.n_tokens - d.n_queries) +
                   " (the ring holds the rows of positions ring_lo .. n_tokens - 1)");
    if (uint64_t(d.n_tokens) - d.ring_lo > d.ring_slots ||
        uint64_t(d.n_tokens) - std::min<uint64_t>(mkv_params::attn_ring_start(d.n_tokens - d.n_queries, d.residual,
                                                                              d.ring_lo), d.n_tokens) > d.ring_slots)
      fail(op, "the ring's " + num(d.ring_slots) + " slots cannot hold the window of positions from " +
                   num(mkv_params::attn_ring_start(d.n_tokens - d.n_queries, d.residual, d.ring_lo)) + " to " +
                   num(d.n_tokens - 1));
  } else if (d.ring.buffer || d.ring_slots || d.ring_lo) {
    fail(op, "ring, ring_slots and ring_lo need a residual window (residual > 0)");
  }
  if (d.slots % B != 0)
    fail(op, "slots " + num(d.slots) + " is not a multiple of the block size " + num(B) +
                 " (a pool holds whole blocks)");
  // Positions from the first query's window start to the last query.
  const uint64_t first_q = d.n_tokens - d.n_queries;
  const uint64_t lo = d.window > 0 && first_q + 1 > d.window ? first_q + 1 - d.window : 0;
  const uint64_t visible = d.n_tokens - lo;
  return uint32_t(visible);
}

void check_view(const char* op, const char* what, const BufferView& v, uint64_t bytes,
                size_t align) {
  if (!v.buffer) fail(op, std::string(what) + " buffer is missing (" + num(bytes) + " bytes needed)");
  if (v.offset % align != 0)
    fail(op, std::string(what) + " offset " + num(v.offset) + " is not a multiple of " + num(align));
  const size_t length = v.buffer->length();
  if (v.offset > length || bytes > length - v.offset)
    fail(op, std::string(what) + " needs " + num(bytes) + " bytes at offset " + num(v.offset) +
                 " but the buffer has " + num(length));
}

void check_common_views(const char* op, const AttentionDesc& d, const BufferView& kv,
                        const BufferView& table, const BufferView& sinks) {
  const uint64_t kv_bytes = uint64_t(d.slots) * (mkv_params::kv_slot_bytes(d.k_format, d.n_kv_heads, d.head_dim) +
                                                  mkv_params::kv_slot_bytes(d.v_format, d.n_kv_heads, d.head_dim));
  if (kv_bytes >= (uint64_t(1) << 32)) fail(op, "the pool has 2^32 bytes or more; the kernels address it with 32 bits");
  check_view(op, "kv", kv, kv_bytes, 8);
  check_view(op, "table (uint32 per block of positions)", table,
             uint64_t(ceil_div(d.n_tokens, mkv_params::kKvBlockTokens)) * 4, 4);
  if (d.has_sinks) check_view(op, "sinks", sinks, uint64_t(d.n_q_heads) * 4, 4);
  else if (sinks.buffer)
    fail(op, "a sinks buffer was given but has_sinks is false");
  if (d.residual) check_view(op, "ring (K then V, ring_slots rows of f16 each)", d.ring,
                             uint64_t(d.ring_slots) * 2 * d.n_kv_heads * d.head_dim * 2, 16);
}

// What buffer 6 gets: the ring, or (no window) the pool, which the kernel then never reads.
const BufferView& ring_or(const AttentionDesc& d, const BufferView& kv) { return d.residual ? d.ring : kv; }

// The fields decode's and prefill's arguments share: how keys are scaled, capped, stored and
// windowed, and whether the probabilities are written out.
template <class Params>
void set_key_fields(Params& p, const AttentionDesc& d) {
  p.scale = d.scale;
  p.softcap = d.softcap;
  p.has_sinks = d.has_sinks ? 1 : 0;
  p.k_format = d.k_format;
  p.v_format = d.v_format;
  p.residual = d.residual;
  p.ring_slots = d.ring_slots;
  p.ring_lo = d.ring_lo;
  p.logits = d.logits.buffer ? 1 : 0;
}

// Prefill's bidirectional blocks into its arguments, checked.
void set_blocks(const char* op, mkv_params::AttnPrefill& p, const AttentionDesc& d) {
  if (d.blocks.size() > mkv_params::kAttnMaxBlocks)
    fail(op, num(uint32_t(d.blocks.size())) + " bidirectional blocks; a call takes at most " +
                 num(mkv_params::kAttnMaxBlocks));
  if (!d.blocks.empty() && d.logits.buffer)
    fail(op, "a policy's logits (h2o, snapkv) cannot be scored over bidirectional blocks");
  uint32_t end = 0;
  for (size_t i = 0; i < d.blocks.size(); ++i) {
    const AttentionBlock& b = d.blocks[i];
    if (b.lo >= b.hi || b.lo < end || b.hi > d.n_tokens)
      fail(op, "bidirectional block " + num(uint32_t(i)) + " [" + num(b.lo) + ", " + num(b.hi) +
                   ") is empty, overlaps the one before, or ends past n_tokens " + num(d.n_tokens) +
                   " (its keys must all be stored)");
    end = b.hi;
    p.block_lo[i] = b.lo;
    p.block_hi[i] = b.hi;
  }
  p.n_blocks = uint32_t(d.blocks.size());
}

// Query heads of one KV head, split into blocks of at most max_rows.
void head_blocks(uint32_t group, uint32_t max_rows, uint32_t& per_block, uint32_t& blocks) {
  blocks = (group + max_rows - 1) / max_rows;
  per_block = (group + blocks - 1) / blocks;
}

}  // namespace

bool attention_head_dim_supported(uint32_t head_dim) {
  return std::find(std::begin(kAttnHeadDims), std::end(kAttnHeadDims), head_dim) !=
         std::end(kAttnHeadDims);
}

std::vector<uint32_t> attention_head_dims() {
  return {std::begin(kAttnHeadDims), std::end(kAttnHeadDims)};
}

std::string attention_head_dims_text() {
  std::string s;
  const size_t n = std::size(kAttnHeadDims);
  for (size_t i = 0; i < n; ++i)
    s += (i == 0 ? "" : i + 1 == n ? " or " : ", ") + num(kAttnHeadDims[i]);
  return s;
}

std::string attention_kernel_name(const char* family, uint32_t head_dim) {
  return std::string(family) + "_d" + num(head_dim);
}

namespace {

// Chunks of `n_keys` that fill one wave of `wave` threadgroups given `base`
// threadgroups per chunk, none shorter than kAttnMinChunkKeys (attention.h).
uint32_t wave_chunks(uint32_t n_keys, uint32_t base, uint32_t wave) {
  return std::min({wave / base, n_keys / kAttnMinChunkKeys, mkv_params::kAttnDecodeMaxChunks});
}

const char* const kDecodeOp = "attention_decode";

// Validates d for decode; returns the visible keys and sets the head blocks.
uint32_t decode_shape(const AttentionDesc& d, uint32_t& per_block, uint32_t& blocks) {
  if (d.n_queries != 1)
    fail(kDecodeOp, "n_queries is " + num(d.n_queries) + "; decode takes one query per head "
                    "(use attention_prefill for more)");
  const uint32_t n_keys = validate_desc(kDecodeOp, d);
  if (d.half_operands) fail(kDecodeOp, "half_operands applies to attention_prefill only");
  head_blocks(d.n_q_heads / d.n_kv_heads, mkv_params::attn_decode_rows(d.head_dim), per_block, blocks);
  if (d.split_chunks != 0 && d.split != AttentionSplit::always)
    fail(kDecodeOp, "split_chunks " + num(d.split_chunks) + " applies only with split 'always'");
  if (d.split_chunks > mkv_params::kAttnDecodeMaxChunks)
    fail(kDecodeOp, "split_chunks " + num(d.split_chunks) + " is more than the " +
                        num(mkv_params::kAttnDecodeMaxChunks) + " chunks the reduce merges");
  return n_keys;
}

// Whether decode runs the host executor's shape (metal/attention_decode_host.metal,
// the _h kernels): the default where lanes are fibers (DeviceProperties), never
// elsewhere; decode_variant "gpu" (or "nopf") asks for the GPU shape, "host" for
// the host's (only where the library has it). dev: the device the call runs on,
// or nullptr for a plan without one.
bool decode_host_shape(const AttentionDesc& d, const gpu::Device* dev) {
  const std::string& v = d.decode_variant;
  if (v.empty()) return dev && picks_host_shapes(dev->properties());
  if (v == "gpu" || v == "nopf") return false;
  if (v != "host")
    fail(kDecodeOp, "decode_variant '" + v + "' is not one of '' (the device's shape), 'gpu', 'host' or 'nopf'");
  if (dev && !dev->properties().has_host_shapes)
    fail(kDecodeOp, "decode_variant 'host' is the host executor's shape, not built for " + dev->kind());
  return true;
}

// Prefill's kernel shape, from prefill_variant: the GPU's SIMD shape, the host
// executor's (metal/attention_prefill_host.metal) or matrix units
// (metal/attention_prefill_mma.h); '' is the device's own.
enum class PrefillShape { gpu, host, mma };

PrefillShape prefill_shape(const char* op, const AttentionDesc& d, const gpu::Device& dev) {
  const std::string& v = d.prefill_variant;
  const gpu::DeviceProperties props = dev.properties();
  if (v.empty())
    return props.matrix_units ? PrefillShape::mma : picks_host_shapes(props) ? PrefillShape::host : PrefillShape::gpu;
  if (v == "gpu") return PrefillShape::gpu;
  if (v == "mma") return PrefillShape::mma;
  if (v != "host")
    fail(op, "prefill_variant '" + v + "' is not one of '' (the device's shape), 'gpu', 'host' or 'mma'");
  if (!props.has_host_shapes)
    fail(op, "prefill_variant 'host' is the host executor's shape, not built for " + dev.kind());
  return PrefillShape::host;
}

size_t scratch_for(const AttentionDesc& d, uint32_t chunks) {
  return size_t(d.n_q_heads) * chunks * (d.head_dim + 2) * sizeof(float);
}

// Whether the host's rows form may run d (the device picks the host shape):
// no variant asked for, not split (the caller's check). It reads every format
// pair and residual window the host's _h kernels do (f16, or kvq).
bool rows_form_applies(const AttentionDesc& d) { return d.decode_variant.empty(); }

AttentionDecodePlan decode_plan(const AttentionDesc& d, uint32_t wave, const gpu::Device* dev) {
  AttentionDecodePlan plan;
  const bool host = decode_host_shape(d, dev);
  plan.n_keys = decode_shape(d, plan.heads_per_block, plan.head_blocks);
  plan.wave = std::max(wave, 1u);

  const uint32_t base = d.n_kv_heads * plan.head_blocks;  // threadgroups without split
  const uint32_t fill = wave_chunks(plan.n_keys, base, plan.wave);
  uint32_t chunks = 1;
  if (d.split == AttentionSplit::automatic) {
    if (plan.n_keys >= kAttnSplitMinKeys && fill >= 2) chunks = fill;
  } else if (d.split == AttentionSplit::always) {
    chunks = d.split_chunks ? d.split_chunks : std::max(2u, fill);
  }
  chunks = std::clamp(chunks, 1u, plan.n_keys);
  plan.split = d.split == AttentionSplit::always || chunks > 1;
  plan.chunk_keys = ceil_div(plan.n_keys, chunks);
  plan.n_chunks = ceil_div(plan.n_keys, plan.chunk_keys);  // no empty chunk
  plan.threadgroups = base * plan.n_chunks;
  plan.kernel = attention_decode_kernel(attention_name_key(d), plan.split, plan.heads_per_block, host);
  plan.threads = host ? kHostThreads : plan.split ? kSplitThreads : kThreads;
  if (plan.split) plan.scratch_bytes = scratch_for(d, plan.n_chunks);
  plan.kv_bytes_visible = uint64_t(d.n_kv_heads) * plan.n_keys * kv_head_bytes(d);
  plan.kv_bytes_read = plan.kv_bytes_visible * plan.head_blocks;
  // The device's own shape on the host, where the rows form applies: the same
  // bits without the rendezvous (metal/attention_decode_rows.h). A threadgroup
  // is one thread with a block of up to attn_decode_rows_heads(D) query heads
  // of one KV head, which converts each K/V row once for all of them, and one
  // part of the lane groups (kAttnDecodeRowsParts: more threadgroups than the
  // executor's threads); a second kernel merges the parts. "host" keeps the
  // SIMD-group kernels.
  if (host && rows_form_applies(d) && !plan.split) {
    plan.rows = true;
    plan.kernel = attention_decode_rows_kernel(attention_name_key(d));
    head_blocks(d.n_q_heads / d.n_kv_heads, mkv_params::attn_decode_rows_heads(d.head_dim), plan.heads_per_block,
                plan.head_blocks);
    plan.threadgroups = d.n_kv_heads * plan.head_blocks * mkv_params::kAttnDecodeRowsParts;
    plan.threads = 1;
    plan.scratch_bytes = scratch_for(d, mkv_params::kAttnDecodeRowsParts);
    plan.kv_bytes_read = plan.kv_bytes_visible * plan.head_blocks;
  }
  return plan;
}

}  // namespace

AttentionDecodePlan attention_decode_plan(const AttentionDesc& d, uint32_t wave) {
  return decode_plan(d, wave, nullptr);
}

AttentionDecodePlan attention_decode_plan(gpu::Device& dev, const AttentionDesc& d) {
  uint32_t per_block = 0, blocks = 0;
  decode_shape(d, per_block, blocks);
  const bool host = decode_host_shape(d, &dev);
  const gpu::PipelinePtr split = dev.pipeline(attention_decode_kernel(attention_name_key(d), true, per_block, host));
  // device_wave is cheap per call: the CUDA pipeline keeps its occupancy answers.
  return decode_plan(d, device_wave(dev, *split, host ? kHostThreads : kSplitThreads), &dev);
}

size_t attention_decode_scratch_bytes(const AttentionDesc& d) {
  uint32_t per_block = 0, blocks = 0;
  const uint32_t n_keys = decode_shape(d, per_block, blocks);
  // The most chunks attention_decode_plan picks for any wave.
  const uint32_t most = std::min(n_keys / kAttnMinChunkKeys, mkv_params::kAttnDecodeMaxChunks);
  uint32_t chunks = 0;
  if (d.split == AttentionSplit::automatic) chunks = n_keys >= kAttnSplitMinKeys && most >= 2 ? most : 0;
  else if (d.split == AttentionSplit::always) chunks = d.split_chunks ? d.split_chunks : std::max(2u, most);
  // The host's rows form (any device: this bound does not know which) keeps its parts' states.
  const uint32_t parts = d.split != AttentionSplit::always && rows_form_applies(d) ? mkv_params::kAttnDecodeRowsParts : 0;
  return scratch_for(d, std::max(std::min(chunks, n_keys), parts));
}

void attention_decode(gpu::Device& dev, gpu::ComputeEncoder& enc, const AttentionDesc& d,
                      const BufferView& q, const BufferView& kv, const BufferView& table,
                      const BufferView& out, const BufferView& sinks, const BufferView& scratch) {
  const char* op = kDecodeOp;
  if (!d.blocks.empty()) fail(op, "bidirectional blocks are prefill's (a decode query sees the keys before it)");
  const AttentionDecodePlan plan = attention_decode_plan(dev, d);
  const uint64_t head_bytes = uint64_t(d.n_q_heads) * d.head_dim * 4;
  check_view(op, "q", q, head_bytes, 4);
  check_view(op, "out", out, head_bytes, 4);
  check_common_views(op, d, kv, table, sinks);
  if (kv.offset % 16 != 0)
    fail(op, "kv offset " + num(kv.offset) + " is not a multiple of 16 (decode reads rows in 16-byte pieces)");

  mkv_params::AttnDecode p{};
  p.n_q_heads = d.n_q_heads;
  p.n_kv_heads = d.n_kv_heads;
  p.group_size = d.n_q_heads / d.n_kv_heads;
  p.heads_per_block = plan.heads_per_block;
  p.head_blocks = plan.head_blocks;
  p.n_tokens = d.n_tokens;
  p.slots = d.slots;
  p.window = d.window;
  p.chunk_keys = plan.chunk_keys;
  p.n_chunks = plan.n_chunks;
  set_key_fields(p, d);
  if (p.logits) check_view(op, "logits (n_q_heads, n_tokens) float", d.logits, uint64_t(d.n_q_heads) * d.n_tokens * 4, 4);
  const BufferView& sinks_or_q = d.has_sinks ? sinks : q;  // every argument must be bound
  const gpu::Size3 grid{d.n_kv_heads * plan.head_blocks, plan.n_chunks, 1};

  enc.set_pipeline(dev.pipeline(plan.kernel));
  bind_params(enc, p, 0);
  bind(enc, q, 1);
  bind(enc, kv, 2);
  bind(enc, table, 5);
  bind(enc, ring_or(d, kv), 6);
  bind(enc, p.logits ? d.logits : out, 7);
  if (plan.rows) {  // the parts' states, then their merge and the finish
    check_view(op, "scratch (attention_decode_scratch_bytes)", scratch, plan.scratch_bytes, 16);
    bind(enc, sinks_or_q, 3);
    bind(enc, out, 4);
    bind(enc, scratch, 7);
    bind(enc, p.logits ? d.logits : scratch, 8);  // unused without logits
    enc.dispatch_threadgroups({grid.x, mkv_params::kAttnDecodeRowsParts, 1}, {plan.threads, 1, 1});
    enc.set_pipeline(dev.pipeline(attention_decode_rows_merge_kernel(d.head_dim)));
    bind_params(enc, p, 0);
    bind(enc, scratch, 1);
    bind(enc, d.has_sinks ? sinks : scratch, 2);
    bind(enc, out, 3);
    enc.dispatch_threadgroups({d.n_q_heads, 1, 1}, {1, 1, 1});
    return;
  }
  if (!plan.split) {
    bind(enc, sinks_or_q, 3);
    bind(enc, out, 4);
    enc.dispatch_threadgroups(grid, {plan.threads, 1, 1});
    return;
  }
  // Split-K: partial acc (n_q_heads, n_chunks, D), then (m, l) (n_q_heads, n_chunks, 2).
  check_view(op, "scratch (attention_decode_scratch_bytes)", scratch, plan.scratch_bytes, 16);
  const BufferView part_o = scratch;
  const BufferView part_ml{scratch.buffer,
                           scratch.offset + size_t(d.n_q_heads) * plan.n_chunks * d.head_dim * 4};
  bind(enc, part_o, 3);
  bind(enc, part_ml, 4);
  enc.dispatch_threadgroups(grid, {plan.threads, 1, 1});

  const mkv_params::AttnDecodeReduce r{d.n_q_heads, plan.n_chunks, p.has_sinks};
  enc.set_pipeline(dev.pipeline(attention_reduce_kernel(d.head_dim)));
  bind_params(enc, r, 0);
  bind(enc, part_o, 1);
  bind(enc, part_ml, 2);
  bind(enc, d.has_sinks ? sinks : part_o, 3);
  bind(enc, out, 4);
  enc.set_threadgroup_memory_length(mkv_params::kAttnReduceTgFloats * sizeof(float), 0);
  enc.dispatch_threadgroups({d.n_q_heads, 1, 1}, {mkv_params::kAttnReduceThreads, 1, 1});
}

void attention_prefill(gpu::Device& dev, gpu::ComputeEncoder& enc, const AttentionDesc& d,
                       const BufferView& q, const BufferView& kv, const BufferView& table,
                       const BufferView& out, const BufferView& sinks) {
  const char* op = "attention_prefill";
  validate_desc(op, d);
  if (d.split != AttentionSplit::automatic || d.split_chunks != 0 || !d.decode_variant.empty())
    fail(op, "split, split_chunks and decode_variant apply to attention_decode only");
  if (d.half_operands && (d.k_format != mkv_params::kKvF16 || d.v_format != mkv_params::kKvF16 || d.residual != 0 ||
                          d.logits.buffer))
    fail(op, "half_operands is built for f16 K and V without a residual window or logits");
  const PrefillShape shape = prefill_shape(op, d, dev);
  const bool host = shape == PrefillShape::host, mma = shape == PrefillShape::mma;
  const uint64_t bytes = uint64_t(d.n_queries) * d.n_q_heads * d.head_dim * 4;
  check_view(op, "q", q, bytes, 4);
  check_view(op, "out", out, bytes, 4);
  check_common_views(op, d, kv, table, sinks);

  // GPU shape: all rows of a threadgroup share its staged K/V tiles, as many
  // heads of the group as fit, the rest of the rows for more query positions.
  // Host shape: a lane is one query with up to attn_prefill_host_rows heads.
  // Matrix units: blocks of 8 positions of one head, as many heads as there
  // are blocks, the rest of the blocks for more positions.
  const uint32_t mma_blocks =
      mkv_params::kAttnMmaSimdgroups * mkv_params::attn_prefill_mma_blocks(d.head_dim, d.half_operands);
  const uint32_t rows = host  ? mkv_params::attn_prefill_host_rows(d.head_dim)
                        : mma ? mma_blocks
                              : mkv_params::kAttnSimdgroups * mkv_params::attn_rows_per_simdgroup(d.head_dim);
  mkv_params::AttnPrefill p{};
  p.n_q_heads = d.n_q_heads;
  p.n_kv_heads = d.n_kv_heads;
  p.group_size = d.n_q_heads / d.n_kv_heads;
  head_blocks(p.group_size, rows, p.heads_per_block, p.head_blocks);
  p.n_queries = d.n_queries;
  p.q_pos0 = d.n_tokens - d.n_queries;
  p.queries_per_tile = host  ? mkv_params::kAttnPrefillHostQueries
                       : mma ? 8 * (mma_blocks / p.heads_per_block)
                             : rows / p.heads_per_block;
  p.slots = d.slots;
  p.window = d.window;
  set_key_fields(p, d);
  set_blocks(op, p, d);
  if (p.logits)
    check_view(op, "logits (n_queries, n_q_heads, n_tokens) float", d.logits,
               uint64_t(d.n_queries) * d.n_q_heads * d.n_tokens * 4, 4);

  enc.set_pipeline(dev.pipeline(mma ? attention_prefill_mma_kernel(attention_name_key(d))
                                    : attention_prefill_kernel(attention_name_key(d), host)));
  bind_params(enc, p, 0);
  bind(enc, q, 1);
  bind(enc, kv, 2);
  bind(enc, d.has_sinks ? sinks : q, 3);
  bind(enc, out, 4);
  bind(enc, table, 5);
  bind(enc, ring_or(d, kv), 6);
  bind(enc, p.logits ? d.logits : out, 7);
  enc.dispatch_threadgroups({ceil_div(d.n_queries, p.queries_per_tile), d.n_kv_heads * p.head_blocks, 1},
                            {host  ? mkv_params::kAttnPrefillHostQueries
                             : mma ? mkv_params::kAttnMmaSimdgroups * 32
                                   : kThreads,
                             1, 1});
}

}  // namespace mkv::ops
