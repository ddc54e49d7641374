// Siglip: Gemma 3's vision tower (SigLIP's encoder) and its multimodal
// projector, from an image's pixels to the text model's soft tokens.
//
//   x = patches · W_patchᵀ + b + position          (the stride-p convolution as a gemm)
//   per layer: x += attn(LayerNorm(x));  x += fc2(gelu_tanh(fc1(LayerNorm(x))))
//   y = LayerNorm_post(x)  →  AvgPool k×k over the patch grid  →  RMSNorm (1 + w)
//     →  · W_projᵀ  (tokens_per_image rows of text_hidden)   (RMSNorm's weight: mm_norm_offset + w)
//
// Attention is bidirectional over an image's patches (one block, ops/attention.h),
// each image alone, its K and V written as f16 into a scratch pool by the q/k/v
// gemm's epilogue (MatmulArgs::split_f16). A head_dim the
// kernels lack (SigLIP's 72) is padded by the loader with zero rows of q/k/v and
// zero columns of the output projection (zeros add nothing to q·k or to the output);
// `scale` stays the checkpoint's head_dim^-0.5.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "gpu/device.h"
#include "model/weights.h"

namespace mkv::towers {

struct SiglipSpec {
  uint32_t n_layers = 0;
  uint32_t hidden = 0;
  uint32_t n_heads = 0;
  uint32_t head_dim = 0;     // as stored (padded to one the attention kernels take)
  uint32_t ffn = 0;          // the MLP's width
  uint32_t channels = 3;     // the image's
  uint32_t patch = 0;        // pixels along a patch's side
  uint32_t patch_dim = 0;    // channels * patch² (the patch's (channel, y, x) values) or more: zeros after them
  uint32_t grid = 0;         // patches along a side: n_patches = grid²
  uint32_t pool = 1;         // the projector's pooling window (grid / pool)² tokens
  uint32_t text_hidden = 0;  // the text model's width
  float eps = 1e-6f;         // the LayerNorms'
  float mm_eps = 1e-6f;      // the soft-embedding RMSNorm's
  float mm_norm_offset = 1.0f;  // its weight is (offset + w): Gemma's 1 + w; 0 where a file stores 1 + w (GGUF)
  float scale = 0.0f;        // q·k scale (the checkpoint's head_dim^-0.5)
  // On matrix units: the layers' gemms take their activations in the weights'
  // 16-bit type (f16 or bf16 weights; MatmulArgs::activations_16bit) and
  // attention its Q and P in half (AttentionDesc::half_operands), sums in
  // float. Elsewhere, or with f32 weights, no change.
  bool operands_16bit = false;
  uint32_t n_patches() const { return grid * grid; }
  uint32_t image_size() const { return grid * patch; }
  uint32_t tokens_per_image() const { return (grid / pool) * (grid / pool); }
};

// Tensor names (canonical, as the loader writes them; i the layer):
//   v.patch_embd.weight (hidden, patch_dim), v.patch_embd.bias (hidden),
//   v.position_embd.weight (n_patches, hidden) f32,
//   v.blk.i.ln1.{weight,bias}, v.blk.i.attn_qkv.weight (3 n_heads head_dim, hidden),
//   v.blk.i.attn_qkv.bias, v.blk.i.attn_out.weight (hidden, n_heads head_dim),
//   v.blk.i.attn_out.bias, v.blk.i.ln2.{weight,bias}, v.blk.i.ffn_up.{weight,bias}
//   (ffn, hidden), v.blk.i.ffn_down.{weight,bias} (hidden, ffn), v.post_ln.{weight,bias},
//   mm.soft_emb_norm.weight (hidden), mm.input_projection.weight (text_hidden, hidden).
// Norms and biases f32; matrices f32, f16 or bf16.
class Siglip {
 public:
  // Checks every tensor (present, shape, type); raises GpuError "[siglip] ...".
  Siglip(gpu::DevicePtr device, SiglipSpec spec, model::Weights weights);

  const SiglipSpec& spec() const { return spec_; }
  size_t weights_nbytes() const { return weights_.nbytes(); }

  // pixels (n_images, channels, image_size, image_size) float32, as the
  // processor prepares them → (n_images, tokens_per_image, text_hidden)
  // float32, in one command queue's work, waited for. The patches are cut on
  // the device (ops::image_patches). Buffers grow to the largest call and are kept.
  std::vector<float> encode(const float* pixels, uint32_t n_images);

 private:
  struct Layer {
    const model::Weight *ln1_w, *ln1_b, *qkv, *qkv_b, *out, *out_b, *ln2_w, *ln2_b, *up, *up_b, *down, *down_b;
  };
  const model::Weight& need(const std::string& name, std::vector<uint64_t> shape, bool matrix) const;
  void reserve(uint32_t n_images);

  gpu::DevicePtr device_;
  SiglipSpec spec_;
  model::Weights weights_;
  std::vector<Layer> layers_;
  const model::Weight *patch_w_, *patch_b_, *pos_, *post_w_, *post_b_, *mm_norm_, *mm_proj_;
  gpu::CommandQueuePtr queue_;
  uint32_t capacity_ = 0;  // images the buffers hold
  gpu::BufferPtr pixels_, patches_, x_, h_, q_, attn_, ffn_, pooled_, normed_, out_, kv_, table_;
};

}  // namespace mkv::towers
