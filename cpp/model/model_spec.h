// What the forward pass needs to know about a model, beyond its tensors.
//
// The Python side maps a source architecture (python/metalkv/models/
// architectures.py, then model_spec.py) to these switches, so the C++ forward has
// no architecture names: a Gemma 3 layer is a Llama layer with qk_norm,
// sandwich_norms, GeGLU, an embedding scale and (1 + w) norms; a Phi-3 layer
// one with a rotary_dim below head_dim and LongRoPE's two table sets.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/rope.h"

namespace mkv::model {

enum class Activation { silu, gelu_tanh };  // gates ffn_up: SwiGLU or GeGLU

struct ModelSpec {
  uint32_t n_layers = 0;
  uint32_t hidden = 0;
  uint32_t n_heads = 0;
  uint32_t n_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t ffn_hidden = 0;
  uint32_t vocab = 0;

  float rms_eps = 1e-5f;
  float norm_offset = 0.0f;      // rms_norm(x) * (norm_offset + w): 1 for HF Gemma
  float embedding_scale = 1.0f;  // x = token_embd[id] * scale: sqrt(hidden) for Gemma
  float attn_scale = 0.0f;       // multiplies q.k; 0 = 1/sqrt(head_dim)
  float attn_softcap = 0.0f;     // 0 = off
  float final_softcap = 0.0f;    // logits = c * tanh(logits / c); 0 = off
  Activation activation = Activation::silu;

  bool attn_bias = false;       // q/k/v projections carry a bias (Qwen2)
  bool qk_norm = false;         // per-head RMSNorm of q and k before rope (Gemma 3)
  bool sandwich_norms = false;  // norms after attention and ffn too (Gemma 3)
  bool tied_embeddings = false; // lm_head = token_embd

  // RoPE: one style for the model; per layer a window (0 = full attention)
  // and which frequency table it uses (full and sliding layers may differ,
  // Gemma 3: 1e6 with scaling vs 1e4). Tables hold rotary_dim/2 floats.
  ops::RopeStyle rope_style = ops::RopeStyle::neox;
  uint32_t rotary_dim = 0;  // 0 = head_dim; the first rotary_dim dims of a head rotate
  std::vector<std::vector<float>> rope_tables;
  std::vector<uint32_t> layer_rope_table;  // per layer: index into rope_tables
  std::vector<uint32_t> layer_window;      // per layer: 0 = full, W = sliding window
  // LongRoPE (Phi-3): a cache holding more than rope_long_above tokens uses
  // these tables instead of rope_tables (the same count and sizes), for all its
  // positions, as llama.cpp picks by context size. Empty = one set.
  std::vector<std::vector<float>> rope_tables_long;
  uint32_t rope_long_above = 0;

  // KV sharing (Gemma 3n's last layers; Engine.load(kv_share=) for any model, MiniCache-style):
  // per layer, the cache layer it attends over. The first layer to name a cache layer is its
  // writer, and cache layers are numbered 0.. in that order; a later layer naming it is a
  // reader: it stores no K and V and attends over the writer's (the same step's rows
  // included), with its own queries and rope. A reader's window is its writer's. Empty:
  // every layer writes its own.
  std::vector<uint32_t> kv_layer;
  uint32_t n_kv_layers() const;                // cache layers
  uint32_t kv_of(uint32_t layer) const;        // the cache layer `layer` attends over
  bool writes_kv(uint32_t layer) const;        // whether `layer` stores its cache layer's K and V
  uint32_t kv_writer(uint32_t cache_layer) const;  // the layer that stores it
  std::vector<uint32_t> kv_windows() const;    // per cache layer: its writer's window

  // Gemma 3n's decoder (all off by default; model.h says what each layer then does):
  // AltUp keeps altup_inputs streams of the hidden state and each layer computes on
  // stream altup_active; per-layer inputs (per_layer_dim P) feed every layer P values
  // from its token's row of per_layer_token_embd and a projection of the embedding;
  // LAuReL adds a rank-laurel_rank residual beside attention; v is RMS-normed per head
  // (no weight); a layer with ffn_sparse keeps only the gate values above
  // mean + ffn_sparse_std * std of its row.
  uint32_t altup_inputs = 0;  // 0: one residual stream
  uint32_t altup_active = 0;
  uint32_t per_layer_dim = 0;
  uint32_t per_layer_vocab = 0;  // per_layer_token_embd's rows (ids beyond read row 0, as transformers')
  uint32_t laurel_rank = 0;
  bool v_norm = false;
  std::vector<uint8_t> ffn_sparse;   // per layer, or empty: none
  std::vector<float> ffn_sparse_std;  // per layer
  bool sparse_ffn(uint32_t layer) const { return !ffn_sparse.empty() && ffn_sparse[layer]; }

  // Raises GpuError "[model] ..." naming the first inconsistent field.
  void validate() const;
  float scale() const;  // attn_scale, or 1/sqrt(head_dim) when 0
};

}  // namespace mkv::model
