#include "towers/mobilenet.h"

#include <algorithm>
#include <cmath>

#include "kv/encoder_session.h"
#include "metal/audio_params.h"
#include "metal/kv_params.h"
#include "metal/vision_params.h"
#include "ops/attention.h"
#include "ops/audio.h"
#include "ops/elementwise.h"
#include "ops/kv_store.h"
#include "ops/vision.h"

namespace mkv::towers {
namespace {

[[noreturn]] void fail(const std::string& m) { ops::fail("mobilenet", m); }
std::string str(uint64_t v) { return std::to_string(v); }

ops::BufferView at(const gpu::BufferPtr& b, size_t offset = 0) { return {b, offset}; }

constexpr uint32_t kBlocksPerCommandBuffer = 8;  // the GPU starts while the rest is encoded
constexpr uint32_t kStemKernel = 3, kStemStride = 2, kColors = 3;

uint32_t round4(uint64_t n) { return uint32_t((n + 3) / 4 * 4); }
uint64_t sq(uint64_t side) { return side * side; }

// TensorFlow's "same" padding (timm's pad_type 'same'): ceil(side / stride) outputs, the
// zeros they need split with the odd one after.
struct Same {
  uint32_t out, before;
};
Same same(uint32_t side, uint32_t k, uint32_t stride) {
  const uint32_t out = (side + stride - 1) / stride;
  const int64_t total = std::max<int64_t>(int64_t(out - 1) * stride + k - side, 0);
  return {out, uint32_t(total / 2)};
}

}  // namespace

const model::Weight& MobileNet::need(const std::string& name, std::vector<uint64_t> shape, bool matrix) const {
  return need_weight("mobilenet", weights_, name, shape, matrix);
}

void MobileNet::check_spec() const {
  const MobileNetSpec& s = spec_;
  if (!s.image || !s.stem || s.blocks.empty() || !s.fusion_mid || !s.hidden || !s.resolution || !s.vocab ||
      !s.text_hidden)
    fail("every size of the spec must be positive");
  uint32_t channels = s.stem;
  for (size_t i = 0; i < s.blocks.size(); ++i) {
    const MobileBlock& m = s.blocks[i];
    const std::string b = "block " + str(i) + ": ";
    if (m.in != channels) fail(b + "takes " + str(m.in) + " channels; the one before gives " + str(channels));
    if (!m.in || !m.out || !m.stride) fail(b + "channels and stride must be positive");
    if (m.kind == MobileBlock::edge) {
      if (!m.mid || !m.k) fail(b + "an edge block needs mid and k");
    } else if (m.kind == MobileBlock::inverted) {
      if (!m.mid) fail(b + "an inverted block needs mid");
      if (m.stride > 1 && !m.k_start && !m.k_mid) fail(b + "a stride needs a depthwise conv");
    } else if (m.kind == MobileBlock::attention) {
      if (!m.heads || !m.key_dim || !m.kv_stride) fail(b + "an attention block needs heads, key_dim, kv_stride");
      if (m.stride != 1 || m.in != m.out) fail(b + "an attention block keeps its input's shape");
      if (m.kv_stride > 1 && !m.kv_kernel) fail(b + "a kv_stride needs kv_kernel");
      if (!ops::attention_head_dim_supported(m.key_dim))
        fail(b + "key_dim " + str(m.key_dim) + " is not one the attention kernels take (" +
             ops::attention_head_dims_text() + ")");
    } else {
      fail(b + "unknown kind " + str(m.kind));
    }
    channels = m.out;
  }
  if (s.fuse[1] + 1 != s.blocks.size() || s.fuse[0] >= s.fuse[1])
    fail("the fusion takes an earlier block and the last (fuse " + str(s.fuse[0]) + ", " + str(s.fuse[1]) + ")");
}

MobileNet::MobileNet(gpu::DevicePtr device, MobileNetSpec spec, model::Weights weights)
    : device_(std::move(device)), spec_(std::move(spec)), weights_(std::move(weights)) {
  if (!device_) fail("device is null");
  check_spec();
  const MobileNetSpec& s = spec_;
  stem_side_ = same(s.image, kStemKernel, kStemStride).out;
  stem_w_ = &need("v.stem.weight", {s.stem, round4(kColors * kStemKernel * kStemKernel)}, true);
  stem_b_ = &need("v.stem.bias", {s.stem}, false);
  stem_norm_ = &need("v.stem.norm", {s.stem}, false);
  uint32_t side = stem_side_;
  for (size_t i = 0; i < s.blocks.size(); ++i) {
    const MobileBlock& m = s.blocks[i];
    const std::string p = "v.blk." + str(i) + ".";
    Block b;
    b.side_in = side;
    if (m.kind == MobileBlock::edge) {
      b.a = &need(p + "exp", {m.mid, round4(uint64_t(m.in) * m.k * m.k)}, true);
      b.a_norm = &need(p + "exp_norm", {m.mid}, false);
      b.b = &need(p + "proj", {m.out, m.mid}, true);
      b.b_norm = &need(p + "proj_norm", {m.out}, false);
      side = same(side, m.k, m.stride).out;
    } else if (m.kind == MobileBlock::inverted) {
      if (m.k_start) {
        b.a = &need(p + "dw_start", {sq(m.k_start), m.in}, false);
        b.a_norm = &need(p + "dw_start_norm", {m.in}, false);
      }
      b.b = &need(p + "pw_exp", {m.mid, m.in}, true);
      b.b_norm = &need(p + "pw_exp_norm", {m.mid}, false);
      if (m.k_mid) {
        b.c = &need(p + "dw_mid", {sq(m.k_mid), m.mid}, false);
        b.c_norm = &need(p + "dw_mid_norm", {m.mid}, false);
      }
      b.d = &need(p + "pw_proj", {m.out, m.mid}, true);
      b.d_norm = &need(p + "pw_proj_norm", {m.out}, false);
      b.gamma = &need(p + "gamma", {m.out}, false);
      side = same(side, m.k_mid ? m.k_mid : m.k_start ? m.k_start : 1, m.stride).out;
    } else {
      const uint64_t A = uint64_t(m.heads) * m.key_dim;
      b.a_norm = &need(p + "norm", {m.in}, false);
      b.b = &need(p + "q", {A, m.in}, true);
      b.k = &need(p + "k", {m.key_dim, m.in}, true);
      b.v = &need(p + "v", {m.key_dim, m.in}, true);
      if (m.kv_stride > 1) {
        b.c = &need(p + "k_down", {sq(m.kv_kernel), m.in}, false);
        b.c_norm = &need(p + "k_down_norm", {m.in}, false);
        b.d = &need(p + "v_down", {sq(m.kv_kernel), m.in}, false);
        b.d_norm = &need(p + "v_down_norm", {m.in}, false);
      }
      b.o = &need(p + "o", {m.out, A}, true);
      b.gamma = &need(p + "gamma", {m.out}, false);
    }
    b.side_out = side;
    blocks_.push_back(b);
  }
  const uint32_t fine = blocks_[s.fuse[0]].side_out, coarse = blocks_[s.fuse[1]].side_out;
  if (fine < coarse) fail("the fusion's first block must have the finer grid");
  if (fine % s.resolution)
    fail("the fusion's grid " + str(fine) + " is not a multiple of the output's " + str(s.resolution) +
         ": timm resizes bilinearly there, which metalkv does not run");
  exp_hi_ = &need("v.msfa.exp_hi", {s.fusion_mid, s.blocks[s.fuse[0]].out}, true);
  exp_lo_ = &need("v.msfa.exp_lo", {s.fusion_mid, s.blocks[s.fuse[1]].out}, true);
  exp_norm_ = &need("v.msfa.exp_norm", {s.fusion_mid}, false);
  proj_ = &need("v.msfa.proj", {s.hidden, s.fusion_mid}, true);
  proj_norm_ = &need("v.msfa.proj_norm", {s.hidden}, false);
  fusion_norm_ = &need("v.msfa.norm", {s.hidden}, false);
  embedder_ = std::make_unique<Embedder>("mobilenet", *device_, weights_, s.vocab, s.hidden, s.text_hidden, s.mm_eps);
  queue_ = device_->new_command_queue();
  hard_ = embedder_->hard_rows(*device_, *queue_);
}

// Buffers for the largest of each kind of activation, over every block; made on the first encode.
void MobileNet::reserve() {
  if (reserved_) return;
  const MobileNetSpec& s = spec_;
  constexpr uint32_t B = mkv_params::kKvBlockTokens;
  uint64_t x = sq(stem_side_) * s.stem, cols = sq(stem_side_) * round4(kColors * kStemKernel * kStemKernel);
  uint64_t t = 0, mid = 0, mid2 = 0, q = 0, kv = 0, pool = 0;
  for (size_t i = 0; i < s.blocks.size(); ++i) {
    const MobileBlock& m = s.blocks[i];
    const uint64_t n_in = sq(blocks_[i].side_in), n_out = sq(blocks_[i].side_out);
    x = std::max({x, n_in * m.in, n_out * m.out});
    if (m.kind == MobileBlock::edge) {
      cols = std::max<uint64_t>(cols, n_out * round4(uint64_t(m.in) * m.k * m.k));
      mid = std::max(mid, n_out * m.mid);
    } else if (m.kind == MobileBlock::inverted) {
      const uint64_t n_exp = m.k_mid ? n_in : n_out;  // pw_exp runs before the strided conv when there is k_mid
      t = std::max(t, n_exp * m.in);
      mid = std::max(mid, n_exp * m.mid);
      mid2 = std::max(mid2, n_out * m.mid);
    } else {
      const uint64_t n_kv = m.kv_stride > 1 ? sq(same(blocks_[i].side_in, m.kv_kernel, m.kv_stride).out) : n_in;
      t = std::max(t, n_kv * m.in);
      q = std::max(q, n_in * m.heads * m.key_dim);
      kv = std::max(kv, n_kv * m.key_dim);
      pool = std::max(pool, (n_kv + B - 1) / B * B * m.key_dim);
    }
  }
  const uint64_t fine = sq(blocks_[s.fuse[0]].side_out), coarse = sq(blocks_[s.fuse[1]].side_out);
  auto floats = [&](uint64_t n) { return device_->new_buffer(std::max<uint64_t>(n, 1) * sizeof(float)); };
  in_ = floats(sq(s.image) * kColors);
  cols_ = floats(cols);
  x_ = floats(x);
  h_ = floats(x);
  t_ = floats(t);
  mid_ = floats(mid);
  mid2_ = floats(mid2);
  q_ = floats(q);
  attn_ = floats(q);
  k_ = floats(kv);
  v_ = floats(kv);
  kv_ = device_->new_buffer(std::max<uint64_t>(pool, 1) * 2 * sizeof(uint16_t));  // f16 K, then V
  std::vector<uint32_t> ids(std::max<uint64_t>(pool, B) / B);
  for (uint32_t i = 0; i < ids.size(); ++i) ids[i] = i;
  table_ = device_->new_buffer(ids.size() * sizeof(uint32_t));
  table_->write(0, ids.data(), ids.size() * sizeof(uint32_t));
  // the coarse grid's nearest pixel for each fine one, as torch's interpolate(mode="nearest")
  const uint32_t fs = blocks_[s.fuse[0]].side_out, cs = blocks_[s.fuse[1]].side_out;
  const float ratio = float(cs) / float(fs);
  std::vector<int32_t> up(fine);
  for (uint32_t y = 0; y < fs; ++y)
    for (uint32_t xx = 0; xx < fs; ++xx) {
      const auto src = [&](uint32_t d) { return std::min(uint32_t(std::floor(float(d) * ratio)), cs - 1); };
      up[y * fs + xx] = int32_t(src(y) * cs + src(xx));
    }
  up_ids_ = device_->new_buffer(up.size() * sizeof(int32_t));
  up_ids_->write(0, up.data(), up.size() * sizeof(int32_t));
  fused_ = floats(fine * s.fusion_mid);
  coarse_ = floats(coarse * s.fusion_mid);
  wide_ = floats(fine * std::max(s.fusion_mid, s.hidden));
  pooled_ = floats(uint64_t(s.tokens_per_image()) * s.hidden);
  normed_ = floats(uint64_t(s.tokens_per_image()) * s.hidden);
  out_ = floats(uint64_t(s.tokens_per_image()) * s.text_hidden);
  reserved_ = true;
}

void MobileNet::run_edge(gpu::ComputeEncoder& enc, const MobileBlock& m, const Block& b) {
  gpu::Device& dev = *device_;
  const Same p = same(b.side_in, m.k, m.stride);
  const uint32_t n = p.out * p.out, cols = round4(uint64_t(m.in) * m.k * m.k);
  ops::im2col(dev, enc, at(x_), at(cols_),
              {b.side_in, b.side_in, m.in, m.k, m.k, m.stride, m.stride, p.before, p.before, p.out, p.out, cols});
  linear(dev, enc, cols_, *b.a, nullptr, mid_, n);
  ops::rms_norm(dev, enc, at(mid_), b.a_norm->view, b.a_norm->type, at(mid_), n, m.mid, spec_.eps);
  ops::gelu(dev, enc, at(mid_), uint64_t(n) * m.mid);
  linear(dev, enc, mid_, *b.b, nullptr, h_, n);
  ops::rms_norm(dev, enc, at(h_), b.b_norm->view, b.b_norm->type, at(m.skip() ? h_ : x_), n, m.out, spec_.eps);
  if (m.skip()) ops::add(dev, enc, at(x_), at(h_), n * m.out);
}

void MobileNet::run_inverted(gpu::ComputeEncoder& enc, const MobileBlock& m, const Block& b) {
  gpu::Device& dev = *device_;
  const float eps = spec_.eps;
  uint32_t side = b.side_in;
  gpu::BufferPtr src = x_;
  auto dw = [&](const gpu::BufferPtr& from, const model::Weight& w, const gpu::BufferPtr& to, uint32_t k,
                uint32_t stride, uint32_t channels) {
    const Same p = same(side, k, stride);
    ops::depthwise_conv2d(dev, enc, at(from), w.view, at(to),
                          {side, side, channels, k, stride, p.before, p.before, p.out, p.out});
    side = p.out;
  };
  if (m.k_start) {  // no activation after the first depthwise conv
    dw(x_, *b.a, t_, m.k_start, m.k_mid ? 1 : m.stride, m.in);
    ops::rms_norm(dev, enc, at(t_), b.a_norm->view, b.a_norm->type, at(t_), side * side, m.in, eps);
    src = t_;
  }
  linear(dev, enc, src, *b.b, nullptr, mid_, side * side);
  ops::rms_norm(dev, enc, at(mid_), b.b_norm->view, b.b_norm->type, at(mid_), side * side, m.mid, eps);
  ops::gelu(dev, enc, at(mid_), uint64_t(side) * side * m.mid);
  src = mid_;
  if (m.k_mid) {
    dw(mid_, *b.c, mid2_, m.k_mid, m.stride, m.mid);
    ops::rms_norm(dev, enc, at(mid2_), b.c_norm->view, b.c_norm->type, at(mid2_), side * side, m.mid, eps);
    ops::gelu(dev, enc, at(mid2_), uint64_t(side) * side * m.mid);
    src = mid2_;
  }
  const uint32_t n = side * side;
  linear(dev, enc, src, *b.d, nullptr, h_, n);
  ops::rms_norm(dev, enc, at(h_), b.d_norm->view, b.d_norm->type, at(h_), n, m.out, eps);
  ops::layer_scale(dev, enc, at(h_), b.gamma->view, at(x_), n, m.out, m.skip());
}

void MobileNet::run_attention(gpu::ComputeEncoder& enc, const MobileBlock& m, const Block& b) {
  gpu::Device& dev = *device_;
  const float eps = spec_.eps;
  const uint32_t n = b.side_in * b.side_in;
  ops::rms_norm(dev, enc, at(x_), b.a_norm->view, b.a_norm->type, at(h_), n, m.in, eps);
  linear(dev, enc, h_, *b.b, nullptr, q_, n);
  uint32_t n_kv = n;
  if (m.kv_stride > 1) {  // K and V each from their own strided depthwise conv of the normed input
    const Same p = same(b.side_in, m.kv_kernel, m.kv_stride);
    const mkv_params::DepthwiseConv2d g{b.side_in, b.side_in, m.in, m.kv_kernel, m.kv_stride, p.before, p.before,
                                        p.out, p.out};
    n_kv = p.out * p.out;
    for (auto [down, norm, proj, to] : {std::tuple{b.c, b.c_norm, b.k, k_}, {b.d, b.d_norm, b.v, v_}}) {
      ops::depthwise_conv2d(dev, enc, at(h_), down->view, at(t_), g);
      ops::rms_norm(dev, enc, at(t_), norm->view, norm->type, at(t_), n_kv, m.in, eps);
      linear(dev, enc, t_, *proj, nullptr, to, n_kv);
    }
  } else {
    linear(dev, enc, h_, *b.k, nullptr, k_, n);
    linear(dev, enc, h_, *b.v, nullptr, v_, n);
  }
  constexpr uint32_t B = mkv_params::kKvBlockTokens;
  ops::KvStoreDesc st;
  st.n_new = n_kv;
  st.n_kv_heads = 1;
  st.head_dim = m.key_dim;
  st.dst_rows = (n_kv + B - 1) / B * B;
  ops::kv_store(dev, enc, at(k_), at(v_), at(kv_), st);
  ops::AttentionDesc d;  // every query sees every key: one bidirectional block over them
  d.n_q_heads = m.heads;
  d.n_kv_heads = 1;
  d.head_dim = m.key_dim;
  d.n_tokens = n_kv;
  d.slots = st.dst_rows;
  d.scale = 1.0f / std::sqrt(float(m.key_dim));
  d.blocks = {{0, n_kv}};
  const size_t row = size_t(m.heads) * m.key_dim * sizeof(float);
  for (uint32_t first = 0; first < n; first += n_kv) {  // queries sit at the last positions: at most n_kv a chunk
    d.n_queries = std::min(n_kv, n - first);
    ops::attention_prefill(dev, enc, d, at(q_, first * row), at(kv_), at(table_), at(attn_, first * row), {});
  }
  linear(dev, enc, attn_, *b.o, nullptr, h_, n);
  ops::layer_scale(dev, enc, at(h_), b.gamma->view, at(x_), n, m.out, true);
}

// The fusion's first 1x1 conv on the finer input ran when that block was done (into fused_);
// here the coarser (the last block's, in x_) joins it.
void MobileNet::run_fusion(gpu::ComputeEncoder& enc) {
  gpu::Device& dev = *device_;
  const MobileNetSpec& s = spec_;
  const float eps = s.eps;
  const uint32_t fs = blocks_[s.fuse[0]].side_out, cs = blocks_[s.fuse[1]].side_out;
  const uint32_t fine = fs * fs, coarse = cs * cs, T = s.tokens_per_image();
  linear(dev, enc, x_, *exp_lo_, nullptr, coarse_, coarse);
  ops::embedding(dev, enc, at(coarse_), ops::WeightType::f32, at(up_ids_), at(wide_), fine, s.fusion_mid, coarse);
  ops::add(dev, enc, at(fused_), at(wide_), fine * s.fusion_mid);
  ops::rms_norm(dev, enc, at(fused_), exp_norm_->view, exp_norm_->type, at(fused_), fine, s.fusion_mid, eps);
  ops::gelu(dev, enc, at(fused_), uint64_t(fine) * s.fusion_mid);
  linear(dev, enc, fused_, *proj_, nullptr, wide_, fine);
  ops::rms_norm(dev, enc, at(wide_), proj_norm_->view, proj_norm_->type, at(wide_), fine, s.hidden, eps);
  ops::avg_pool(dev, enc, at(wide_), at(pooled_), 1, fs, fs / s.resolution, s.hidden);
  ops::rms_norm(dev, enc, at(pooled_), fusion_norm_->view, fusion_norm_->type, at(pooled_), T, s.hidden, eps);
  ops::scale(dev, enc, at(pooled_), T * s.hidden, std::sqrt(float(s.hidden)));  // Gemma3nModel's, before the embedder
  embedder_->soft(dev, enc, pooled_, normed_, out_, T);
}

std::vector<float> MobileNet::encode(const float* pixels, uint32_t n_images) {
  if (n_images == 0) fail("encode needs at least one image");
  reserve();
  const MobileNetSpec& s = spec_;
  gpu::Device& dev = *device_;
  const size_t per_image = sq(s.image) * kColors, T = s.tokens_per_image();
  std::vector<float> result(n_images * T * s.text_hidden);
  for (uint32_t image = 0; image < n_images; ++image) {
    in_->write(0, pixels + image * per_image, per_image * sizeof(float));
    kv::EncoderSession session(*queue_);
    {
      gpu::ComputeEncoder& enc = session.compute();
      const Same p = same(s.image, kStemKernel, kStemStride);
      const uint32_t n = p.out * p.out, cols = round4(kColors * kStemKernel * kStemKernel);
      ops::im2col(dev, enc, at(in_), at(cols_),
                  {s.image, s.image, kColors, kStemKernel, kStemKernel, kStemStride, kStemStride, p.before, p.before,
                   p.out, p.out, cols});
      linear(dev, enc, cols_, *stem_w_, stem_b_, x_, n);
      ops::rms_norm(dev, enc, at(x_), stem_norm_->view, stem_norm_->type, at(x_), n, s.stem, s.eps);
      ops::gelu(dev, enc, at(x_), uint64_t(n) * s.stem);
    }
    for (size_t i = 0; i < s.blocks.size(); ++i) {
      const MobileBlock& m = s.blocks[i];
      gpu::ComputeEncoder& enc = session.compute();
      if (m.kind == MobileBlock::edge) run_edge(enc, m, blocks_[i]);
      else if (m.kind == MobileBlock::inverted) run_inverted(enc, m, blocks_[i]);
      else run_attention(enc, m, blocks_[i]);
      if (i == s.fuse[0]) linear(dev, enc, x_, *exp_hi_, nullptr, fused_, uint32_t(sq(blocks_[i].side_out)));
      if ((i + 1) % kBlocksPerCommandBuffer == 0) session.flush();
    }
    run_fusion(session.compute());
    session.finish();
    out_->read(0, result.data() + image * T * s.text_hidden, T * s.text_hidden * sizeof(float));
  }
  return result;
}

}  // namespace mkv::towers
