#include "model/model_spec.h"

#include <cmath>

#include "ops/attention.h"
#include "ops/ops.h"

namespace mkv::model {
namespace {

[[noreturn]] void fail(const std::string& m) { ops::fail("model", m); }
std::string str(uint64_t v) { return std::to_string(v); }

}  // namespace

void ModelSpec::validate() const {
  if (!n_layers || !hidden || !n_heads || !n_kv_heads || !head_dim || !ffn_hidden || !vocab)
    fail("n_layers, hidden, n_heads, n_kv_heads, head_dim, ffn_hidden and vocab must be positive");
  if (n_heads % n_kv_heads)
    fail("n_heads " + str(n_heads) + " is not a multiple of n_kv_heads " + str(n_kv_heads));
  if (!ops::attention_head_dim_supported(head_dim))
    fail("head_dim " + str(head_dim) + " is not supported; the attention kernels take " +
         ops::attention_head_dims_text());
  // float4 loads of activation rows (matmul inputs, row offsets)
  if (hidden % 4 || ffn_hidden % 4)
    fail("hidden (" + str(hidden) + ") and ffn_hidden (" + str(ffn_hidden) + ") must be multiples of 4");
  const uint32_t rd = rotary_dim ? rotary_dim : head_dim;
  if (rd % 2 || rd > head_dim) fail("rotary_dim " + str(rd) + " must be even and at most head_dim");
  if (rope_tables.empty()) fail("no rope frequency table");
  for (const auto& t : rope_tables)
    if (t.size() != rd / 2)
      fail("a rope table has " + str(t.size()) + " frequencies; rotary_dim " + str(rd) + " needs " + str(rd / 2));
  if (!rope_tables_long.empty()) {
    if (rope_tables_long.size() != rope_tables.size() || !rope_long_above)
      fail("rope_tables_long needs one table per rope table (" + str(rope_tables.size()) +
           ") and rope_long_above > 0");
    for (const auto& t : rope_tables_long)
      if (t.size() != rd / 2)
        fail("a long rope table has " + str(t.size()) + " frequencies; rotary_dim " + str(rd) + " needs " +
             str(rd / 2));
  }
  if (layer_rope_table.size() != n_layers || layer_window.size() != n_layers)
    fail("layer_rope_table and layer_window need one entry per layer (" + str(n_layers) + ")");
  for (uint32_t l = 0; l < n_layers; ++l)
    if (layer_rope_table[l] >= rope_tables.size())
      fail("layer " + str(l) + " uses rope table " + str(layer_rope_table[l]) + " of " + str(rope_tables.size()));
  if (!kv_layer.empty()) {
    if (kv_layer.size() != n_layers) fail("kv_layer needs one entry per layer (" + str(n_layers) + ")");
    uint32_t next = 0;  // cache layers named so far
    for (uint32_t l = 0; l < n_layers; ++l) {
      if (kv_layer[l] > next)
        fail("layer " + str(l) + " attends over cache layer " + str(kv_layer[l]) + ", but only " + str(next) +
             " exist before it (cache layers are numbered in the order their writers come)");
      if (kv_layer[l] == next) {
        ++next;
        continue;
      }
      const uint32_t w = kv_writer(kv_layer[l]);
      if (layer_window[l] != layer_window[w])
        fail("layer " + str(l) + " (window " + str(layer_window[l]) + ") reads the K and V of layer " + str(w) +
             " (window " + str(layer_window[w]) + "); a reader needs its writer's window");
    }
  }
  if (altup_inputs == 1 || altup_inputs > 8 || (altup_inputs && altup_active >= altup_inputs))
    fail("altup_inputs " + str(altup_inputs) + " (0 or 2..8) with altup_active " + str(altup_active) + " below it");
  if (per_layer_dim && (!altup_inputs || !per_layer_vocab || per_layer_dim % 4))
    fail("per-layer inputs (per_layer_dim " + str(per_layer_dim) + ", a multiple of 4) need AltUp's streams and "
         "per_layer_vocab > 0");
  if (laurel_rank && !altup_inputs) fail("LAuReL (laurel_rank " + str(laurel_rank) + ") needs AltUp's streams");
  if (!ffn_sparse.empty() && (ffn_sparse.size() != n_layers || ffn_sparse_std.size() != n_layers))
    fail("ffn_sparse and ffn_sparse_std need one entry per layer (" + str(n_layers) + ")");
  for (float v : ffn_sparse_std)
    if (!std::isfinite(v)) fail("an ffn_sparse_std is not finite");
  for (float v : {rms_eps, embedding_scale, attn_scale, attn_softcap, final_softcap, norm_offset})
    if (!std::isfinite(v)) fail("a scalar of the spec is not finite");
  if (rms_eps < 0 || attn_scale < 0 || attn_softcap < 0 || final_softcap < 0)
    fail("rms_eps, attn_scale and the softcaps must be >= 0");
}

uint32_t ModelSpec::n_kv_layers() const {
  uint32_t n = 0;
  for (uint32_t l = 0; l < n_layers; ++l) n += writes_kv(l);
  return n;
}

uint32_t ModelSpec::kv_of(uint32_t layer) const { return kv_layer.empty() ? layer : kv_layer[layer]; }

bool ModelSpec::writes_kv(uint32_t layer) const {
  if (kv_layer.empty()) return true;
  for (uint32_t l = 0; l < layer; ++l)
    if (kv_layer[l] == kv_layer[layer]) return false;
  return true;
}

uint32_t ModelSpec::kv_writer(uint32_t cache_layer) const {
  for (uint32_t l = 0; l < n_layers; ++l)
    if (kv_of(l) == cache_layer) return l;
  fail("no layer writes cache layer " + str(cache_layer));
}

std::vector<uint32_t> ModelSpec::kv_windows() const {
  std::vector<uint32_t> w;
  for (uint32_t l = 0; l < n_layers; ++l)
    if (writes_kv(l)) w.push_back(layer_window[l]);
  return w;
}

float ModelSpec::scale() const { return attn_scale > 0 ? attn_scale : 1.0f / std::sqrt(float(head_dim)); }

}  // namespace mkv::model
