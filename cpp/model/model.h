// Model: the transformer forward pass, encoded op by op into a step's
// encoder session. Which ops, in what order (one decoder layer):
//
//   h = rms_norm(x, attn_norm)
//   q, k, v = h Wq (+bq), h Wk (+bk), h Wv (+bv)   [decode: one stacked matmul]
//   [qk_norm]  q, k = rms_norm per head (attn_q_norm, attn_k_norm)
//   cache.store(k, v, q): one dispatch rotates k into the K/V rows and q in place
//   a = attention(q, cache)            decode (1 token) or prefill (a chunk)
//   o = a Wo;  [sandwich] o = rms_norm(o, post_attention_norm);  x += o
//   h = rms_norm(x, ffn_norm);  g = act(h Wgate) * (h Wup)   [decode: one gemv_*glu]
//   d = g Wdown;  [sandwich] d = rms_norm(d, post_ffw_norm);  x += d
//
// Fusions (fewer dispatches, one weight pass): q/k/v and gate/up are stacked
// into one buffer each at load (Weights::stack_rows; the separate tensors
// become views of the stack, so prefill's gemms still see them), and without
// sandwich norms the residual adds happen in Wo's and Wdown's epilogue.
//
// then logits = rms_norm(x, output_norm) Wout (token_embd when tied) for the
// rows asked for, soft-capped if the model says so.
//
// Gemma 3n (ModelSpec::altup_inputs, model_altup.cpp) wraps the layer: the step
// starts N streams of the embedding (stream 0, and N - 1 projections of it
// matched to its magnitude) and each token's per-layer inputs; a layer's x is
// AltUp's prediction of its active stream, LAuReL's low-rank branch joins the
// attention's residual, (x + laurel) / sqrt 2, the FFN gate may be sparse (a
// Gaussian top-k), and after the FFN AltUp's correction updates every stream
// and the per-layer input gate adds to streams 1.. (transformers' indices). The last layer's
// streams, projected back and matched, are averaged into x for the logits.
//
// A step feeds several sequences at once (segments, model_step.cpp): their
// rows are concatenated, every per-row op (norms, projections, the FFN) runs
// once over all of them, so weights are read once per step, and the store
// and attention run per segment over its own cache. Every op's result for a
// row is independent of the other rows of the step (docs/BATCHING.md): a
// segment of n >= 2 tokens runs the prefill kernels (gemm, attention_prefill),
// a one-token segment the decode kernels (gemv, attention_decode) whatever the
// batch, so each sequence gets bit for bit what it would get alone.
#pragma once

#include <cstdint>
#include <vector>

#include "gpu/device.h"
#include "kv/encoder_session.h"
#include "kv/kv_cache.h"
#include "model/model_spec.h"
#include "model/weights.h"
#include "model/workspace.h"
#include "ops/attention.h"

namespace mkv::model {

// Which rows of a segment get logits: none (a prompt chunk that samples
// nothing), the last (it samples the next token: the lm_head runs as a gemv,
// as for one token), all of them (Engine::prefill's logits: a gemm over the
// rows, alone in its step), or each: speculative verification, where every
// row is a decode row (the gemv, and decode attention at the row's own
// position), so row i's logits are, bit for bit, what decoding the first i + 1
// tokens one at a time gives (docs/SPECULATIVE.md).
enum class Logits { none, last, all, each };

// Rows of a segment whose input is given, not looked up: a tower's soft
// tokens (an image's, a clip's), rows row .. row + n - 1 of the segment from
// data, (n, hidden) float, in place of their ids' embedding rows.
struct SoftRows {
  uint32_t row = 0;
  uint32_t n = 0;
  const float* data = nullptr;
};

// One sequence's part of a step: n tokens fed into *cache at positions
// cache->length(0) .. + n - 1.
struct Segment {
  kv::KvCache* cache = nullptr;
  uint32_t n = 0;
  Logits logits = Logits::last;
  std::vector<SoftRows> soft;  // in row order, disjoint
  // Bidirectional blocks of positions (Gemma 3's images): the segment's
  // queries inside one see all of it (ops::AttentionDesc::blocks). Only a
  // prompt segment of n >= 2 that holds each block's end; none under an
  // eviction policy (its indices are not positions).
  std::vector<ops::AttentionBlock> blocks;
};

class Model {
 public:
  // Checks every tensor the spec needs: present, shape, and a type its op
  // reads. Raises GpuError "[model] ..." naming the first bad tensor.
  Model(gpu::DevicePtr device, ModelSpec spec, Weights weights);

  const ModelSpec& spec() const { return spec_; }
  const Weights& weights() const { return weights_; }
  gpu::Device& device() const { return *device_; }

  // A cache shaped for this model: one layer per decoder layer, sliding
  // layers rings of their window (+ max_chunk - 1).
  // k_formats, v_formats: per layer (kv_format.h), or empty for f16.
  kv::KvCacheSpec cache_spec(uint32_t capacity, uint32_t max_chunk, kv::StorePath store,
                             std::vector<uint32_t> k_formats = {}, std::vector<uint32_t> v_formats = {},
                             bool rotate = false, uint32_t residual = 0, const kv::KvPolicySpec& policy = {}) const;
  // Raises unless `cache` was shaped for this model (layers, heads, windows).
  void check_cache(const kv::KvCache& cache) const;
  // Raises unless `segment` can be stored: its cache shaped for this model and
  // every layer's store of its n tokens able to go in (KvCache::check_store
  // with the layer's rope). A step's one store check: its caller runs it for
  // each segment before encode_step (the scheduler's plan, so a segment that
  // cannot go in fails alone), and the step's stores do not check again.
  void check_segment(const Segment& segment) const;

  // Encodes one step: the segments' tokens (ws ids rows, in segment order, which
  // the host has written) at their caches' next positions. Segments of n >= 2
  // tokens come first, then the one-token ones; a cache appears once; with
  // Logits::all the segment is the step's only one; a Logits::each segment
  // (verification) counts among the one-token ones. Stores their K/V in the
  // caches and writes the logits asked for to ws.logits() rows, in segment
  // order. Each segment must have passed check_segment since its cache last
  // changed (then a step fails before any layer's length moves); raises
  // GpuError "[model] ..." before encoding anything for a malformed step. Every kLayersPerCommandBuffer layers it flushes
  // the session (a queue session commits there and goes on in a new command
  // buffer), so the GPU starts on the first layers while the rest are encoded:
  // on an H200, encoding and launching an 8B step's 324 dispatches took about
  // as long as running them.
  //
  // gemm_decode_rows: 0 (the default) keeps batch invariance: the one-token
  // rows' projections run as the several-token gemv, whose sums for a row are
  // those of the row alone. n >= 1: when a step has at least n one-token rows,
  // their projections (the lm_head's sampled rows too) join the gemm, which
  // reads each weight once per tile of 32 rows instead of once per few tokens:
  // more tokens a second, but a row's sums then differ in their last bits from
  // the same row decoded alone (EngineOptions::batch_invariant).
  void encode_step(kv::EncoderSession& session, Workspace& ws, const std::vector<Segment>& segments,
                   uint32_t gemm_decode_rows = 0) const;
  // Rows of logits a step writes (what ws.logits() then holds).
  static uint32_t logit_rows(const std::vector<Segment>& segments);
  static constexpr uint32_t kLayersPerCommandBuffer = 4;

 private:
  struct Layer {
    const Weight *attn_norm, *q, *k, *v, *q_bias, *k_bias, *v_bias, *q_norm, *k_norm, *out,
        *post_attn_norm, *ffn_norm, *gate, *up, *down, *post_ffw_norm;
    // Stacks (view.buffer null when the parts could not be stacked):
    Weight qkv;       // (Q + 2 KV, hidden): Wq, Wk, Wv
    Weight qkv_bias;  // (Q + 2 KV,) when the model has attention biases
    Weight gate_up;   // (2 ffn_hidden, hidden): Wgate, Wup
    bool reads_kv;    // attends over an earlier layer's K and V, stores none (ModelSpec::kv_layer)
    // Gemma 3n (null otherwise): AltUp's router and coefficients, LAuReL, the per-layer input gate
    const Weight *router_norm, *router, *predict_coef, *correct_coef, *correct_scale, *laurel_l, *laurel_r,
        *laurel_norm, *inp_gate, *proj, *post_norm;
  };
  void stack_layer(const std::string& prefix, Layer& L);
  const Weight* require(const std::string& name, std::vector<uint64_t> shape, bool matrix) const;
  // The rows of a step: multi-token segments' rows [0, prefill), one-token ones
  // after. Projections: rows [0, gemm) through the gemm, [gemm, gemm + gemv)
  // (one-token rows) through the several-token gemv.
  struct StepRows {
    uint32_t prefill = 0;
    uint32_t decode = 0;
    uint32_t gemm = 0;
    uint32_t gemv = 0;
    bool sampled_gemm = false;    // the lm_head's sampled rows through the gemm too
    bool verify = false;          // a segment with Logits::each
    std::vector<uint32_t> first;  // per segment: its first row
  };
  StepRows check_step(const Workspace& ws, const std::vector<Segment>& segments, uint32_t gemm_decode_rows) const;
  void encode_layer(kv::EncoderSession& s, Workspace& ws, const std::vector<Segment>& segs, const StepRows& rows,
                    uint32_t l) const;
  void encode_logits(gpu::ComputeEncoder& enc, Workspace& ws, const std::vector<Segment>& segs,
                     const StepRows& rows) const;
  // Gemma 3n's parts of a step (model_altup.cpp)
  void require_altup(const std::string& prefix, Layer& L);
  void encode_altup_inputs(gpu::ComputeEncoder& enc, Workspace& ws, const StepRows& rows) const;
  void encode_altup_predict(gpu::ComputeEncoder& enc, Workspace& ws, const StepRows& rows, uint32_t l) const;
  void encode_laurel(gpu::ComputeEncoder& enc, Workspace& ws, const StepRows& rows, uint32_t l) const;
  void encode_altup_correct(gpu::ComputeEncoder& enc, Workspace& ws, const StepRows& rows, uint32_t l) const;
  void encode_altup_output(gpu::ComputeEncoder& enc, Workspace& ws, const StepRows& rows) const;
  // Which of a step's two kinds of projection rows a linear() computes (a
  // fused path may have done the others; their rows keep their places).
  struct RowKinds {
    bool gemm, gemv;
  };
  // y = x W (+ bias) over a step's rows: a gemm over rows.gemm, a gemv over
  // rows.gemv after them (rows of x and y at the same indices).
  void linear(gpu::ComputeEncoder& enc, const ops::BufferView& x, const Weight& w, const Weight* bias,
              const ops::BufferView& y, const StepRows& rows, bool accumulate = false,
              RowKinds kinds = {true, true}) const;
  void linear_rows(gpu::ComputeEncoder& enc, const ops::BufferView& x, const Weight& w, const Weight* bias,
                   const ops::BufferView& y, uint32_t n, ops::MatmulKernel kernel, bool accumulate) const;
  void norm(gpu::ComputeEncoder& enc, const ops::BufferView& x, const Weight& w,
            const ops::BufferView& out, uint32_t rows, uint32_t dim) const;
  // x += in W, or x += post_norm(in W) for sandwich norms (Gemma).
  void add_residual(gpu::ComputeEncoder& enc, Workspace& ws, const ops::BufferView& in, const Weight& w,
                    const Weight* post_norm, const StepRows& rows) const;

  gpu::DevicePtr device_;
  ModelSpec spec_;
  Weights weights_;
  std::vector<Layer> layers_;
  bool shares_kv_ = false;          // some layer reads another's K and V
  std::vector<uint32_t> kv_windows_;  // per cache layer (ModelSpec::kv_windows), checked each step
  const Weight *embd_, *out_norm_, *lm_head_;
  // Gemma 3n's: the per-layer token table, projection and norm; AltUp's stream projections
  // in and out; a (head_dim) vector of ones, v's norm's weight (ModelSpec::v_norm)
  const Weight *per_layer_embd_ = nullptr, *per_layer_proj_ = nullptr, *per_layer_norm_ = nullptr;
  std::vector<const Weight*> altup_in_, altup_out_;
  Weight ones_;
  // per table: rope_tables, and rope_tables_long for caches of more than rope_long_above tokens
  std::vector<ops::RopeSpec> rope_, rope_long_;
  const ops::RopeSpec& rope_for(const kv::KvCache& cache, uint32_t layer) const;
};

}  // namespace mkv::model
