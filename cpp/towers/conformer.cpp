#include "towers/conformer.h"

#include <cmath>

#include "kv/encoder_session.h"
#include "ops/audio.h"
#include "ops/elementwise.h"
#include "towers/tower_ops.h"

namespace mkv::towers {
namespace {

[[noreturn]] void fail(const std::string& m) { ops::fail("conformer", m); }
std::string str(uint64_t v) { return std::to_string(v); }

ops::BufferView at(const gpu::BufferPtr& b) { return {b, 0}; }

constexpr uint32_t kLayersPerCommandBuffer = 4;  // as Siglip: the GPU starts while the rest is encoded
constexpr uint32_t kFreqPad = 1;                 // zeros each side of the frequencies, as transformers pads

uint32_t round4(uint64_t n) { return uint32_t((n + 3) / 4 * 4); }

// torch.nn.functional.softplus (its threshold 20 included), in float.
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

}  // namespace

const model::Weight& Conformer::need(const std::string& name, std::vector<uint64_t> shape, bool matrix) const {
  return need_weight("conformer", weights_, name, shape, matrix);
}

Conformer::Geometry Conformer::geometry(uint32_t n_frames) const {
  Geometry g{};
  g.t[0] = n_frames;
  g.f[0] = spec_.n_mels;
  uint32_t c_in = 1;
  for (int s = 0; s < 2; ++s) {
    const ConvStage& c = spec_.conv[s];
    g.t[s + 1] = (g.t[s] - 1) / c.st + 1;  // time padded by kt - 1 after: ceil(t / st)
    g.f[s + 1] = (g.f[s] + 2 * kFreqPad - c.kf) / c.sf + 1;
    g.cols[s] = round4(uint64_t(c_in) * c.kt * c.kf);
    c_in = c.channels;
  }
  return g;
}

uint32_t Conformer::tokens_for(uint32_t n_frames) const {
  if (n_frames == 0) fail("a clip needs at least one frame");
  return (geometry(n_frames).t[2] + spec_.reduction - 1) / spec_.reduction;
}

Conformer::Conformer(gpu::DevicePtr device, ConformerSpec spec, model::Weights weights)
    : device_(std::move(device)), spec_(spec), weights_(std::move(weights)) {
  if (!device_) fail("device is null");
  const ConformerSpec& s = spec_;
  if (!s.n_layers || !s.hidden || !s.n_heads || !s.ffn || !s.n_mels || !s.taps || !s.reduction || !s.vocab ||
      !s.text_hidden)
    fail("every size of the spec must be positive");
  for (const ConvStage& c : s.conv)
    if (!c.channels || !c.kt || !c.kf || !c.st || !c.sf) fail("every size of the conv stages must be positive");
  if (s.hidden % s.n_heads || s.hidden % 2)
    fail("hidden " + str(s.hidden) + " must be even and a multiple of n_heads " + str(s.n_heads));
  if (s.head_dim() > 32 * mkv_params::kAudioDimsPerLane)
    fail("head_dim " + str(s.head_dim()) + " is above the attention kernel's " +
         str(32 * mkv_params::kAudioDimsPerLane));
  if (!(s.softcap > 0.0f)) fail("softcap must be > 0");
  const Geometry g = geometry(1);
  if (s.n_mels + 2 * kFreqPad < s.conv[0].kf || g.f[1] + 2 * kFreqPad < s.conv[1].kf)
    fail("the conv stages' frequency kernels are wider than the padded features");
  const uint64_t H = s.hidden, D = s.head_dim();
  uint32_t c_in = 1;
  for (int i = 0; i < 2; ++i) {
    const std::string p = "a.conv." + str(i) + ".";
    conv_w_[i] = &need(p + "weight", {s.conv[i].channels, g.cols[i]}, true);
    conv_norm_[i] = &need(p + "norm", {s.conv[i].channels}, false);
    c_in = s.conv[i].channels;
  }
  input_proj_ = &need("a.input_proj.weight", {H, uint64_t(g.f[2]) * c_in}, true);
  for (uint32_t l = 0; l < s.n_layers; ++l) {
    const std::string p = "a.blk." + str(l) + ".";
    Layer L{};
    for (int i = 0; i < 2; ++i) {
      const std::string f = p + "ffn_" + str(i) + ".";
      L.ffn[i] = {&need(f + "norm", {H}, false), &need(f + "up", {s.ffn, H}, true),
                  &need(f + "down", {H, s.ffn}, true), &need(f + "post_norm", {H}, false)};
    }
    L.attn_norm = &need(p + "attn.norm", {H}, false);
    L.qkv = &need(p + "attn.qkv", {3 * H, H}, true);
    L.out = &need(p + "attn.out", {H, H}, true);
    L.attn_post_norm = &need(p + "attn.post_norm", {H}, false);
    L.conv_norm = &need(p + "conv.norm", {H}, false);
    L.start = &need(p + "conv.start", {2 * H, H}, true);
    L.taps = &need(p + "conv.taps", {s.taps, H}, false);
    L.conv_post_norm = &need(p + "conv.conv_norm", {H}, false);
    L.end = &need(p + "conv.end", {H, H}, true);
    L.norm = &need(p + "norm", {H}, false);
    need(p + "attn.per_dim_scale", {D}, false);
    need(p + "attn.pos", {H, H}, true);
    layers_.push_back(L);
  }
  embedder_ = std::make_unique<Embedder>("conformer", *device_, weights_, s.vocab, s.hidden, s.text_hidden, s.mm_eps);
  queue_ = device_->new_command_queue();
  make_tables();
  hard_ = embedder_->hard_rows(*device_, *queue_);
}

// Per layer: q's scale (head_dim^-0.5 / softplus(0) * softplus(per_dim_scale)) and the
// relative-position rows (the sinusoid of each offset, left .. -right, through W_pos).
void Conformer::make_tables() {
  const ConformerSpec& s = spec_;
  gpu::Device& dev = *device_;
  const uint32_t H = s.hidden, D = s.head_dim(), F = s.left + s.right + 1, half = H / 2;
  const float inc = float(std::log(1.0e4) / std::max<double>(half - 1, 1));
  std::vector<float> timing(size_t(F) * H);
  for (uint32_t f = 0; f < F; ++f) {
    const float position = float(int(s.left) - int(f));
    for (uint32_t i = 0; i < half; ++i) {
      const float t = position * std::exp(float(i) * -inc);
      timing[size_t(f) * H + i] = std::sin(t);
      timing[size_t(f) * H + half + i] = std::cos(t);
    }
  }
  gpu::BufferPtr sinusoid = device_->new_buffer(timing.size() * sizeof(float));
  sinusoid->write(0, timing.data(), timing.size() * sizeof(float));
  const float q_scale = float(std::pow(double(D), -0.5)) * (1.0f / softplus(0.0f));

  kv::EncoderSession session(*queue_);
  gpu::ComputeEncoder& enc = session.compute();
  for (uint32_t l = 0; l < s.n_layers; ++l) {
    Layer& L = layers_[l];
    const std::string p = "a.blk." + str(l) + ".attn.";
    const model::Weight& per_dim = *weights_.find(p + "per_dim_scale");
    std::vector<float> scale(D);
    per_dim.view.buffer->read(per_dim.view.offset, scale.data(), D * sizeof(float));
    for (float& v : scale) v = q_scale * softplus(v);
    L.qscale = device_->new_buffer(D * sizeof(float));
    L.qscale->write(0, scale.data(), D * sizeof(float));
    L.pos = device_->new_buffer(size_t(F) * H * sizeof(float));
    linear(dev, enc, sinusoid, *weights_.find(p + "pos"), nullptr, L.pos, F);
  }
  session.finish();
}

void Conformer::reserve(uint32_t n_frames) {
  if (n_frames <= capacity_) return;
  const ConformerSpec& s = spec_;
  const Geometry g = geometry(n_frames);
  const size_t T = g.t[2], H = s.hidden, out_rows = tokens_for(n_frames);
  auto floats = [&](size_t n) { return device_->new_buffer(n * sizeof(float)); };
  in_ = floats(size_t(n_frames) * s.n_mels);
  cols_ = floats(std::max(size_t(g.t[1]) * g.f[1] * g.cols[0], size_t(g.t[2]) * g.f[2] * g.cols[1]));
  conv_ = floats(std::max(size_t(g.t[1]) * g.f[1] * s.conv[0].channels, size_t(g.t[2]) * g.f[2] * s.conv[1].channels));
  stats_ = floats(2 * size_t(std::max(g.t[1], g.t[2])));
  x_ = floats(T * H);
  h_ = floats(T * H);
  q_ = floats(T * H);
  k_ = floats(T * H);
  v_ = floats(T * H);
  attn_ = floats(T * H);
  wide_ = floats(T * std::max<size_t>(s.ffn, 2 * H));
  taken_ = floats(out_rows * H);
  normed_ = floats(out_rows * H);
  out_ = floats(out_rows * s.text_hidden);
  capacity_ = n_frames;
}

std::vector<float> Conformer::encode(const float* features, uint32_t n_frames, uint32_t n_valid, uint32_t n_tokens) {
  const ConformerSpec& s = spec_;
  if (n_frames == 0) fail("a clip needs at least one frame");
  if (n_valid == 0 || n_valid > n_frames)
    fail("n_valid " + str(n_valid) + " must be in 1.." + str(n_frames) + " (the clip's frames)");
  const uint32_t n_out = tokens_for(n_frames);
  if (n_tokens < n_out)
    fail("a clip of " + str(n_frames) + " frames makes " + str(n_out) + " soft tokens; its run holds " +
         str(n_tokens));
  reserve(n_frames);
  gpu::Device& dev = *device_;
  const Geometry g = geometry(n_frames);
  const uint32_t T = g.t[2], H = s.hidden, D = s.head_dim();
  // A row is padding where the frame it starts at is (transformers' mask, gathered every st0 st1 frames).
  const uint64_t stride = uint64_t(s.conv[0].st) * s.conv[1].st;
  uint32_t valid = 0;
  while (valid < T && std::min<uint64_t>(valid * stride, n_frames - 1) < n_valid) ++valid;
  in_->write(0, features, size_t(n_frames) * s.n_mels * sizeof(float));

  kv::EncoderSession session(*queue_);
  {
    gpu::ComputeEncoder& enc = session.compute();
    uint32_t c_in = 1;
    for (int i = 0; i < 2; ++i) {
      const ConvStage& c = s.conv[i];
      const mkv_params::Im2col p{g.t[i], g.f[i], c_in, c.kt, c.kf, c.st, c.sf, 0, kFreqPad,
                                 g.t[i + 1], g.f[i + 1], g.cols[i]};
      ops::im2col(dev, enc, at(i == 0 ? in_ : conv_), at(cols_), p);
      linear(dev, enc, cols_, *conv_w_[i], nullptr, conv_, g.t[i + 1] * g.f[i + 1]);
      ops::cumulative_norm(dev, enc, at(conv_), conv_norm_[i]->view, at(stats_), at(conv_), g.t[i + 1],
                           g.f[i + 1] * c.channels, c.channels, s.group_eps);
      c_in = c.channels;
    }
    linear(dev, enc, conv_, *input_proj_, nullptr, x_, T);
  }
  auto norm = [&](gpu::ComputeEncoder& enc, const gpu::BufferPtr& x, const model::Weight& w, const gpu::BufferPtr& y) {
    ops::rms_norm(dev, enc, at(x), w.view, w.type, at(y), T, H, s.eps);
  };
  auto ffn = [&](gpu::ComputeEncoder& enc, const Ffn& f) {  // x += residual_weight RMSNorm(down(silu(up(RMSNorm(x)))))
    norm(enc, x_, *f.norm, h_);
    linear(dev, enc, h_, *f.up, nullptr, wide_, T);
    ops::silu(dev, enc, at(wide_), uint64_t(T) * s.ffn);
    linear(dev, enc, wide_, *f.down, nullptr, h_, T);
    norm(enc, h_, *f.post_norm, h_);
    ops::scale(dev, enc, at(h_), T * H, s.residual_weight);
    ops::add(dev, enc, at(x_), at(h_), T * H);
  };
  const mkv_params::AudioAttention attention{T, valid, s.n_heads, D, s.left, s.right, s.softcap};
  for (uint32_t l = 0; l < s.n_layers; ++l) {
    const Layer& L = layers_[l];
    gpu::ComputeEncoder& enc = session.compute();
    ffn(enc, L.ffn[0]);
    norm(enc, x_, *L.attn_norm, h_);
    linear_qkv(dev, enc, at(h_), *L.qkv, nullptr, at(q_), at(k_), at(v_), T);
    ops::audio_attention(dev, enc, at(q_), at(k_), at(v_), at(L.pos), at(L.qscale), at(attn_), attention);
    linear(dev, enc, attn_, *L.out, nullptr, h_, T);
    norm(enc, h_, *L.attn_post_norm, h_);
    ops::add(dev, enc, at(x_), at(h_), T * H);
    norm(enc, x_, *L.conv_norm, h_);  // the light convolution; padding rows come after every valid one,
    linear(dev, enc, h_, *L.start, nullptr, wide_, T);  // and the convolution is causal: no valid row reads them
    ops::glu(dev, enc, at(wide_), at(attn_), T, H);
    ops::depthwise_conv(dev, enc, at(attn_), L.taps->view, at(h_), T, H, s.taps);
    norm(enc, h_, *L.conv_post_norm, h_);
    ops::silu(dev, enc, at(h_), uint64_t(T) * H);
    linear(dev, enc, h_, *L.end, nullptr, x_, T, true);
    ffn(enc, L.ffn[1]);
    norm(enc, x_, *L.norm, x_);
    if ((l + 1) % kLayersPerCommandBuffer == 0) session.flush();
  }
  gpu::ComputeEncoder& enc = session.compute();
  ops::take_rows(dev, enc, at(x_), at(taken_), n_out, H, s.reduction);
  embedder_->soft(dev, enc, taken_, normed_, out_, n_out);
  session.finish();

  const size_t TH = s.text_hidden;
  std::vector<float> result(size_t(n_tokens) * TH);
  out_->read(0, result.data(), size_t(n_out) * TH * sizeof(float));
  const float* pad = hard_.data() + size_t(s.vocab - 1) * TH;
  for (uint32_t i = 0; i < n_tokens; ++i)
    if (i >= n_out || uint64_t(i) * s.reduction >= valid) std::copy(pad, pad + TH, result.begin() + i * TH);
  return result;
}

}  // namespace mkv::towers
