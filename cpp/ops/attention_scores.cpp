// attention_scores: an eviction policy's scores from attention's logits
// (ops/attention.h); checks and the two dispatches.
#include "metal/attention_params.h"
#include "ops/attention.h"
#include "ops/attention_names.h"

namespace mkv::ops {
namespace {

constexpr const char* kOp = "attention_scores";

void check_bytes(const char* what, const BufferView& v, uint64_t bytes) {
  ops::check_bytes(kOp, what, v, bytes);
  if (v.offset % 4 != 0) fail(kOp, std::string(what) + " offset " + std::to_string(v.offset) + " is not 4-byte aligned");
}

}  // namespace

void attention_scores(gpu::Device& dev, gpu::ComputeEncoder& enc, const AttentionDesc& d, uint32_t row_lo,
                      const BufferView& scores, uint32_t score_stride, const BufferView& scratch) {
  if (row_lo >= d.n_queries) return;
  if (d.n_kv_heads == 0 || d.n_q_heads % d.n_kv_heads != 0 || d.n_queries == 0 || d.n_queries > d.n_tokens)
    fail(kOp, "needs n_q_heads a multiple of n_kv_heads and 1 <= n_queries <= n_tokens");
  if (d.window != 0) fail(kOp, "a sliding layer has no policy scores (window " + std::to_string(d.window) + ")");
  if (score_stride < d.n_tokens)
    fail(kOp, "score_stride " + std::to_string(score_stride) + " is below n_tokens " + std::to_string(d.n_tokens));
  check_bytes("logits", d.logits, uint64_t(d.n_queries) * d.n_q_heads * d.n_tokens * 4);
  check_bytes("scores", scores, uint64_t(d.n_kv_heads) * score_stride * 4);
  check_bytes("scratch", scratch, uint64_t(d.n_queries) * d.n_q_heads * 8);
  const mkv_params::AttnScores p{d.n_q_heads, d.n_kv_heads, d.n_tokens, d.n_queries, row_lo, d.n_tokens, score_stride};
  enc.set_pipeline(dev.pipeline(kAttnScoresStatsKernel));
  bind_params(enc, p, 0);
  bind(enc, d.logits, 1);
  bind(enc, scratch, 2);
  enc.dispatch_threadgroups({d.n_queries - row_lo, d.n_q_heads, 1}, {256, 1, 1});
  enc.set_pipeline(dev.pipeline(kAttnScoresAddKernel));
  bind_params(enc, p, 0);
  bind(enc, d.logits, 1);
  bind(enc, scratch, 2);
  bind(enc, scores, 3);
  enc.dispatch_threadgroups({ceil_div(d.n_tokens, 64), d.n_kv_heads, 1}, {64, 1, 1});
}

}  // namespace mkv::ops
