#include "model/model.h"

#include "ops/attention.h"
#include "ops/elementwise.h"

namespace mkv::model {
namespace {

[[noreturn]] void fail(const std::string& m) { ops::fail("model", m); }
std::string str(uint64_t v) { return std::to_string(v); }

std::string shape_str(const std::vector<uint64_t>& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + str(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

ops::BufferView at(const ops::BufferView& v, size_t byte_offset) { return {v.buffer, v.offset + byte_offset}; }

}  // namespace

const Weight* Model::require(const std::string& name, std::vector<uint64_t> shape, bool matrix) const {
  const Weight* w = weights_.find(name);
  if (!w) fail("missing tensor " + name);
  if (w->shape != shape)
    fail("tensor " + name + " has shape " + shape_str(w->shape) + ", expected " + shape_str(shape));
  // norms and biases are read as float (norms may be f16); matrices in any weight type
  if (!matrix && ops::is_quantized(w->type))
    fail("tensor " + name + " is " + ops::weight_type_name(w->type) + "; expected f32 or f16");
  return w;
}

Model::Model(gpu::DevicePtr device, ModelSpec spec, Weights weights)
    : device_(std::move(device)), spec_(std::move(spec)), weights_(std::move(weights)) {
  if (!device_) fail("device is null");
  spec_.validate();
  const uint64_t H = spec_.hidden, D = spec_.head_dim, Q = spec_.n_heads * D, KV = spec_.n_kv_heads * D,
                 F = spec_.ffn_hidden;
  embd_ = require("token_embd.weight", {spec_.vocab, H}, true);
  out_norm_ = require("output_norm.weight", {H}, false);
  lm_head_ = spec_.tied_embeddings ? embd_ : require("output.weight", {spec_.vocab, H}, true);
  for (uint32_t l = 0; l < spec_.n_layers; ++l) {
    const std::string p = "blk." + str(l) + ".";
    auto opt = [&](bool on, const char* n, std::vector<uint64_t> s, bool m) {
      return on ? require(p + n, std::move(s), m) : nullptr;
    };
    Layer L{};
    L.attn_norm = require(p + "attn_norm.weight", {H}, false);
    L.q = require(p + "attn_q.weight", {Q, H}, true);
    L.k = require(p + "attn_k.weight", {KV, H}, true);
    L.v = require(p + "attn_v.weight", {KV, H}, true);
    L.q_bias = opt(spec_.attn_bias, "attn_q.bias", {Q}, false);
    L.k_bias = opt(spec_.attn_bias, "attn_k.bias", {KV}, false);
    L.v_bias = opt(spec_.attn_bias, "attn_v.bias", {KV}, false);
    L.q_norm = opt(spec_.qk_norm, "attn_q_norm.weight", {D}, false);
    L.k_norm = opt(spec_.qk_norm, "attn_k_norm.weight", {D}, false);
    L.out = require(p + "attn_output.weight", {H, Q}, true);
    L.post_attn_norm = opt(spec_.sandwich_norms, "post_attention_norm.weight", {H}, false);
    L.ffn_norm = require(p + "ffn_norm.weight", {H}, false);
    L.gate = require(p + "ffn_gate.weight", {F, H}, true);
    L.up = require(p + "ffn_up.weight", {F, H}, true);
    L.down = require(p + "ffn_down.weight", {H, F}, true);
    L.post_ffw_norm = opt(spec_.sandwich_norms, "post_ffw_norm.weight", {H}, false);
    for (const Weight* b : {L.q_bias, L.k_bias, L.v_bias})
      if (b && b->type != ops::WeightType::f32) fail("bias tensors must be f32 (" + p + "attn_*.bias)");
    stack_layer(p, L);
    layers_.push_back(L);
  }
  const uint32_t rd = spec_.rotary_dim ? spec_.rotary_dim : spec_.head_dim;
  for (auto [tables, specs] : {std::pair{&spec_.rope_tables, &rope_}, {&spec_.rope_tables_long, &rope_long_}})
    for (const auto& table : *tables) {
      gpu::BufferPtr b = device_->new_buffer(table.size() * sizeof(float));
      b->write(0, table.data(), table.size() * sizeof(float));
      specs->push_back({spec_.rope_style, rd, {b, 0}});
    }
}

const ops::RopeSpec& Model::rope_for(const kv::KVCache& cache, uint32_t layer) const {
  const bool long_set = !rope_long_.empty() && cache.spec().capacity > spec_.rope_long_above;
  return (long_set ? rope_long_ : rope_)[spec_.layer_rope_table[layer]];
}

void Model::stack_layer(const std::string& p, Layer& L) {
  // q, k and v must share a weight type; their views in the stacked output
  // (ws.qkv()) start at Q and Q + KV floats, which the kernels read as float4.
  const uint64_t Q = spec_.n_heads * spec_.head_dim, KV = spec_.n_kv_heads * spec_.head_dim;
  if (L.q->type == L.k->type && L.k->type == L.v->type && Q % 4 == 0 && KV % 4 == 0) {
    L.qkv = weights_.stack_rows({p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"});
    if (spec_.attn_bias) L.qkv_bias = weights_.stack_rows({p + "attn_q.bias", p + "attn_k.bias", p + "attn_v.bias"});
  }
  if (L.gate->type == L.up->type) L.gate_up = weights_.stack_rows({p + "ffn_gate.weight", p + "ffn_up.weight"});
}

kv::KVCacheSpec Model::cache_spec(uint32_t capacity, uint32_t max_chunk, kv::StorePath store) const {
  return {spec_.n_layers, spec_.n_kv_heads, spec_.head_dim, capacity, spec_.layer_window, max_chunk, store};
}

void Model::check_cache(const kv::KVCache& cache) const {
  const kv::KVCacheSpec& c = cache.spec();
  if (c.n_layers != spec_.n_layers || c.n_kv_heads != spec_.n_kv_heads || c.head_dim != spec_.head_dim ||
      c.windows != spec_.layer_window)
    fail("the cache (" + str(c.n_layers) + " layers, " + str(c.n_kv_heads) + " kv heads of " + str(c.head_dim) +
         ") was not made for this model (" + str(spec_.n_layers) + " layers, " + str(spec_.n_kv_heads) +
         " kv heads of " + str(spec_.head_dim) + ", its sliding windows); use engine.new_cache()");
  for (uint32_t l = 1; l < c.n_layers; ++l)
    if (cache.length(l) != cache.length(0))
      fail("the cache's layers hold different lengths (layer 0: " + str(cache.length(0)) + ", layer " + str(l) +
           ": " + str(cache.length(l)) + "); a model step needs them equal");
}

void Model::linear(gpu::ComputeEncoder& enc, const ops::BufferView& x, const Weight& w, const Weight* bias,
                   const ops::BufferView& y, uint32_t n, bool accumulate) const {
  ops::MatmulArgs a;
  a.x = x;
  a.w = w.view;
  a.y = y;
  if (bias) a.bias = bias->view;
  a.n_tokens = n;
  a.n_in = uint32_t(w.cols());
  a.n_out = uint32_t(w.rows());
  a.wtype = w.type;
  a.accumulate = accumulate;
  ops::matmul(*device_, enc, a);
}

void Model::norm(gpu::ComputeEncoder& enc, const ops::BufferView& x, const Weight& w, const ops::BufferView& out,
                 uint32_t rows, uint32_t dim) const {
  ops::rms_norm(*device_, enc, x, w.view, w.type, out, rows, dim, spec_.rms_eps, spec_.norm_offset);
}

void Model::encode_layer(kv::EncoderSession& s, Workspace& ws, kv::KVCache& cache, uint32_t l, uint32_t n) const {
  const Layer& L = layers_[l];
  const ModelSpec& m = spec_;
  const uint32_t H = m.hidden;
  gpu::Device& dev = *device_;
  // A decode step's q/k/v come from one stacked matmul; a chunk's from three
  // gemms, each its own tile grid over the token-major outputs.
  const bool stacked_qkv = n == 1 && L.qkv.view.buffer;
  const size_t Q = size_t(m.n_heads) * m.head_dim, KV = size_t(m.n_kv_heads) * m.head_dim;
  const ops::BufferView q = stacked_qkv ? ws.qkv() : ws.q();
  const ops::BufferView k = stacked_qkv ? at(ws.qkv(), Q * sizeof(float)) : ws.k();
  const ops::BufferView v = stacked_qkv ? at(ws.qkv(), (Q + KV) * sizeof(float)) : ws.v();
  {
    gpu::ComputeEncoder& enc = s.compute();
    norm(enc, ws.x(), *L.attn_norm, ws.h(), n, H);
    if (stacked_qkv) {
      linear(enc, ws.h(), L.qkv, L.qkv_bias.view.buffer ? &L.qkv_bias : nullptr, ws.qkv(), n);
    } else {
      linear(enc, ws.h(), *L.q, L.q_bias, q, n);
      linear(enc, ws.h(), *L.k, L.k_bias, k, n);
      linear(enc, ws.h(), *L.v, L.v_bias, v, n);
    }
    if (m.qk_norm) {
      norm(enc, q, *L.q_norm, q, n * m.n_heads, m.head_dim);
      norm(enc, k, *L.k_norm, k, n * m.n_kv_heads, m.head_dim);
    }
  }
  // The store rotates K on its way into the cache and Q in place, in one dispatch.
  cache.store(s, l, k, v, n, &rope_for(cache, l), ops::QueryRope{q, m.n_heads});

  gpu::ComputeEncoder& enc = s.compute();  // the store may have switched to a blit encoder
  ops::AttentionDesc d;
  d.n_q_heads = m.n_heads;
  d.n_kv_heads = m.n_kv_heads;
  d.head_dim = m.head_dim;
  d.n_tokens = cache.length(l);
  d.n_queries = n;
  d.slots = cache.slots(l);
  d.window = cache.window(l);
  d.scale = m.scale();
  d.softcap = m.attn_softcap;
  if (n == 1)
    ops::attention_decode(enc, dev, d, q, cache.region(l), cache.table(l), ws.attn(), {},
                          ws.attention_scratch(ops::attention_decode_scratch_bytes(d)));
  else
    ops::attention_prefill(enc, dev, d, q, cache.region(l), cache.table(l), ws.attn(), {});

  // x += o (+ post-norm): without a sandwich norm the add is Wo's epilogue.
  if (L.post_attn_norm) {
    linear(enc, ws.attn(), *L.out, nullptr, ws.h(), n);
    norm(enc, ws.h(), *L.post_attn_norm, ws.h(), n, H);
    ops::add(dev, enc, ws.x(), ws.h(), n * H);
  } else {
    linear(enc, ws.attn(), *L.out, nullptr, ws.x(), n, /*accumulate=*/true);
  }

  norm(enc, ws.x(), *L.ffn_norm, ws.h(), n, H);
  if (n == 1 && L.gate_up.view.buffer) {
    ops::GluArgs g;
    g.x = ws.h();
    g.w = L.gate_up.view;
    g.y = ws.gate();
    g.n_in = H;
    g.n_out = m.ffn_hidden;
    g.wtype = L.gate_up.type;
    g.act = m.activation == Activation::silu ? ops::GluActivation::silu : ops::GluActivation::gelu_tanh;
    ops::matmul_glu(dev, enc, g);
  } else {
    linear(enc, ws.h(), *L.gate, nullptr, ws.gate(), n);
    linear(enc, ws.h(), *L.up, nullptr, ws.up(), n);
    if (m.activation == Activation::silu)
      ops::swiglu(dev, enc, ws.gate(), ws.up(), ws.gate(), n * m.ffn_hidden);
    else
      ops::geglu(dev, enc, ws.gate(), ws.up(), ws.gate(), n * m.ffn_hidden);
  }
  if (L.post_ffw_norm) {
    linear(enc, ws.gate(), *L.down, nullptr, ws.h(), n);
    norm(enc, ws.h(), *L.post_ffw_norm, ws.h(), n, H);
    ops::add(dev, enc, ws.x(), ws.h(), n * H);
  } else {
    linear(enc, ws.gate(), *L.down, nullptr, ws.x(), n, /*accumulate=*/true);
  }
}

void Model::encode_step(kv::EncoderSession& s, Workspace& ws, kv::KVCache& cache, uint32_t n,
                        uint32_t n_logits) const {
  if (n == 0 || n > ws.max_tokens())
    fail("a step takes 1.." + str(ws.max_tokens()) + " tokens, got " + str(n));
  if (n_logits == 0 || n_logits > n) fail("n_logits must be in 1..n (" + str(n) + "), got " + str(n_logits));
  check_cache(cache);
  for (uint32_t l = 0; l < spec_.n_layers; ++l) cache.check_store(l, n);  // fail before any layer moves
  // Token i goes to position length + i: the K store takes them from the cache.

  const uint32_t H = spec_.hidden;
  ops::embedding(*device_, s.compute(), embd_->view, embd_->type, ws.ids_view(), ws.x(), n, H, spec_.vocab,
                 spec_.embedding_scale);
  for (uint32_t l = 0; l < spec_.n_layers; ++l) {
    encode_layer(s, ws, cache, l, n);
    if ((l + 1) % kLayersPerCommandBuffer == 0 && l + 1 < spec_.n_layers) s.flush();
  }

  gpu::ComputeEncoder& enc = s.compute();
  const ops::BufferView last = at(ws.x(), size_t(n - n_logits) * H * sizeof(float));
  norm(enc, last, *out_norm_, ws.h(), n_logits, H);
  linear(enc, ws.h(), *lm_head_, nullptr, ws.logits(), n_logits);
  if (spec_.final_softcap > 0)
    ops::softcap(*device_, enc, ws.logits(), n_logits * spec_.vocab, spec_.final_softcap);
}

}  // namespace mkv::model
