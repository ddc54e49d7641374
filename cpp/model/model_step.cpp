// Model::encode_step: one forward step over the segments of several
// sequences (model.h has the ops of a layer, docs/BATCHING.md the design).
//
// Rows: the multi-token segments' rows first ([0, P): "prefill rows"), then
// one row per one-token segment ([P, P + D): "decode rows"). Per-row ops run
// once over all rows; projections run as a gemm over the prefill rows and a
// several-token gemv over the decode rows (each weight read once per step, or
// once per kGemvTokens decode rows); the store and attention run per segment.
// What a row computes never depends on the other rows, so a sequence decoded
// in a batch is bit-identical to the same sequence decoded alone. Unless the
// caller opts out (gemm_decode_rows): then a step's decode rows, when there
// are enough of them, join the prefill rows' gemm (StepRows::gemm).
#include "model/model.h"

#include <algorithm>
#include <cmath>

#include "ops/altup.h"
#include "ops/attention.h"
#include "ops/elementwise.h"

namespace mkv::model {
namespace {

[[noreturn]] void fail(const std::string& m) { ops::fail("model", m); }
std::string str(uint64_t v) { return std::to_string(v); }

ops::BufferView at(const ops::BufferView& v, size_t byte_offset) { return {v.buffer, v.offset + byte_offset}; }
// Row r of a (rows, width) float buffer.
ops::BufferView row(const ops::BufferView& v, uint32_t r, size_t width) { return at(v, r * width * sizeof(float)); }

}  // namespace

uint32_t Model::logit_rows(const std::vector<Segment>& segments) {
  uint32_t n = 0;
  for (const Segment& s : segments)
    n += s.logits == Logits::all || s.logits == Logits::each ? s.n : s.logits == Logits::last ? 1 : 0;
  return n;
}

Model::StepRows Model::check_step(const Workspace& ws, const std::vector<Segment>& segs,
                                  uint32_t gemm_decode_rows) const {
  if (segs.empty()) fail("a step needs at least one segment");
  StepRows rows;
  uint64_t total = 0;
  for (size_t i = 0; i < segs.size(); ++i) {
    const Segment& s = segs[i];
    if (!s.cache) fail("segment " + str(i) + " has no cache");
    if (s.n == 0) fail("segment " + str(i) + " feeds no token");
    const bool decode_rows = s.n == 1 || s.logits == Logits::each;
    if (!decode_rows && rows.decode > 0)
      fail("segment " + str(i) + " feeds " + str(s.n) + " prompt tokens after a decode segment; prompt segments "
           "come first");
    if (s.logits == Logits::all && segs.size() > 1) fail("a segment that wants every row's logits is a step of its own");
    for (size_t j = 0; j < i; ++j)
      if (segs[j].cache == s.cache) fail("segments " + str(j) + " and " + str(i) + " feed the same cache");
    uint32_t soft_end = 0;
    for (const SoftRows& soft : s.soft) {
      if (!soft.data || soft.n == 0 || soft.row < soft_end || uint64_t(soft.row) + soft.n > s.n)
        fail("segment " + str(i) + "'s soft rows are empty, out of order or past its " + str(s.n) + " rows");
      soft_end = soft.row + soft.n;
    }
    if (!s.blocks.empty() && (decode_rows || s.cache->spec().policy.kind != kv::PolicyKind::none))
      fail("segment " + str(i) + " has bidirectional blocks: only a prompt segment of a cache without an "
           "eviction policy takes them");
    rows.first.push_back(uint32_t(total));
    (decode_rows ? rows.decode : rows.prefill) += s.n;
    rows.verify = rows.verify || s.logits == Logits::each;
    total += s.n;
  }
  if (total > ws.step_rows()) fail("a step takes 1.." + str(ws.step_rows()) + " tokens, got " + str(total));
  if (logit_rows(segs) > ws.logit_rows())
    fail("a step writes at most " + str(ws.logit_rows()) + " rows of logits, got " + str(logit_rows(segs)));
  // (each segment's stores: check_segment, run by the caller before the step)
  const bool join = gemm_decode_rows && rows.decode >= gemm_decode_rows;
  rows.gemm = rows.prefill + (join ? rows.decode : 0);
  rows.gemv = rows.prefill + rows.decode - rows.gemm;
  rows.sampled_gemm = gemm_decode_rows && logit_rows(segs) >= gemm_decode_rows;
  return rows;
}

void Model::check_segment(const Segment& s) const {
  if (!s.cache) fail("a segment has no cache");
  check_cache(*s.cache);
  // Verification reads each row's keys as decode would at its position (its
  // residual window too: the ring keeps max_chunk positions more than the
  // window). Under an eviction policy its rows must fit before the next
  // eviction: decoding them one at a time would evict between them.
  if (s.logits == Logits::each && s.n > s.cache->room_before_eviction())
    fail("a verification segment of " + str(s.n) + " rows is stored where an eviction is due (room for " +
         str(s.cache->room_before_eviction()) + ")");
  // Every layer before any is encoded, so a step fails before any layer's
  // length moves; its stores (kv::KvCache::Checked::yes) do not check again.
  for (uint32_t l = 0; l < spec_.n_layers; ++l)
    if (!layers_[l].reads_kv) s.cache->check_store(spec_.kv_of(l), s.n, &rope_for(*s.cache, l));
}

void Model::linear_rows(gpu::ComputeEncoder& enc, const ops::BufferView& x, const Weight& w, const Weight* bias,
                        const ops::BufferView& y, uint32_t n, ops::MatmulKernel kernel, bool accumulate) const {
  ops::MatmulArgs a;
  a.x = x;
  a.w = w.view;
  a.y = y;
  if (bias) a.bias = bias->view;
  a.n_tokens = n;
  a.n_in = uint32_t(w.cols());
  a.n_out = uint32_t(w.rows());
  a.wtype = w.type;
  a.kernel = kernel;
  a.accumulate = accumulate;
  ops::matmul(*device_, enc, a);
}

void Model::linear(gpu::ComputeEncoder& enc, const ops::BufferView& x, const Weight& w, const Weight* bias,
                   const ops::BufferView& y, const StepRows& rows, bool accumulate, RowKinds kinds) const {
  const size_t in = w.cols(), out = w.rows();
  if (kinds.gemm && rows.gemm) linear_rows(enc, x, w, bias, y, rows.gemm, ops::MatmulKernel::gemm, accumulate);
  if (kinds.gemv && rows.gemv)
    linear_rows(enc, row(x, rows.gemm, in), w, bias, row(y, rows.gemm, out), rows.gemv, ops::MatmulKernel::gemv,
                accumulate);
}

void Model::norm(gpu::ComputeEncoder& enc, const ops::BufferView& x, const Weight& w, const ops::BufferView& out,
                 uint32_t rows, uint32_t dim) const {
  ops::rms_norm(*device_, enc, x, w.view, w.type, out, rows, dim, spec_.rms_eps, spec_.norm_offset);
}

void Model::encode_layer(kv::EncoderSession& s, Workspace& ws, const std::vector<Segment>& segs, const StepRows& rows,
                         uint32_t l) const {
  const Layer& L = layers_[l];
  const ModelSpec& m = spec_;
  const uint32_t H = m.hidden, n_rows = rows.prefill + rows.decode;
  gpu::Device& dev = *device_;
  const size_t Q = size_t(m.n_heads) * m.head_dim, KV = size_t(m.n_kv_heads) * m.head_dim;
  // The gemv's rows take q/k/v from one stacked gemv, (rows.gemv, Q + 2 KV)
  // in ws.qkv(); the gemm's rows from one gemm over the same stack whose
  // epilogue sends the columns to ws.q/k/v (token-major); without the stack,
  // three of each.
  // (A step that verifies stores several rows of a segment at once: its q/k/v
  // must be token-major, so it takes the separate gemvs, the same sums.)
  const bool stacked = rows.gemv && L.qkv.view.buffer && !rows.verify;
  const bool reader = L.reads_kv;
  const uint32_t c = m.kv_of(l);        // the cache layer it attends over
  {
    gpu::ComputeEncoder& enc = s.compute();
    if (m.altup_inputs) encode_altup_predict(enc, ws, rows, l);  // x = the active stream's prediction
    norm(enc, ws.x(), *L.attn_norm, ws.h(), n_rows, H);
    RowKinds separate{true, true};  // what the three separate projections still compute
    const Weight* qkv_bias = L.qkv_bias.view.buffer ? &L.qkv_bias : nullptr;
    if (stacked) {
      linear_rows(enc, row(ws.h(), rows.gemm, H), L.qkv, qkv_bias, ws.qkv(), rows.gemv, ops::MatmulKernel::gemv,
                  false);
      separate.gemv = false;
    }
    if (rows.gemm && L.qkv.view.buffer) {
      ops::MatmulArgs a;
      a.x = ws.h();
      a.w = L.qkv.view;
      a.y = ws.q();
      a.y2 = ws.k();
      a.y3 = ws.v();
      if (qkv_bias) a.bias = qkv_bias->view;
      a.n_tokens = rows.gemm;
      a.n_in = H;
      a.n_out = uint32_t(Q + 2 * KV);
      a.split_a = uint32_t(Q);
      a.split_b = uint32_t(Q + KV);
      a.wtype = L.qkv.type;
      a.kernel = ops::MatmulKernel::gemm;
      ops::matmul(dev, enc, a);
      separate.gemm = false;
    }
    if ((separate.gemm && rows.gemm) || (separate.gemv && rows.gemv)) {
      linear(enc, ws.h(), *L.q, L.q_bias, ws.q(), rows, false, separate);
      if (!reader) {
        linear(enc, ws.h(), *L.k, L.k_bias, ws.k(), rows, false, separate);
        linear(enc, ws.h(), *L.v, L.v_bias, ws.v(), rows, false, separate);
      }
    }
    if (m.qk_norm || m.v_norm) {
      // ws.q/k/v hold the gemm's rows (from the split gemm or three) and the
      // gemv's rows that did not take the stacked gemv, after them.
      const uint32_t n = rows.gemm + (separate.gemv ? rows.gemv : 0);
      if (n && m.qk_norm) {
        norm(enc, ws.q(), *L.q_norm, ws.q(), n * m.n_heads, m.head_dim);
        if (!reader) norm(enc, ws.k(), *L.k_norm, ws.k(), n * m.n_kv_heads, m.head_dim);
      }
      if (n && m.v_norm && !reader) norm(enc, ws.v(), ones_, ws.v(), n * m.n_kv_heads, m.head_dim);
      for (uint32_t t = 0; stacked && t < rows.gemv; ++t) {  // a decode row's q, k and v lie apart in ws.qkv()
        const ops::BufferView qt = row(ws.qkv(), t, Q + 2 * KV), kt = at(qt, Q * sizeof(float)),
                              vt = at(qt, (Q + KV) * sizeof(float));
        if (m.qk_norm) {
          norm(enc, qt, *L.q_norm, qt, m.n_heads, m.head_dim);
          norm(enc, kt, *L.k_norm, kt, m.n_kv_heads, m.head_dim);
        }
        if (m.v_norm) norm(enc, vt, ones_, vt, m.n_kv_heads, m.head_dim);
      }
    }
    if (L.laurel_l) encode_laurel(enc, ws, rows, l);  // (from ws.h(), before the residual adds reuse it)
  }

  // Per segment: the store rotates K on its way into the cache and Q in place
  // (one dispatch), then attention over the segment's own cache.
  for (size_t i = 0; i < segs.size(); ++i) {
    const Segment& seg = segs[i];
    kv::KvCache& cache = *seg.cache;
    const uint32_t r0 = rows.first[i];
    ops::BufferView q = row(ws.q(), r0, Q), k = row(ws.k(), r0, KV), v = row(ws.v(), r0, KV);
    if (stacked && r0 >= rows.gemm) {
      q = row(ws.qkv(), r0 - rows.gemm, Q + 2 * KV);
      k = at(q, Q * sizeof(float));
      v = at(q, (Q + KV) * sizeof(float));
    }
    const kv::LayerLayout lay = cache.layout(c);
    if (!reader) {
      cache.store(s, c, k, v, seg.n, &rope_for(cache, l), ops::QueryRope{q, m.n_heads}, kv::KvCache::Checked::yes);
    } else {  // the queries alone: rotated as the store rotates a writer's (rope, then Hadamard)
      gpu::ComputeEncoder& enc = s.compute();
      ops::rope(dev, enc, q, at(ws.positions(), r0 * sizeof(uint32_t)), rope_for(cache, l),
                {seg.n, m.n_heads, m.head_dim});
      if (lay.rotate) ops::hadamard(dev, enc, q, seg.n, m.n_heads, m.head_dim);
    }

    gpu::ComputeEncoder& enc = s.compute();  // the store may have switched to a blit encoder
    ops::AttentionDesc d;
    d.n_q_heads = m.n_heads;
    d.n_kv_heads = m.n_kv_heads;
    d.head_dim = m.head_dim;
    d.n_tokens = cache.count(c);  // (indices: below length(c) once a policy evicted)
    d.n_queries = seg.n;
    d.slots = cache.slots(c);
    d.window = cache.window(c);
    d.scale = m.scale();
    d.softcap = m.attn_softcap;
    d.k_format = lay.k_format;
    d.v_format = lay.v_format;
    cache.ring().describe(c, d);
    // An eviction policy that scores by attention (h2o, snapkv): the kernels
    // also write the logits, which become each key's probability in its score.
    // Only the writer's attention scores its cache layer: the policy's choice
    // there holds for the layers that read it (docs/KV_CACHE.md, "KV sharing").
    const size_t logit_bytes = size_t(seg.n) * m.n_heads * d.n_tokens * sizeof(float);
    const ops::BufferView policy = !reader && cache.scores_attention(c)
                                       ? ws.policy_scratch(logit_bytes + size_t(seg.n) * m.n_heads * 8)
                                       : ops::BufferView{};
    if (policy.buffer) d.logits = policy;
    const ops::BufferView out = row(ws.attn(), r0, Q);
    if (seg.logits == Logits::each) {
      // Row i decodes at its own position: the keys before it and its own. A
      // policy's scores get each row's share apart (KvCache::verify_share),
      // added once the rows the step keeps are known.
      ops::AttentionDesc di = d;
      di.n_queries = 1;
      for (uint32_t i = 0; i < seg.n; ++i) {
        di.n_tokens = d.n_tokens - (seg.n - 1 - i);
        ops::attention_decode(dev, enc, di, row(q, i, Q), cache.region(c), cache.table(c), row(out, i, Q), {},
                              ws.attention_scratch(ops::attention_decode_scratch_bytes(di)));
        if (!policy.buffer) continue;
        const ops::BufferView share = cache.verify_share(c, i, seg.n);
        if (share.buffer)
          ops::attention_scores(dev, enc, di, 0, share, cache.share_stride(), {policy.buffer, policy.offset + logit_bytes},
                                /*accumulate=*/false);
      }
    } else if (seg.n == 1)
      ops::attention_decode(dev, enc, d, q, cache.region(c), cache.table(c), out, {},
                            ws.attention_scratch(ops::attention_decode_scratch_bytes(d)));
    else {
      d.blocks = seg.blocks;
      ops::attention_prefill(dev, enc, d, q, cache.region(c), cache.table(c), out, {});
    }
    if (policy.buffer && seg.logits != Logits::each)
      ops::attention_scores(dev, enc, d, cache.score_rows_from(c, seg.n), cache.scores(c), cache.spec().capacity,
                            {policy.buffer, policy.offset + logit_bytes});
    if (lay.rotate) ops::hadamard(dev, enc, out, seg.n, m.n_heads, m.head_dim);  // V was stored rotated
  }

  gpu::ComputeEncoder& enc = s.compute();
  add_residual(enc, ws, ws.attn(), *L.out, L.post_attn_norm, rows);
  if (L.laurel_l) {  // x = (x + laurel) / sqrt 2
    ops::add(dev, enc, ws.x(), ws.laurel(), n_rows * H);
    ops::scale(dev, enc, ws.x(), n_rows * H, 1.0f / std::sqrt(2.0f));
  }

  norm(enc, ws.x(), *L.ffn_norm, ws.h(), n_rows, H);
  // Gate and up in one pass over the stacked matrix that applies the activation:
  // the gemm's rows through its GLU epilogue, the gemv's rows the fused gemv.
  // (a sparse gate is cut before its activation: no fused GLU)
  const bool sparse = m.sparse_ffn(l);
  bool fused = false;
  if (L.gate_up.view.buffer && !sparse && rows.gemm + rows.gemv) {
    ops::GluArgs g;
    g.w = L.gate_up.view;
    g.n_in = H;
    g.n_out = m.ffn_hidden;
    g.wtype = L.gate_up.type;
    g.act = m.activation == Activation::silu ? ops::GluActivation::silu : ops::GluActivation::gelu_tanh;
    if (rows.gemm) {
      g.x = ws.h();
      g.y = ws.gate();
      g.n_tokens = rows.gemm;
      g.kernel = ops::MatmulKernel::gemm;
      ops::matmul_glu(dev, enc, g);
    }
    if (rows.gemv) {
      g.x = row(ws.h(), rows.gemm, H);
      g.y = row(ws.gate(), rows.gemm, m.ffn_hidden);
      g.n_tokens = rows.gemv;
      g.kernel = ops::MatmulKernel::automatic;
      ops::matmul_glu(dev, enc, g);
    }
    fused = true;
  }
  if (const uint32_t n = fused ? 0 : rows.gemm + rows.gemv) {
    linear(enc, ws.h(), *L.gate, nullptr, ws.gate(), rows);
    linear(enc, ws.h(), *L.up, nullptr, ws.up(), rows);
    if (sparse) ops::gaussian_topk(dev, enc, ws.gate(), n, m.ffn_hidden, m.ffn_sparse_std[l]);
    if (m.activation == Activation::silu)
      ops::swiglu(dev, enc, ws.gate(), ws.up(), ws.gate(), n * m.ffn_hidden);
    else
      ops::geglu(dev, enc, ws.gate(), ws.up(), ws.gate(), n * m.ffn_hidden);
  }
  add_residual(enc, ws, ws.gate(), *L.down, L.post_ffw_norm, rows);
  if (m.altup_inputs) encode_altup_correct(enc, ws, rows, l);
}

void Model::add_residual(gpu::ComputeEncoder& enc, Workspace& ws, const ops::BufferView& in, const Weight& w,
                         const Weight* post_norm, const StepRows& rows) const {
  // x += in W (+ post-norm): without a sandwich norm the add is W's epilogue.
  const uint32_t n_rows = rows.prefill + rows.decode, H = spec_.hidden;
  if (!post_norm) return linear(enc, in, w, nullptr, ws.x(), rows, /*accumulate=*/true);
  linear(enc, in, w, nullptr, ws.h(), rows);
  norm(enc, ws.h(), *post_norm, ws.h(), n_rows, H);
  ops::add(*device_, enc, ws.x(), ws.h(), n_rows * H);
}

void Model::encode_logits(gpu::ComputeEncoder& enc, Workspace& ws, const std::vector<Segment>& segs,
                          const StepRows& rows) const {
  const uint32_t H = spec_.hidden, n = logit_rows(segs);
  if (n == 0) return;
  // The rows asked for: a view when they are the step's last rows, else
  // gathered into ws.gathered() by the embedding kernel (an f32 table lookup).
  std::vector<int32_t> picked;
  for (size_t i = 0; i < segs.size(); ++i) {
    const uint32_t last = rows.first[i] + segs[i].n - 1;
    if (segs[i].logits == Logits::all || segs[i].logits == Logits::each)
      for (uint32_t r = rows.first[i]; r <= last; ++r) picked.push_back(int32_t(r));
    else if (segs[i].logits == Logits::last)
      picked.push_back(int32_t(last));
  }
  const uint32_t n_rows = rows.prefill + rows.decode;
  ops::BufferView x = row(ws.x(), n_rows - n, H);
  bool tail = true;
  for (uint32_t i = 0; i < n; ++i) tail = tail && picked[i] == int32_t(n_rows - n + i);
  if (!tail) {
    ws.write_rows(picked.data(), n);
    ops::embedding(*device_, enc, ws.x(), ops::WeightType::f32, ws.rows_view(), ws.gathered(), n, H, n_rows, 1.0f);
    x = ws.gathered();
  }
  norm(enc, x, *out_norm_, ws.h(), n, H);
  // A sampled row's logits come from a gemv, as when its sequence runs alone
  // (unless the step's caller opted out: rows.sampled_gemm).
  const bool all = segs.size() == 1 && segs[0].logits == Logits::all;
  const ops::MatmulKernel kernel = all ? ops::MatmulKernel::automatic
                                   : rows.sampled_gemm ? ops::MatmulKernel::gemm
                                                       : ops::MatmulKernel::gemv;
  linear_rows(enc, ws.h(), *lm_head_, nullptr, ws.logits(), n, kernel, false);
  if (spec_.final_softcap > 0) ops::softcap(*device_, enc, ws.logits(), n * spec_.vocab, spec_.final_softcap);
}

void Model::encode_step(kv::EncoderSession& s, Workspace& ws, const std::vector<Segment>& segs,
                        uint32_t gemm_decode_rows) const {
  const StepRows rows = check_step(ws, segs, gemm_decode_rows);
  const uint32_t H = spec_.hidden, n_rows = rows.prefill + rows.decode;
  if (shares_kv_) {  // readers rope their queries at the rows' positions
    std::vector<uint32_t> pos(n_rows);
    for (size_t i = 0; i < segs.size(); ++i)
      for (uint32_t t = 0; t < segs[i].n; ++t) pos[rows.first[i] + t] = segs[i].cache->length(0) + t;
    ws.write_positions(pos.data(), n_rows);
  }
  // (Gemma 3n: the embedding is AltUp's stream 0, the others and the per-layer inputs made from it)
  const ops::BufferView embedded = spec_.altup_inputs ? ws.stream(0) : ws.x();
  ops::embedding(*device_, s.compute(), embd_->view, embd_->type, ws.ids_view(), embedded, n_rows, H, spec_.vocab,
                 spec_.embedding_scale);
  // Soft tokens replace their rows' embeddings: staged, then gathered into place (an f32 table lookup).
  for (size_t i = 0; i < segs.size(); ++i)
    for (const SoftRows& soft : segs[i].soft) {
      const uint32_t r0 = rows.first[i] + soft.row;
      ws.write_soft(r0, soft.data, soft.n);
      ops::embedding(*device_, s.compute(), ws.soft_rows(), ops::WeightType::f32, at(ws.soft_index(), r0 * 4),
                     row(embedded, r0, H), soft.n, H, ws.step_rows(), 1.0f);
    }
  if (spec_.altup_inputs) encode_altup_inputs(s.compute(), ws, rows);
  for (uint32_t l = 0; l < spec_.n_layers; ++l) {
    encode_layer(s, ws, segs, rows, l);
    if ((l + 1) % kLayersPerCommandBuffer == 0 && l + 1 < spec_.n_layers) s.flush();
  }
  if (spec_.altup_inputs) encode_altup_output(s.compute(), ws, rows);
  encode_logits(s.compute(), ws, segs, rows);
}

}  // namespace mkv::model
