// An eviction policy's scores from attention's logits (kv_policy.h: h2o,
// snapkv): the logits an attention kernel wrote (AttnDecode/AttnPrefill::logits)
// become each key's attention probability, summed over the query rows and the
// query heads of its KV head, and added to the layer's score buffer. Two
// kernels, so no two threads add to one score: stats finds each (row, head)'s
// softmax max and sum, add walks the keys. A third, apply, adds the shares of
// a verified segment's rows that a speculative step keeps.
//
// Stats has two shapes (ops/attention_scores.cpp picks): 256 threads a (row,
// head) for GPUs, and attn_scores_stats_h, one thread, for the host executor,
// where lanes are fibers and each of the 256-thread form's three barriers
// switches through every thread (28.8 ms a token of the default model's h2o
// decode, 2026-12-07). They sum in different orders; the tests hold both to
// the float64 reference.
#include "mkv_kernel.h"
#include "attention_params.h"

// Keys query row i sees: the keys before the step's queries and the first i + 1 of theirs.
inline uint attn_scores_keys(constant mkv_params::AttnScores& p, uint row) {
  return p.n_tokens - p.n_queries + row + 1;
}

// Grid (rows from row_lo, n_q_heads); 256 threads reduce one (row, head).
MKV_MAX_THREADS(256) kernel void attn_scores_stats(constant mkv_params::AttnScores& p [[buffer(0)]],
                              const device float* logits [[buffer(1)]],  // (n_queries, n_q_heads, stride)
                              device float* ml [[buffer(2)]],            // (n_queries, n_q_heads, 2)
                              uint2 tg [[threadgroup_position_in_grid]],
                              uint tid [[thread_index_in_threadgroup]],
                              uint simd [[simdgroup_index_in_threadgroup]],
                              uint lane [[thread_index_in_simdgroup]]) {
  threadgroup float part[8];
  const uint row = p.row_lo + tg.x, qh = tg.y, n = attn_scores_keys(p, row);
  const device float* s = logits + (row * p.n_q_heads + qh) * p.stride;
  float m = -INFINITY;
  for (uint j = tid; j < n; j += 256) m = max(m, s[j]);
  m = simd_max(m);
  if (lane == 0) part[simd] = m;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float m_all = -INFINITY;
  for (uint i = 0; i < 8; ++i) m_all = max(m_all, part[i]);
  threadgroup_barrier(mem_flags::mem_threadgroup);  // part is reused for the sums
  float l = 0.0f;
  for (uint j = tid; j < n; j += 256) l += exp(s[j] - m_all);
  l = simd_sum(l);
  if (lane == 0) part[simd] = l;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (tid == 0) {
    float l_all = 0.0f;
    for (uint i = 0; i < 8; ++i) l_all += part[i];
    ml[(row * p.n_q_heads + qh) * 2] = m_all;
    ml[(row * p.n_q_heads + qh) * 2 + 1] = l_all;
  }
}

#if defined(MKV_HOST_SHAPES)
// Grid (rows from row_lo, n_q_heads); one thread does a (row, head) alone.
MKV_MAX_THREADS(32) kernel void attn_scores_stats_h(constant mkv_params::AttnScores& p [[buffer(0)]],
                                                    const device float* logits [[buffer(1)]],  // (n_queries, n_q_heads, stride)
                                                    device float* ml [[buffer(2)]],            // (n_queries, n_q_heads, 2)
                                                    uint2 tg [[threadgroup_position_in_grid]],
                                                    uint tid [[thread_index_in_threadgroup]]) {
  if (tid != 0) return;  // one thread a threadgroup (the op's dispatch)
  const uint row = p.row_lo + tg.x, qh = tg.y, n = attn_scores_keys(p, row);
  const device float* s = logits + (row * p.n_q_heads + qh) * p.stride;
  float m = -INFINITY;
  for (uint j = 0; j < n; ++j) m = max(m, s[j]);
  float l = 0.0f;
  for (uint j = 0; j < n; ++j) l += exp(s[j] - m);
  ml[(row * p.n_q_heads + qh) * 2] = m;
  ml[(row * p.n_q_heads + qh) * 2 + 1] = l;
}
#endif

// Grid (ceil(n_tokens / 64), n_kv_heads); 64 threads, one key each.
MKV_MAX_THREADS(64) kernel void attn_scores_add(constant mkv_params::AttnScores& p [[buffer(0)]],
                            const device float* logits [[buffer(1)]],  // (n_queries, n_q_heads, stride)
                            const device float* ml [[buffer(2)]],      // (n_queries, n_q_heads, 2)
                            device float* scores [[buffer(3)]],        // (n_kv_heads, score_stride)
                            uint2 tg [[threadgroup_position_in_grid]],
                            uint tid [[thread_index_in_threadgroup]]) {
  const uint j = tg.x * 64 + tid, kvh = tg.y;
  if (j >= p.n_tokens) return;
  const uint group = p.n_q_heads / p.n_kv_heads;
  float sum = 0.0f;
  for (uint row = p.row_lo; row < p.n_queries; ++row) {
    if (j >= attn_scores_keys(p, row)) continue;  // a later query's own key
    for (uint qh = kvh * group; qh < (kvh + 1) * group; ++qh) {
      const uint at = row * p.n_q_heads + qh;
      sum += exp(logits[at * p.stride + j] - ml[at * 2]) / ml[at * 2 + 1];
    }
  }
  if (p.accumulate)
    scores[kvh * p.score_stride + j] += sum;
  else
    scores[kvh * p.score_stride + j] = sum;
}

// Grid (ceil((keys + rows - 1) / 64), n_kv_heads); 64 threads, one key each.
MKV_MAX_THREADS(64) kernel void attn_scores_apply(constant mkv_params::AttnScoresApply& p [[buffer(0)]],
                              const device float* shares [[buffer(1)]],  // (rows, n_kv_heads, share_stride)
                              device float* scores [[buffer(2)]],        // (n_kv_heads, score_stride)
                              uint2 tg [[threadgroup_position_in_grid]],
                              uint tid [[thread_index_in_threadgroup]]) {
  const uint j = tg.x * 64 + tid, h = tg.y;
  if (j + 1 >= p.keys + p.rows) return;
  float s = scores[h * p.score_stride + j];
  for (uint r = 0; r < p.rows; ++r)
    if (((p.row_mask >> r) & 1u) != 0 && j < p.keys + r) s += shares[r * p.row_stride + h * p.share_stride + j];
  scores[h * p.score_stride + j] = s;
}
