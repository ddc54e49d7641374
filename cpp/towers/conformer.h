// Conformer: Gemma 3n's audio tower (the Universal Speech Model's encoder) and
// its multimodal embedder, from a clip's log-mel frames to the text model's
// soft tokens.
//
//   2 x [conv2d (time padded after, frequency 1 each side) -> cumulative group norm -> ReLU]
//     -> · W_inᵀ  (hidden)
//   per layer:  x += ½ FFN(x);  x += attn(x);  x += lconv(x);  x += ½ FFN(x);  x = RMSNorm(x)
//     FFN:   RMSNorm -> up -> SiLU -> down -> RMSNorm
//     attn:  RMSNorm -> q, k, v -> local attention (left keys back, right ahead; relative
//            positions; soft cap) -> out -> RMSNorm
//     lconv: RMSNorm -> · W_startᵀ -> GLU -> causal depthwise conv -> RMSNorm -> SiLU -> · W_endᵀ
//   every reduction-th row -> RMSNorm (soft) -> · W_projᵀ -> RMSNorm (no scale)
//
// The convolutions run as im2col + gemm. transformers' clamps at ±gradient_clipping (1e10)
// are left out: the loader refuses a config whose clipping could bind. Padding frames
// (past the clip) are keys no query sees and rows whose output is replaced by the
// embedder's padding token, as transformers' Gemma3nModel does.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpu/device.h"
#include "model/weights.h"
#include "towers/tower_ops.h"

namespace mkv::towers {

struct ConvStage {
  uint32_t channels = 0;
  uint32_t kt = 0, kf = 0;  // the kernel in time and frequency
  uint32_t st = 0, sf = 0;  // its strides
};

struct ConformerSpec {
  uint32_t n_layers = 0;
  uint32_t hidden = 0;
  uint32_t n_heads = 0;
  uint32_t ffn = 0;           // the feed-forwards' width
  uint32_t n_mels = 0;        // features a frame
  ConvStage conv[2];
  uint32_t left = 0;          // keys before the query it sees (transformers' context_left - 1)
  uint32_t right = 0;         // keys after it
  uint32_t taps = 0;          // the light convolution's kernel
  uint32_t reduction = 1;     // one output row per reduction rows
  uint32_t vocab = 0;         // the embedder's hard tokens
  uint32_t text_hidden = 0;
  float softcap = 0.0f;
  float residual_weight = 0.5f;  // the feed-forwards'
  float eps = 1e-6f;             // the RMSNorms'
  float group_eps = 1e-3f;       // the cumulative group norms'
  float mm_eps = 1e-6f;          // the embedder's norms'
  uint32_t head_dim() const { return n_heads ? hidden / n_heads : 0; }
};

// Tensor names (canonical, as the loader writes them; s the conv stage, i the layer):
//   a.conv.s.weight (channels, cols: c_in kt kf rounded up to 4, zeros past), a.conv.s.norm (channels),
//   a.input_proj.weight (hidden, f_out channels of stage 1),
//   a.blk.i.ffn_{0,1}.{norm, post_norm} (hidden), .up (ffn, hidden), .down (hidden, ffn),
//   a.blk.i.attn.{norm, post_norm} (hidden), .qkv (3 hidden, hidden), .per_dim_scale (head_dim),
//   .pos (hidden, hidden), .out (hidden, hidden),
//   a.blk.i.conv.{norm, conv_norm} (hidden), .start (2 hidden, hidden), .taps (taps, hidden),
//   .end (hidden, hidden), a.blk.i.norm (hidden),
//   mm.embedding (vocab, hidden), mm.hard_norm, mm.soft_norm (hidden), mm.projection (text_hidden, hidden).
// Norms, per_dim_scale and taps f32; matrices f32, f16 or bf16.
class Conformer {
 public:
  // Checks every tensor (present, shape, type); raises GpuError "[conformer] ...".
  Conformer(gpu::DevicePtr device, ConformerSpec spec, model::Weights weights);

  const ConformerSpec& spec() const { return spec_; }
  size_t weights_nbytes() const { return weights_.nbytes(); }

  // Soft tokens a clip of n_frames frames yields before padding.
  uint32_t tokens_for(uint32_t n_frames) const;

  // features (n_frames, n_mels) float32, of which the first n_valid are the
  // clip's → (n_tokens, text_hidden) float32: the tower's rows, those of
  // padding frames and any past the tower's output the padding token's (the
  // embedder's last hard token), as transformers fills a clip's placeholder run.
  // Refuses n_tokens below tokens_for(n_frames).
  std::vector<float> encode(const float* features, uint32_t n_frames, uint32_t n_valid, uint32_t n_tokens);

  // The embedder's rows of hard tokens 0 .. vocab - 1 ((vocab, text_hidden) float32).
  const std::vector<float>& hard_rows() const { return hard_; }

 private:
  struct Ffn {
    const model::Weight *norm, *up, *down, *post_norm;
  };
  struct Layer {
    Ffn ffn[2];
    const model::Weight *attn_norm, *qkv, *out, *attn_post_norm;
    const model::Weight *conv_norm, *start, *taps, *conv_post_norm, *end, *norm;
    gpu::BufferPtr pos, qscale;  // the relative-position rows and q's scale, made at load
  };
  struct Geometry {
    uint32_t t[3], f[3], cols[2];  // frames and bins into and out of each stage; im2col widths
  };
  const model::Weight& need(const std::string& name, std::vector<uint64_t> shape, bool matrix) const;
  Geometry geometry(uint32_t n_frames) const;
  void reserve(uint32_t n_frames);
  void make_tables();

  gpu::DevicePtr device_;
  ConformerSpec spec_;
  model::Weights weights_;
  std::vector<Layer> layers_;
  const model::Weight *conv_w_[2], *conv_norm_[2], *input_proj_;
  std::unique_ptr<Embedder> embedder_;
  gpu::CommandQueuePtr queue_;
  std::vector<float> hard_;
  uint32_t capacity_ = 0;  // frames the buffers hold
  gpu::BufferPtr in_, cols_, conv_, stats_, x_, h_, q_, k_, v_, attn_, wide_, taken_, normed_, out_;
};

}  // namespace mkv::towers
