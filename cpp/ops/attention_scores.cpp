// attention_scores: an eviction policy's scores from attention's logits
// (ops/attention.h); checks and the two dispatches.
#include "metal/attention_params.h"
#include "ops/attention.h"
#include "ops/attention_names.h"

namespace mkv::ops {
namespace {

constexpr const char* kOp = "attention_scores";

void check_floats(const char* op, const char* what, const BufferView& v, uint64_t bytes) {
  ops::check_bytes(op, what, v, bytes);
  if (v.offset % 4 != 0) fail(op, std::string(what) + " offset " + std::to_string(v.offset) + " is not 4-byte aligned");
}

// The stats kernel follows the attention's shape: the host's one-thread form
// where lanes are fibers, unless the call asked for a GPU shape (a variant
// other than '' or 'host'), so the host validates both.
bool host_stats(const gpu::Device& dev, const AttentionDesc& d) {
  auto host_variant = [](const std::string& v) { return v.empty() || v == "host"; };
  return picks_host_shapes(dev.properties()) && host_variant(d.decode_variant) &&
         host_variant(d.prefill_variant);
}

}  // namespace

void attention_scores(gpu::Device& dev, gpu::ComputeEncoder& enc, const AttentionDesc& d, uint32_t row_lo,
                      const BufferView& scores, uint32_t score_stride, const BufferView& scratch,
                      bool accumulate) {
  if (row_lo >= d.n_queries) return;
  if (d.n_kv_heads == 0 || d.n_q_heads % d.n_kv_heads != 0 || d.n_queries == 0 || d.n_queries > d.n_tokens)
    fail(kOp, "needs n_q_heads a multiple of n_kv_heads and 1 <= n_queries <= n_tokens");
  if (d.window != 0) fail(kOp, "a sliding layer has no policy scores (window " + std::to_string(d.window) + ")");
  if (score_stride < d.n_tokens)
    fail(kOp, "score_stride " + std::to_string(score_stride) + " is below n_tokens " + std::to_string(d.n_tokens));
  check_floats(kOp, "logits", d.logits, uint64_t(d.n_queries) * d.n_q_heads * d.n_tokens * 4);
  check_floats(kOp, "scores", scores, uint64_t(d.n_kv_heads) * score_stride * 4);
  check_floats(kOp, "scratch", scratch, uint64_t(d.n_queries) * d.n_q_heads * 8);
  const mkv_params::AttnScores p{d.n_q_heads, d.n_kv_heads, d.n_tokens,   d.n_queries,
                                 row_lo,      d.n_tokens,   score_stride, accumulate ? 1u : 0u};
  const bool host = host_stats(dev, d);
  enc.set_pipeline(dev.pipeline(host ? kAttnScoresStatsHostKernel : kAttnScoresStatsKernel));
  bind_params(enc, p, 0);
  bind(enc, d.logits, 1);
  bind(enc, scratch, 2);
  enc.dispatch_threadgroups({d.n_queries - row_lo, d.n_q_heads, 1}, {host ? 1u : 256u, 1, 1});
  enc.set_pipeline(dev.pipeline(kAttnScoresAddKernel));
  bind_params(enc, p, 0);
  bind(enc, d.logits, 1);
  bind(enc, scratch, 2);
  bind(enc, scores, 3);
  enc.dispatch_threadgroups({ceil_div(d.n_tokens, 64), d.n_kv_heads, 1}, {64, 1, 1});
}

void attention_scores_apply(gpu::Device& dev, gpu::ComputeEncoder& enc, const ScoresApplyDesc& d,
                            const BufferView& shares, const BufferView& scores) {
  constexpr const char* op = "attention_scores_apply";
  if (d.rows == 0 || d.row_mask == 0) return;
  if (d.rows > 32 || d.keys == 0 || d.n_kv_heads == 0)
    fail(op, "needs 1 <= rows <= 32, keys >= 1 and n_kv_heads >= 1");
  const uint32_t n = d.keys + d.rows - 1;  // the last row's keys
  if (d.share_stride < n || d.score_stride < n)
    fail(op, "share_stride " + std::to_string(d.share_stride) + " and score_stride " + std::to_string(d.score_stride) +
                 " must hold the last row's " + std::to_string(n) + " keys");
  if (d.row_stride < uint64_t(d.n_kv_heads) * d.share_stride)
    fail(op, "row_stride " + std::to_string(d.row_stride) + " is below a row's n_kv_heads * share_stride");
  check_floats(op, "shares", shares, (uint64_t(d.rows - 1) * d.row_stride + uint64_t(d.n_kv_heads) * d.share_stride) * 4);
  check_floats(op, "scores", scores, uint64_t(d.n_kv_heads) * d.score_stride * 4);
  const mkv_params::AttnScoresApply p{d.n_kv_heads, d.keys, d.rows, d.row_mask, d.row_stride, d.share_stride,
                                      d.score_stride};
  enc.set_pipeline(dev.pipeline(kAttnScoresApplyKernel));
  bind_params(enc, p, 0);
  bind(enc, shares, 1);
  bind(enc, scores, 2);
  enc.dispatch_threadgroups({ceil_div(n, 64), d.n_kv_heads, 1}, {64, 1, 1});
}

}  // namespace mkv::ops
