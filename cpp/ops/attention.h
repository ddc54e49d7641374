// Attention ops over one layer's KV cache: decode (one query per head, single
// pass or flash-decoding split-K) and prefill (many queries, tiled).
//
// Cache layout (cpp/kv builds it): a layer's pool of `slots` slots, its K
// section then its V section, each f16 (slots, n_kv_heads, head_dim) or
// quantized (metal/kv_format.h), cut into blocks of kKvBlockTokens (B) slots;
// the sequence's block table (uint32) names the block of each B positions:
// position p sits in slot table[p / B] * B + p % B. Only the entries of
// positions the queries see are read, and the caller guarantees they name
// blocks of the pool (kv::BlockTable does). Masks are by position: causal, and
// for a sliding window W > 0 key pos > query pos - W. Kernels: metal/attention_*.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "metal/attention_variants.h"
#include "ops/ops.h"

namespace mkv::ops {

enum class AttentionSplit { automatic, never, always };

// The head_dims the attention kernels are instantiated for: the kernels'
// own list (MKV_ATTN_HEAD_DIMS, metal/attention_variants.h), read by the op's
// check, the model's check and Python (metalkv._core.ops.attention_head_dims()).
// Each is a multiple of 8 (decode reads rows in 16-byte pieces) and at most 256
// (threads per threadgroup).
#define MKV_ATTN_HEAD_DIM_ITEM(D, unused) D,
inline constexpr uint32_t kAttnHeadDims[] = {MKV_ATTN_HEAD_DIMS(MKV_ATTN_HEAD_DIM_ITEM, )};
#undef MKV_ATTN_HEAD_DIM_ITEM

bool attention_head_dim_supported(uint32_t head_dim);
std::vector<uint32_t> attention_head_dims();
// "32, 64, ... or 256", for error messages.
std::string attention_head_dims_text();

// A bidirectional block of positions [lo, hi) (AttentionDesc::blocks).
struct AttentionBlock {
  uint32_t lo = 0, hi = 0;
};

struct AttentionDesc {
  uint32_t n_q_heads = 0;
  uint32_t n_kv_heads = 0;   // divides n_q_heads (1: MQA)
  uint32_t head_dim = 0;     // one of kAttnHeadDims
  uint32_t n_tokens = 0;     // tokens stored in the layer, the new ones included
  uint32_t n_queries = 1;    // queries at positions n_tokens - n_queries .. n_tokens - 1 (decode: 1)
  uint32_t slots = 0;        // rows of the layer's pool, a multiple of kKvBlockTokens
  uint32_t window = 0;       // sliding window W; 0 = full attention
  float scale = 0.0f;        // multiplies q.k; usually 1 / sqrt(head_dim)
  float softcap = 0.0f;      // Gemma 2 logit soft-capping c: s = c * tanh(s / c); 0 = off
  bool has_sinks = false;    // sinks: per-query-head logit of a zero-value virtual key (gpt-oss)
  AttentionSplit split = AttentionSplit::automatic;  // decode only
  uint32_t split_chunks = 0;  // decode with split == always: chunks (0: the rule, >= 2; <= 512)
  // Decode: the kernels' shape or a compile-time variant: "" (the device's
  // shape: the host executor's _h kernels on the host, the GPU shape
  // elsewhere), "gpu" (the GPU shape, also on the host: how the host
  // validates what a GPU runs), "host" (the host's shape; the host only) or
  // "nopf" (the GPU shape without prefetch, for benchmarks: a block's loads
  // wait for the previous block's math; D = 128).
  std::string decode_variant;
  // Prefill: the kernels' shape, "" (the device's: matrix units where it
  // reports them, the host executor's _h kernels of
  // metal/attention_prefill_host.metal on the host, the GPU shape elsewhere),
  // "gpu" (the GPU's SIMD shape, also on the host), "host" (the host only) or
  // "mma" (simdgroup_matrix, metal/attention_prefill_mma.h, on any device).
  std::string prefill_variant;
  // Prefill on matrix units (the mma shape): Q rounded to half as it is loaded
  // and the softmax's P as it is formed, so Q·Kᵀ and P·V run as half x half
  // products with float sums (attn_prefill_mma_f16_dD_half; flash attention's
  // and llama.cpp's practice). f16 K/V only, no residual window, no logits;
  // other shapes compute in float as always. The towers' choice (SiglipSpec::
  // operands_16bit).
  bool half_operands = false;
  // The formats of the pool's K and V sections (metal/kv_format.h:
  // mkv_params::kKvF16, kKvQ8, kKvQ4, kKvQ2K for K, kKvQ2V for V). Any
  // quantized one runs the _kvq kernels (or a fixed pair's), which exist for
  // the head_dims kv_format_fits accepts.
  uint32_t k_format = 0;
  uint32_t v_format = 0;
  // A residual window (kv::KvCacheSpec::residual): the query at position p
  // reads keys from S(p) = max(ring_lo, floor((p + 1 - residual) / B) * B)
  // on as f16 rows of `ring` (K (ring_slots, n_kv_heads, head_dim) half,
  // then V; position at slot position % ring_slots), the ones before from the
  // pool. residual 0: none. Runs the _kvq kernels (decode: their _res form).
  uint32_t residual = 0;
  uint32_t ring_slots = 0;
  uint32_t ring_lo = 0;
  BufferView ring;
  // An eviction policy's logits (kv/kv_policy.h): when set, the kernels also
  // write every visible key's scaled logit here, (n_queries, n_q_heads,
  // n_tokens) float (decode: log2 domain, prefill: natural), for
  // attention_scores. Empty: not written (nothing else changes).
  BufferView logits;
  // Prefill: bidirectional blocks, sorted, disjoint, at most kAttnMaxBlocks
  // (metal/attention_params.h), each ending at or before n_tokens: a query in
  // one sees every key of its block, the later ones too (Gemma 3's image
  // tokens; a vision tower's whole sequence). Decode, and a policy's logits,
  // take none.
  std::vector<AttentionBlock> blocks;
};

// Flash-decoding split-K, from the device. One threadgroup per (KV head,
// head block) gives base = n_kv_heads * head_blocks threadgroups, which leaves
// most of a GPU idle for small n_kv_heads (Llama-3-8B: 8; an H200 holds ~396
// split threadgroups at once, 132 SMs x 3). The device's wave (ops::device_wave:
// compute units x resident threadgroups of the split kernel per unit) sets
// the chunk count:
//   chunks = min(wave / base, n_keys / kAttnMinChunkKeys, kAttnDecodeMaxChunks)
// i.e. one wave of equal chunks (all start together and end together, so no
// tail), but no chunk shorter than kAttnMinChunkKeys keys (a chunk pays its
// threadgroup's q load and merge and writes (D + 2) floats per query head,
// which only hundreds of keys amortise). split = automatic splits only when
// that gives >= 2 chunks and n_keys >= kAttnSplitMinKeys: below it one pass
// over a few hundred keys costs less than the reduce's second dispatch, and
// with base >= wave the device is full already.
inline constexpr uint32_t kAttnMinChunkKeys = 128;
inline constexpr uint32_t kAttnSplitMinKeys = 512;

// How attention_decode will run a given desc (validated).
struct AttentionDecodePlan {
  std::string kernel;          // first (or only) kernel
  bool split = false;          // split-K: partials + attn_decode_reduce_*
  uint32_t n_keys = 0;         // visible key positions
  uint32_t heads_per_block = 0;
  uint32_t head_blocks = 0;    // threadgroups per KV head along the heads
  uint32_t n_chunks = 1;
  uint32_t chunk_keys = 0;
  uint32_t threadgroups = 0;   // of the first kernel
  uint32_t threads = 0;        // per threadgroup of the first kernel (the shape's SIMD-groups x 32)
  uint32_t wave = 0;           // threadgroups of the split kernel the device runs at once
  size_t scratch_bytes = 0;    // 0 unless split or rows
  bool rows = false;           // the host's rows form: parts + attn_decode_rows_merge_*
  // K/V bytes loaded per step, from the kernel's access pattern: each
  // (KV head, head block, chunk) threadgroup loads the K and V rows of its
  // chunk once and chunks partition the visible range, so read =
  // head_blocks * n_kv_heads * n_keys * (bytes of one head's K row + V row,
  // codes and group parameters: 4 * head_dim in f16).
  uint64_t kv_bytes_read = 0;
  uint64_t kv_bytes_visible = 0;  // the same with head_blocks = 1: each byte once
};

// The plan on `dev` (its wave from ops::device_wave), or for a given wave.
AttentionDecodePlan attention_decode_plan(gpu::Device& dev, const AttentionDesc& d);
AttentionDecodePlan attention_decode_plan(const AttentionDesc& d, uint32_t wave);

// Scratch attention_decode needs for d on any device: the partials of the
// most chunks the rule can choose (0 when it never splits d). Grows with
// n_tokens, so the value at the longest context bounds every shorter one.
size_t attention_decode_scratch_bytes(const AttentionDesc& d);

// out (n_q_heads, head_dim) f32 = attention of q (n_q_heads, head_dim) f32 at
// position n_tokens - 1 over kv through table (ceil(n_tokens / B) uint32).
// sinks: (n_q_heads) f32 iff d.has_sinks, else an empty view. scratch:
// attention_decode_scratch_bytes(d) bytes (may be empty when that is 0),
// offset a multiple of 16. Encodes one dispatch, or two for split-K.
void attention_decode(gpu::Device& dev, gpu::ComputeEncoder& enc, const AttentionDesc& d,
                      const BufferView& q, const BufferView& kv, const BufferView& table,
                      const BufferView& out, const BufferView& sinks, const BufferView& scratch);

// out (n_queries, n_q_heads, head_dim) f32 = attention of q (n_queries,
// n_q_heads, head_dim) f32 at positions n_tokens - n_queries .. n_tokens - 1,
// whose keys kv already holds, through table as for decode.
void attention_prefill(gpu::Device& dev, gpu::ComputeEncoder& enc, const AttentionDesc& d,
                       const BufferView& q, const BufferView& kv, const BufferView& table,
                       const BufferView& out, const BufferView& sinks);

// An eviction policy's scores from the logits d.logits received (the same
// d, after attention_decode or attention_prefill): adds to scores
// (n_kv_heads, score_stride) float each key's attention probability summed
// over the query rows from row_lo and the query heads of its KV head.
// scratch: n_queries * n_q_heads * 2 floats. Kernels attn_scores_stats (or
// attn_scores_stats_h, the host's one-thread form) and attn_scores_add
// (metal/attention_scores.metal). accumulate false: writes the sums instead
// of adding them (a verified row's share, for attention_scores_apply once the
// step's kept rows are known).
void attention_scores(gpu::Device& dev, gpu::ComputeEncoder& enc, const AttentionDesc& d, uint32_t row_lo,
                      const BufferView& scores, uint32_t score_stride, const BufferView& scratch,
                      bool accumulate = true);

// The shares a verified segment's rows wrote (attention_scores, accumulate
// false; (rows, n_kv_heads, share_stride) float, rows row_stride floats
// apart) added to scores (n_kv_heads, score_stride) in row order, only rows
// whose bit is set in row_mask; row r saw keys + r keys. Kernel attn_scores_apply.
struct ScoresApplyDesc {
  uint32_t n_kv_heads = 0, keys = 0, rows = 0, row_mask = 0;
  uint32_t row_stride = 0, share_stride = 0, score_stride = 0;
};
void attention_scores_apply(gpu::Device& dev, gpu::ComputeEncoder& enc, const ScoresApplyDesc& d,
                            const BufferView& shares, const BufferView& scores);

// Kernel names, built in one place: attn_decode_f16_d128, ...
std::string attention_kernel_name(const char* family, uint32_t head_dim);

// Every kernel name the attention ops (decode, its reduce, prefill, scores)
// can build on `dev`, whatever the descriptor: each must be in the device's
// library (tests/gpu/test_kernel_names.py).
std::vector<std::string> attention_kernel_names(gpu::Device& dev);

}  // namespace mkv::ops
