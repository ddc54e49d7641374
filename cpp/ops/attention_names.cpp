// Attention kernel names from metal/attention_variants.h (attention_names.h).
#include "ops/attention_names.h"

#include <set>

#include "metal/attention_params.h"
#include "metal/kv_format.h"

namespace mkv::ops {
namespace {

const char* const kDecodeOp = "attention_decode";

// The fixed-format pairs with kernels of their own (metal/attention_variants.h),
// and the head_dims they are built for.
struct KvPair {
  const char* kind;
  uint32_t k, v;
  bool residual_only;
};
#define MKV_ATTN_PAIR_ROW(kind, K, V, residual_only) {#kind, K, V, residual_only},
constexpr KvPair kKvPairs[] = {MKV_ATTN_KV_PAIRS(MKV_ATTN_PAIR_ROW, false)
                                   MKV_ATTN_RES_ONLY_KV_PAIRS(MKV_ATTN_PAIR_ROW, true)};
#undef MKV_ATTN_PAIR_ROW
#define MKV_ATTN_DIM_ITEM(D, unused) D,
constexpr uint32_t kPairHeadDims[] = {MKV_ATTN_PAIR_HEAD_DIMS(MKV_ATTN_DIM_ITEM, )};
constexpr uint32_t kPairR4HeadDims[] = {MKV_ATTN_PAIR_R4_HEAD_DIMS(MKV_ATTN_DIM_ITEM, )};
constexpr uint32_t kKvqHeadDims[] = {MKV_ATTN_KVQ_HEAD_DIMS(MKV_ATTN_DIM_ITEM, )};
constexpr uint32_t kR4HeadDims[] = {MKV_ATTN_R4_HEAD_DIMS(MKV_ATTN_DIM_ITEM, )};
constexpr uint32_t kNopfHeadDims[] = {MKV_ATTN_NOPF_HEAD_DIMS(MKV_ATTN_DIM_ITEM, )};
#undef MKV_ATTN_DIM_ITEM

// The lists say what the op's rules assume: the kvq kernels at exactly the
// head_dims kv_format_fits takes, the _r4 ones where decode has 8 rows, the
// pairs' _r4 forms at the pairs' head_dims that have 8 rows.
constexpr bool variant_lists_agree() {
  for (uint32_t d : kAttnHeadDims) {
    if (listed(kKvqHeadDims, d) != mkv_params::kv_format_fits(mkv_params::kKvQ8, d)) return false;
    if (listed(kR4HeadDims, d) != (mkv_params::attn_decode_rows(d) == 8)) return false;
    if (listed(kPairR4HeadDims, d) != (listed(kPairHeadDims, d) && listed(kR4HeadDims, d))) return false;
  }
  for (uint32_t d : kPairHeadDims)
    if (!listed(kKvqHeadDims, d)) return false;
  for (uint32_t d : kNopfHeadDims)
    if (!listed(kAttnHeadDims, d)) return false;
  return true;
}
static_assert(variant_lists_agree(), "metal/attention_variants.h disagrees with the rules of this file");

// The kernel family's format part: f16; a pair with kernels of its own
// (kKvPairs, at kPairHeadDims; q2's with a residual window only); else kvq,
// whose kernels read any pair.
const char* kv_kind(const AttnNameKey& k, bool pairs = false) {
  using namespace mkv_params;
  if (k.k_format == kKvF16 && k.v_format == kKvF16 && !k.residual) return "f16";
  if (pairs && listed(kPairHeadDims, k.head_dim) && !k.logits) {  // (_lg: f16 or kvq)
    for (const KvPair& p : kKvPairs)
      if (k.k_format == p.k && k.v_format == p.v && (k.residual || !p.residual_only)) return p.kind;
  }
  return "kvq";
}

// pairs: the fixed-format pairs' kernels may be picked (decode, GPU shape).
std::string family(const char* stem, const AttnNameKey& k, bool pairs = false) {
  return std::string(stem) + "_" + kv_kind(k, pairs);
}

// The kernel name after its family: the 4-row kernels where D allows 8 rows
// but the head block needs at most 4 (half the q/acc registers), the residual
// window's and a policy's logits' kernels, a requested compile-time variant;
// "_h" for the host's shape.
std::string decode_suffix(const AttnNameKey& k, uint32_t per_block, bool host) {
  if (k.decode_variant == "nopf") {
    if (!listed(kNopfHeadDims, k.head_dim))
      fail(kDecodeOp, "decode_variant 'nopf' exists for head_dim 128 only, not " + std::to_string(k.head_dim));
    if (std::string(kv_kind(k)) != "f16") fail(kDecodeOp, "decode_variant 'nopf' exists for f16 K and V only");
    return "_nopf";
  }
  const char* shape = host ? "_h" : "";
  if (k.logits) {  // an eviction policy's logits: the _lg kernels (8 rows where D allows)
    if (k.residual) fail(kDecodeOp, "logits (an eviction policy's) and a residual window do not go together");
    return std::string("_lg") + shape;
  }
  const char* rows = listed(kR4HeadDims, k.head_dim) && per_block <= 4 ? "_r4" : "";
  return (k.residual ? std::string("_res") : std::string()) + rows + shape;
}

}  // namespace

AttnNameKey attention_name_key(const AttentionDesc& d) {
  return {d.head_dim,       d.k_format, d.v_format, d.residual != 0, d.logits.buffer != nullptr, d.decode_variant,
          d.half_operands};
}

// The first kernel of a decode call: its family (the fixed-format pairs in the
// GPU shape only: the host's reads every pair through kvq) and suffix.
std::string attention_decode_kernel(const AttnNameKey& k, bool split, uint32_t per_block, bool host) {
  return attention_kernel_name(family(split ? "attn_decode_split" : "attn_decode", k, !host).c_str(), k.head_dim) +
         decode_suffix(k, per_block, host);
}

std::string attention_decode_rows_kernel(const AttnNameKey& k) {
  return attention_kernel_name(family("attn_decode", k).c_str(), k.head_dim) + "_rows_h";
}

std::string attention_decode_rows_merge_kernel(uint32_t head_dim) {
  return attention_kernel_name("attn_decode_rows_merge", head_dim) + "_h";
}

std::string attention_reduce_kernel(uint32_t head_dim) { return attention_kernel_name("attn_decode_reduce", head_dim); }

std::string attention_prefill_kernel(const AttnNameKey& k, bool host) {
  return attention_kernel_name(family("attn_prefill", k).c_str(), k.head_dim) + (host ? "_h" : "");
}

std::string attention_prefill_mma_kernel(const AttnNameKey& k) {
  return attention_kernel_name(family("attn_prefill_mma", k).c_str(), k.head_dim) + (k.half_operands ? "_half" : "");
}

std::vector<std::string> attention_kernel_names(gpu::Device& dev) {
  using namespace mkv_params;
  // Every descriptor shape a name depends on: formats (f16, each fixed pair, a
  // pair only kvq reads), residual window, logits, head block size, split,
  // shape (the host's where the library has it) and compile-time variant. A
  // combination the op refuses (validate_desc, decode_suffix) builds no name.
  std::vector<std::pair<uint32_t, uint32_t>> formats = {{kKvF16, kKvF16}, {kKvQ8, kKvF16}};
  for (const KvPair& p : kKvPairs) formats.push_back({p.k, p.v});
  const bool host_shapes = dev.properties().has_host_shapes;
  std::set<std::string> names = {kAttnScoresStatsKernel, kAttnScoresAddKernel, kAttnScoresApplyKernel};
  if (host_shapes) names.insert(kAttnScoresStatsHostKernel);
  for (uint32_t d : kAttnHeadDims) {
    names.insert(attention_reduce_kernel(d));
    if (host_shapes) {
      names.insert(attention_decode_rows_kernel({d, kKvF16, kKvF16, false, false, ""}));
      if (listed(kKvqHeadDims, d)) names.insert(attention_decode_rows_kernel({d, kKvQ8, kKvQ8, false, false, ""}));
      names.insert(attention_decode_rows_merge_kernel(d));
    }
    for (auto [kf, vf] : formats) {
      if (!kv_format_fits(kf, d) || !kv_format_fits(vf, d)) continue;
      for (bool residual : {false, true}) {
        if (residual && !kv_format_fits(kKvQ8, d)) continue;
        for (bool logits : {false, true}) {
          const AttnNameKey prefill{d, kf, vf, residual, logits, ""};
          names.insert(attention_prefill_kernel(prefill, false));
          names.insert(attention_prefill_mma_kernel(prefill));
          if (kf == kKvF16 && vf == kKvF16 && !residual && !logits)
            names.insert(attention_prefill_mma_kernel({d, kf, vf, false, false, "", true}));
          if (host_shapes) names.insert(attention_prefill_kernel(prefill, true));
          for (const char* variant : {"", "nopf"})
            for (uint32_t per_block : {1u, attn_decode_rows(d)})
              for (bool split : {false, true})
                for (bool host : {false, true}) {
                  if (host && !host_shapes) continue;
                  try {
                    names.insert(attention_decode_kernel({d, kf, vf, residual, logits, variant}, split, per_block, host));
                  } catch (const gpu::GpuError&) {
                    // not a variant the op builds
                  }
                }
        }
      }
    }
  }
  return {names.begin(), names.end()};
}

}  // namespace mkv::ops
