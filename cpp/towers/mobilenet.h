// MobileNet: Gemma 3n's vision tower (timm's MobileNet-V5 encoder, mobilenetv5_300m_enc)
// and its multimodal embedder, from an image to the text model's soft tokens.
//
//   stem:       3x3 conv, stride 2, bias -> RMSNorm -> GELU
//   edge:       k x k conv (stride s) -> RMSNorm -> GELU -> 1x1 -> RMSNorm       (+ x when it keeps the shape)
//   inverted:   [k_start dw -> RMSNorm] -> 1x1 -> RMSNorm -> GELU
//               -> [k_mid dw (stride s) -> RMSNorm -> GELU] -> 1x1 -> RMSNorm -> · γ   (+ x likewise)
//   attention:  RMSNorm -> q = 1x1;  k, v = [kv_kernel dw (stride kv_stride) -> RMSNorm] -> 1x1
//               -> multi-query attention (heads of key_dim over one K and V head) -> 1x1 -> · γ  + x
//   fusion (MSFA): the outputs of blocks fuse[0] (finer) and fuse[1], the coarser upsampled
//               (nearest) to the finer grid, concatenated -> 1x1 -> RMSNorm -> GELU -> 1x1
//               -> RMSNorm -> average pool to resolution² -> RMSNorm
//   -> · sqrt(hidden) -> the embedder (tower_ops.h): resolution² soft tokens of text_hidden
//
// Every RMSNorm is timm's RmsNorm2d (x * w over the channels of a pixel); every
// padding TensorFlow's "same" (the zeros a stride-s conv needs, the odd one after).
// Activations are channels last (a pixel's channels are a row), so a 1x1 conv is a
// gemm over the pixels and the k x k convs are gemms over im2col rows. The fusion's
// first 1x1 over the concatenation is split by the loader into its two column blocks
// (exp_hi, exp_lo): the coarse half runs on the coarse grid before the upsampling
// (a 1x1 conv commutes with it). Attention runs through the prefill kernels, one
// bidirectional block over the keys, queries in chunks of at most as many as keys.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpu/device.h"
#include "model/weights.h"
#include "towers/tower_ops.h"

namespace mkv::towers {

struct MobileBlock {
  enum Kind : uint32_t { edge = 0, inverted = 1, attention = 2 };
  uint32_t kind = edge;
  uint32_t in = 0, out = 0;  // channels
  uint32_t mid = 0;          // edge, inverted: the expansion's channels
  uint32_t k = 0;            // edge: the expansion conv's kernel
  uint32_t k_start = 0;      // inverted: the depthwise convs' kernels (0: none)
  uint32_t k_mid = 0;
  uint32_t stride = 1;       // edge: the conv's; inverted: k_mid's (k_start's without one)
  uint32_t heads = 0, key_dim = 0;       // attention (value_dim = key_dim)
  uint32_t kv_stride = 1, kv_kernel = 0;  // attention: K and V's depthwise downsampling (stride 1: none)
  bool skip() const { return stride == 1 && in == out; }
};

struct MobileNetSpec {
  uint32_t image = 0;     // the square input's side
  uint32_t stem = 0;      // the stem's channels
  std::vector<MobileBlock> blocks;
  uint32_t fuse[2] = {0, 0};  // blocks whose outputs the fusion takes (fuse[0] < fuse[1] = the last)
  uint32_t fusion_mid = 0;    // the fusion's expansion channels
  uint32_t hidden = 0;        // the tower's output channels
  uint32_t resolution = 0;    // the output grid's side
  uint32_t vocab = 0;         // the embedder's hard tokens
  uint32_t text_hidden = 0;
  float eps = 1e-6f;          // the tower's RMSNorms'
  float mm_eps = 1e-6f;       // the embedder's
  uint32_t tokens_per_image() const { return resolution * resolution; }
};

// Tensor names (canonical, as the loader writes them; i the block, 0-based over all stages):
//   v.stem.weight (stem, 3 3 3 rounded up to 4), v.stem.bias, v.stem.norm (stem);
//   edge:      v.blk.i.exp (mid, in k k rounded up to 4), .exp_norm (mid), .proj (out, mid), .proj_norm (out);
//   inverted:  v.blk.i.dw_start (k_start², in), .dw_start_norm (in)      [k_start > 0]
//              .pw_exp (mid, in), .pw_exp_norm (mid),
//              .dw_mid (k_mid², mid), .dw_mid_norm (mid)                  [k_mid > 0]
//              .pw_proj (out, mid), .pw_proj_norm (out), .gamma (out);
//   attention: v.blk.i.norm (in), .q (heads key_dim, in), .k, .v (key_dim, in),
//              .k_down, .v_down (kv_kernel², in), .k_down_norm, .v_down_norm (in)  [kv_stride > 1]
//              .o (out, heads key_dim), .gamma (out);
//   v.msfa.exp_hi (fusion_mid, out of fuse[0]), v.msfa.exp_lo (fusion_mid, out of fuse[1]),
//   v.msfa.exp_norm (fusion_mid), v.msfa.proj (hidden, fusion_mid), v.msfa.proj_norm, v.msfa.norm (hidden);
//   the embedder's mm.* (tower_ops.h Embedder).
// Depthwise taps are (k², channels), tap ky k + kx. Vectors f32; matrices f32, f16 or bf16.
class MobileNet {
 public:
  // Checks the spec and every tensor (present, shape, type); raises GpuError "[mobilenet] ...".
  MobileNet(gpu::DevicePtr device, MobileNetSpec spec, model::Weights weights);

  const MobileNetSpec& spec() const { return spec_; }
  size_t weights_nbytes() const { return weights_.nbytes(); }

  // pixels (n_images, image, image, 3) float32, channels last -> (n_images
  // tokens_per_image, text_hidden) float32, the tokens in the output grid's row-major order.
  std::vector<float> encode(const float* pixels, uint32_t n_images);

  // The embedder's rows of hard tokens 0 .. vocab - 1 ((vocab, text_hidden) float32).
  const std::vector<float>& hard_rows() const { return hard_; }

 private:
  struct Block {
    const model::Weight *a = nullptr, *a_norm = nullptr;  // edge: exp; inverted: dw_start; attention: norm
    const model::Weight *b = nullptr, *b_norm = nullptr;  // edge: proj; inverted: pw_exp; attention: q
    const model::Weight *c = nullptr, *c_norm = nullptr;  // inverted: dw_mid; attention: k_down
    const model::Weight *d = nullptr, *d_norm = nullptr;  // inverted: pw_proj; attention: v_down
    const model::Weight *k = nullptr, *v = nullptr, *o = nullptr, *gamma = nullptr;
    uint32_t side_in = 0, side_out = 0;
  };
  const model::Weight& need(const std::string& name, std::vector<uint64_t> shape, bool matrix) const;
  void check_spec() const;
  void reserve();
  void run_edge(gpu::ComputeEncoder& enc, const MobileBlock& m, const Block& b);
  void run_inverted(gpu::ComputeEncoder& enc, const MobileBlock& m, const Block& b);
  void run_attention(gpu::ComputeEncoder& enc, const MobileBlock& m, const Block& b);
  void run_fusion(gpu::ComputeEncoder& enc);

  gpu::DevicePtr device_;
  MobileNetSpec spec_;
  model::Weights weights_;
  std::vector<Block> blocks_;
  const model::Weight *stem_w_, *stem_b_, *stem_norm_;
  const model::Weight *exp_hi_, *exp_lo_, *exp_norm_, *proj_, *proj_norm_, *fusion_norm_;
  std::unique_ptr<Embedder> embedder_;
  gpu::CommandQueuePtr queue_;
  std::vector<float> hard_;
  uint32_t stem_side_ = 0;
  bool reserved_ = false;
  gpu::BufferPtr in_, cols_, x_, h_, t_, mid_, mid2_, q_, k_, v_, attn_, kv_, table_, up_ids_;
  gpu::BufferPtr fused_, coarse_, wide_, pooled_, normed_, out_;
};

}  // namespace mkv::towers
