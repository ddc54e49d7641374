#include "towers/siglip.h"

#include "kv/encoder_session.h"
#include "metal/kv_params.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/vision.h"
#include "towers/tower_ops.h"

namespace mkv::towers {
namespace {

[[noreturn]] void fail(const std::string& m) { ops::fail("siglip", m); }
std::string str(uint64_t v) { return std::to_string(v); }

ops::BufferView at(const gpu::BufferPtr& b, size_t byte_offset = 0) { return {b, byte_offset}; }

constexpr uint32_t kLayersPerCommandBuffer = 4;  // as Model::encode_step: the GPU starts while the rest is encoded

}  // namespace

const model::Weight& Siglip::need(const std::string& name, std::vector<uint64_t> shape, bool matrix) const {
  return need_weight("siglip", weights_, name, shape, matrix);
}

Siglip::Siglip(gpu::DevicePtr device, SiglipSpec spec, model::Weights weights)
    : device_(std::move(device)), spec_(spec), weights_(std::move(weights)) {
  if (!device_) fail("device is null");
  const SiglipSpec& s = spec_;
  if (!s.n_layers || !s.hidden || !s.n_heads || !s.ffn || !s.channels || !s.patch || !s.patch_dim || !s.grid ||
      !s.pool || !s.text_hidden)
    fail("every size of the spec must be positive");
  if (s.patch_dim < s.channels * s.patch * s.patch)
    fail("patch_dim " + str(s.patch_dim) + " is less than channels x patch² (" + str(s.channels * s.patch * s.patch) +
         ")");
  if (s.grid % s.pool != 0) fail("the pooling window " + str(s.pool) + " does not divide the grid " + str(s.grid));
  if (!ops::attention_head_dim_supported(s.head_dim))
    fail("head_dim " + str(s.head_dim) + " is not one the attention kernels take (" +
         ops::attention_head_dims_text() + "); the loader pads it");
  if (!(s.scale > 0.0f)) fail("scale must be > 0");
  const uint64_t H = s.hidden, A = uint64_t(s.n_heads) * s.head_dim;
  patch_w_ = &need("v.patch_embd.weight", {H, s.patch_dim}, true);
  patch_b_ = &need("v.patch_embd.bias", {H}, false);
  pos_ = &need("v.position_embd.weight", {s.n_patches(), H}, false);
  for (uint32_t l = 0; l < s.n_layers; ++l) {
    const std::string p = "v.blk." + str(l) + ".";
    layers_.push_back({&need(p + "ln1.weight", {H}, false), &need(p + "ln1.bias", {H}, false),
                       &need(p + "attn_qkv.weight", {3 * A, H}, true), &need(p + "attn_qkv.bias", {3 * A}, false),
                       &need(p + "attn_out.weight", {H, A}, true), &need(p + "attn_out.bias", {H}, false),
                       &need(p + "ln2.weight", {H}, false), &need(p + "ln2.bias", {H}, false),
                       &need(p + "ffn_up.weight", {s.ffn, H}, true), &need(p + "ffn_up.bias", {s.ffn}, false),
                       &need(p + "ffn_down.weight", {H, s.ffn}, true), &need(p + "ffn_down.bias", {H}, false)});
  }
  post_w_ = &need("v.post_ln.weight", {H}, false);
  post_b_ = &need("v.post_ln.bias", {H}, false);
  mm_norm_ = &need("mm.soft_emb_norm.weight", {H}, false);
  mm_proj_ = &need("mm.input_projection.weight", {s.text_hidden, H}, true);
  queue_ = device_->new_command_queue();
}

void Siglip::reserve(uint32_t n_images) {
  if (n_images <= capacity_) return;
  const SiglipSpec& s = spec_;
  const size_t rows = size_t(n_images) * s.n_patches(), A = size_t(s.n_heads) * s.head_dim;
  const size_t tokens = size_t(n_images) * s.tokens_per_image();
  auto floats = [&](size_t n) { return device_->new_buffer(n * sizeof(float)); };
  pixels_ = floats(size_t(n_images) * s.channels * s.image_size() * s.image_size());
  patches_ = floats(rows * s.patch_dim);
  x_ = floats(rows * s.hidden);
  h_ = floats(rows * s.hidden);
  q_ = floats(rows * A);
  attn_ = floats(rows * A);
  ffn_ = floats(rows * s.ffn);
  pooled_ = floats(tokens * s.hidden);
  normed_ = floats(tokens * s.hidden);
  out_ = floats(tokens * s.text_hidden);
  if (!kv_) {  // one image's K and V at a time, as the q/k/v gemm writes them: f16 (slots, n_heads, head_dim), K then V
    constexpr uint32_t B = mkv_params::kKvBlockTokens;
    const uint32_t blocks = (s.n_patches() + B - 1) / B;
    kv_ = device_->new_buffer(size_t(blocks) * B * A * 2 * sizeof(uint16_t));
    std::vector<uint32_t> ids(blocks);
    for (uint32_t i = 0; i < blocks; ++i) ids[i] = i;
    table_ = device_->new_buffer(ids.size() * sizeof(uint32_t));
    table_->write(0, ids.data(), ids.size() * sizeof(uint32_t));
  }
  capacity_ = n_images;
}

std::vector<float> Siglip::encode(const float* pixels, uint32_t n_images) {
  if (n_images == 0) fail("encode needs at least one image");
  reserve(n_images);
  const SiglipSpec& s = spec_;
  gpu::Device& dev = *device_;
  const uint32_t P = s.n_patches(), rows = n_images * P, H = s.hidden, A = s.n_heads * s.head_dim;
  pixels_->write(0, pixels, size_t(n_images) * s.channels * s.image_size() * s.image_size() * sizeof(float));
  kv::EncoderSession session(*queue_);
  {
    gpu::ComputeEncoder& enc = session.compute();
    ops::image_patches(dev, enc, at(pixels_), at(patches_), {n_images, s.channels, s.grid, s.patch, s.patch_dim});
    linear(dev, enc, patches_, *patch_w_, patch_b_, x_, rows, false);
    for (uint32_t i = 0; i < n_images; ++i)
      ops::add(dev, enc, at(x_, size_t(i) * P * H * sizeof(float)), pos_->view, P * H);
  }
  constexpr uint32_t B = mkv_params::kKvBlockTokens;
  ops::AttentionDesc d;
  d.n_q_heads = d.n_kv_heads = s.n_heads;
  d.head_dim = s.head_dim;
  d.n_tokens = d.n_queries = P;
  d.slots = (P + B - 1) / B * B;
  d.scale = s.scale;
  d.blocks = {{0, P}};
  d.half_operands = s.operands_16bit;
  // 16-bit activations where the weights are 16-bit (f32 weights keep float ones).
  auto x16 = [&](const model::Weight& w) { return s.operands_16bit && w.type != ops::WeightType::f32; };
  const size_t v_section = size_t(d.slots) * A * sizeof(uint16_t);  // the pool's V after its K
  for (uint32_t l = 0; l < s.n_layers; ++l) {
    const Layer& L = layers_[l];
    gpu::ComputeEncoder& enc = session.compute();
    ops::layer_norm(dev, enc, at(x_), L.ln1_w->view, L.ln1_b->view, at(h_), rows, H, s.eps);
    for (uint32_t i = 0; i < n_images; ++i) {  // each image attends over its own patches
      // q/k/v of the image's patches: q float, K and V f16 straight into the pool.
      const size_t off = size_t(i) * P * A * sizeof(float);
      linear_qkv(dev, session.compute(), at(h_, size_t(i) * P * H * sizeof(float)), *L.qkv, L.qkv_b, at(q_, off),
                 at(kv_), at(kv_, v_section), P, x16(*L.qkv), true);
      ops::attention_prefill(dev, session.compute(), d, at(q_, off), at(kv_), at(table_), at(attn_, off), {});
    }
    gpu::ComputeEncoder& e2 = session.compute();
    linear(dev, e2, attn_, *L.out, L.out_b, x_, rows, true, x16(*L.out));
    ops::layer_norm(dev, e2, at(x_), L.ln2_w->view, L.ln2_b->view, at(h_), rows, H, s.eps);
    linear(dev, e2, h_, *L.up, L.up_b, ffn_, rows, false, x16(*L.up), ops::MatmulActivation::gelu_tanh);
    linear(dev, e2, ffn_, *L.down, L.down_b, x_, rows, true, x16(*L.down));
    if ((l + 1) % kLayersPerCommandBuffer == 0) session.flush();
  }
  const uint32_t T = s.tokens_per_image(), tokens = n_images * T;
  gpu::ComputeEncoder& enc = session.compute();
  ops::layer_norm(dev, enc, at(x_), post_w_->view, post_b_->view, at(h_), rows, H, s.eps);
  ops::avg_pool(dev, enc, at(h_), at(pooled_), n_images, s.grid, s.pool, H);
  ops::rms_norm(dev, enc, at(pooled_), mm_norm_->view, mm_norm_->type, at(normed_), tokens, H, s.mm_eps,
                s.mm_norm_offset);
  linear(dev, enc, normed_, *mm_proj_, nullptr, out_, tokens, false);
  session.finish();
  std::vector<float> result(size_t(tokens) * s.text_hidden);
  out_->read(0, result.data(), result.size() * sizeof(float));
  return result;
}

}  // namespace mkv::towers
