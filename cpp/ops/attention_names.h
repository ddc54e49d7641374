// Attention kernel names, built from the kernels' own variant lists
// (metal/attention_variants.h): the one place that turns a descriptor into a
// kernel name, and the list of every name it can build (attention_kernel_names
// in attention.h), which tests/gpu/test_kernel_names.py holds against each
// device's library. Internal to cpp/ops.
#pragma once

#include <cstdint>
#include <string>

#include "ops/attention.h"

namespace mkv::ops {

// What a kernel name depends on: a descriptor's share of it.
struct AttnNameKey {
  uint32_t head_dim = 0, k_format = 0, v_format = 0;
  bool residual = false, logits = false;
  std::string decode_variant;
  bool half_operands = false;  // prefill on matrix units: Q and P in half
};
AttnNameKey attention_name_key(const AttentionDesc& d);

// The first kernel of a decode call (split: the split-K first pass), for a head
// block of per_block query heads, in the host executor's shape or the GPU's.
// Raises "[attention_decode] ..." for a variant that does not exist.
std::string attention_decode_kernel(const AttnNameKey& k, bool split, uint32_t per_block, bool host);
// The host executor's collective-free decode (metal/attention_decode_rows.metal):
// single pass, f16 K/V or (kvq) any formats with or without a residual window;
// bit-identical to the _h kernels of the same family. The first kernel's parts,
// then their merge and the finish.
std::string attention_decode_rows_kernel(const AttnNameKey& k);
std::string attention_decode_rows_merge_kernel(uint32_t head_dim);
// The split-K second pass.
std::string attention_reduce_kernel(uint32_t head_dim);
// Prefill's kernel, in the host executor's shape (host: "_h") or the GPU's.
std::string attention_prefill_kernel(const AttnNameKey& k, bool host);
// attn_prefill_mma_<family>_dD[_half]: prefill on matrix units (metal/attention_prefill_mma.h).
std::string attention_prefill_mma_kernel(const AttnNameKey& k);
// attention_scores' two kernels and attention_scores_apply's (metal/attention_scores.metal).
inline constexpr const char* kAttnScoresStatsKernel = "attn_scores_stats";
inline constexpr const char* kAttnScoresStatsHostKernel = "attn_scores_stats_h";  // built with the host shapes
inline constexpr const char* kAttnScoresAddKernel = "attn_scores_add";
inline constexpr const char* kAttnScoresApplyKernel = "attn_scores_apply";

}  // namespace mkv::ops
