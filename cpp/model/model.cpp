#include "model/model.h"

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
    // a layer that reads another's K and V (spec_.kv_layer) projects no k and v: a file's
    // attn_k / attn_v of it (Gemma 3n's carry zeros) are not used
    const bool kv = spec_.writes_kv(l);
    L.reads_kv = !kv;
    shares_kv_ = shares_kv_ || !kv;
    L.attn_norm = require(p + "attn_norm.weight", {H}, false);
    L.q = require(p + "attn_q.weight", {Q, H}, true);
    L.k = opt(kv, "attn_k.weight", {KV, H}, true);
    L.v = opt(kv, "attn_v.weight", {KV, H}, true);
    L.q_bias = opt(spec_.attn_bias, "attn_q.bias", {Q}, false);
    L.k_bias = opt(spec_.attn_bias && kv, "attn_k.bias", {KV}, false);
    L.v_bias = opt(spec_.attn_bias && kv, "attn_v.bias", {KV}, false);
    L.q_norm = opt(spec_.qk_norm, "attn_q_norm.weight", {D}, false);
    L.k_norm = opt(spec_.qk_norm && kv, "attn_k_norm.weight", {D}, false);
    L.out = require(p + "attn_output.weight", {H, Q}, true);
    L.post_attn_norm = opt(spec_.sandwich_norms, "post_attention_norm.weight", {H}, false);
    L.ffn_norm = require(p + "ffn_norm.weight", {H}, false);
    L.gate = require(p + "ffn_gate.weight", {F, H}, true);
    L.up = require(p + "ffn_up.weight", {F, H}, true);
    L.down = require(p + "ffn_down.weight", {H, F}, true);
    L.post_ffw_norm = opt(spec_.sandwich_norms, "post_ffw_norm.weight", {H}, false);
    require_altup(p, L);
    for (const Weight* b : {L.q_bias, L.k_bias, L.v_bias})
      if (b && b->type != ops::WeightType::f32) fail("bias tensors must be f32 (" + p + "attn_*.bias)");
    stack_layer(p, L);
    layers_.push_back(L);
  }
  if (const uint64_t N = spec_.altup_inputs) {
    for (uint64_t k = 0; k + 1 < N; ++k) {
      altup_in_.push_back(require("altup_proj." + str(k) + ".weight", {H, H}, true));
      altup_out_.push_back(require("altup_unembd_proj." + str(k) + ".weight", {H, H}, true));
    }
    if (const uint64_t P = spec_.per_layer_dim) {
      per_layer_embd_ = require("per_layer_token_embd.weight", {spec_.per_layer_vocab, spec_.n_layers * P}, true);
      per_layer_proj_ = require("per_layer_model_proj.weight", {spec_.n_layers * P, H}, true);
      per_layer_norm_ = require("per_layer_proj_norm.weight", {P}, false);
    }
  }
  if (spec_.v_norm) {
    const std::vector<float> ones(D, 1.0f);
    gpu::BufferPtr b = device_->new_buffer(D * sizeof(float));
    b->write(0, ones.data(), D * sizeof(float));
    ones_ = {{b, 0}, ops::WeightType::f32, {D}};
  }
  kv_windows_ = spec_.kv_windows();
  const uint32_t rd = spec_.rotary_dim ? spec_.rotary_dim : spec_.head_dim;
  for (auto [tables, specs] : {std::pair{&spec_.rope_tables, &rope_}, {&spec_.rope_tables_long, &rope_long_}})
    for (const auto& table : *tables) {
      gpu::BufferPtr b = device_->new_buffer(table.size() * sizeof(float));
      b->write(0, table.data(), table.size() * sizeof(float));
      specs->push_back({spec_.rope_style, rd, {b, 0}});
    }
}

const ops::RopeSpec& Model::rope_for(const kv::KvCache& cache, uint32_t layer) const {
  const bool long_set = !rope_long_.empty() && cache.spec().capacity > spec_.rope_long_above;
  return (long_set ? rope_long_ : rope_)[spec_.layer_rope_table[layer]];
}

void Model::stack_layer(const std::string& p, Layer& L) {
  // q, k and v must share a weight type; their views in the stacked output
  // (ws.qkv()) start at Q and Q + KV floats, which the kernels read as float4.
  const uint64_t Q = spec_.n_heads * spec_.head_dim, KV = spec_.n_kv_heads * spec_.head_dim;
  if (L.k && L.q->type == L.k->type && L.k->type == L.v->type && Q % 4 == 0 && KV % 4 == 0) {
    L.qkv = weights_.stack_rows({p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"});
    if (spec_.attn_bias) L.qkv_bias = weights_.stack_rows({p + "attn_q.bias", p + "attn_k.bias", p + "attn_v.bias"});
  }
  if (L.gate->type == L.up->type) L.gate_up = weights_.stack_rows({p + "ffn_gate.weight", p + "ffn_up.weight"});
}

kv::KvCacheSpec Model::cache_spec(uint32_t capacity, uint32_t max_chunk, kv::StorePath store,
                                  std::vector<uint32_t> k_formats, std::vector<uint32_t> v_formats,
                                  bool rotate, uint32_t residual, const kv::KvPolicySpec& policy) const {
  return {uint32_t(kv_windows_.size()), spec_.n_kv_heads, spec_.head_dim, capacity, kv_windows_, max_chunk, store,
          std::move(k_formats), std::move(v_formats), rotate, residual, policy};
}

void Model::check_cache(const kv::KvCache& cache) const {
  const kv::KvCacheSpec& c = cache.spec();
  if (c.n_layers != kv_windows_.size() || c.n_kv_heads != spec_.n_kv_heads || c.head_dim != spec_.head_dim ||
      c.windows != kv_windows_)
    fail("the cache (" + str(c.n_layers) + " layers, " + str(c.n_kv_heads) + " kv heads of " + str(c.head_dim) +
         ") was not made for this model (" + str(kv_windows_.size()) + " layers of K and V, " +
         str(spec_.n_kv_heads) + " kv heads of " + str(spec_.head_dim) +
         ", its sliding windows); use engine.new_cache()");
  for (uint32_t l = 1; l < c.n_layers; ++l)
    if (cache.length(l) != cache.length(0))
      fail("the cache's layers hold different lengths (layer 0: " + str(cache.length(0)) + ", layer " + str(l) +
           ": " + str(cache.length(l)) + "); a model step needs them equal");
}

}  // namespace mkv::model
