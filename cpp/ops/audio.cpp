// Host side of metal/audio.metal: validate, bind, dispatch.
#include "ops/audio.h"

#include "metal/linear_params.h"
#include "ops/launch.h"

namespace mkv::ops {
namespace {

std::string str(uint64_t v) { return std::to_string(v); }

}  // namespace

void im2col(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& x, const BufferView& out,
            const mkv_params::Im2col& p) {
  const char* op = "im2col";
  for (auto [name, v] : {std::pair{"t_in", p.t_in}, {"f_in", p.f_in}, {"c_in", p.c_in}, {"kt", p.kt}, {"kf", p.kf},
                         {"st", p.st}, {"sf", p.sf}, {"t_out", p.t_out}, {"f_out", p.f_out}, {"cols", p.cols}})
    check_positive(op, name, v);
  if (uint64_t(p.c_in) * p.kt * p.kf > p.cols)
    fail(op, "cols " + str(p.cols) + " is narrower than c_in * kt * kf = " + str(uint64_t(p.c_in) * p.kt * p.kf));
  const uint64_t n_in = uint64_t(p.t_in) * p.f_in * p.c_in, n_out = uint64_t(p.t_out) * p.f_out * p.cols;
  gather_floats(device, enc, op, "im2col_f32", p, x, "x (t_in, f_in, c_in) float32", n_in, out,
                "out (t_out * f_out, cols) float32", n_out);
}

void cumulative_norm(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& x, const BufferView& w,
                     const BufferView& stats, const BufferView& out, uint32_t n_rows, uint32_t dim,
                     uint32_t channels, float eps) {
  const char* op = "cumulative_norm";
  check_positive(op, "n_rows", n_rows);
  check_positive(op, "dim", dim);
  check_positive(op, "channels", channels);
  if (dim % channels) fail(op, "dim " + str(dim) + " is not a multiple of channels " + str(channels));
  if (!(eps > 0.0f)) fail(op, "eps must be > 0, got " + std::to_string(eps));
  const uint64_t n = uint64_t(n_rows) * dim;
  below_2_32(op, "x", n);
  check_view(op, "x (n_rows, dim) float32", x, n * 4, 4);
  check_view(op, "w (channels) float32", w, size_t(channels) * 4, 4);
  check_view(op, "stats (2 n_rows) float32", stats, size_t(n_rows) * 8, 4);
  check_view(op, "out (n_rows, dim) float32", out, n * 4, 4);
  if (overlaps(stats, size_t(n_rows) * 8, x, n * 4) || overlaps(stats, size_t(n_rows) * 8, out, n * 4))
    fail(op, "stats must not overlap x or out");
  enc.set_pipeline(device.pipeline("cumulative_norm_f32"));
  for (uint32_t pass = 0; pass < 3; ++pass) {  // each pass reads every row's result of the one before
    bind_params(enc, mkv_params::CumulativeNorm{n_rows, dim, channels, pass, eps}, 0);
    bind(enc, x, 1);
    bind(enc, w, 2);
    bind(enc, stats, 3);
    bind(enc, out, 4);
    enc.dispatch_threadgroups({n_rows, 1, 1}, {row_threads(device), 1, 1});
  }
}

void audio_attention(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& q, const BufferView& k,
                     const BufferView& v, const BufferView& pos, const BufferView& qscale, const BufferView& out,
                     const mkv_params::AudioAttention& p) {
  const char* op = "audio_attention";
  check_positive(op, "n_tokens", p.n_tokens);
  check_positive(op, "n_heads", p.n_heads);
  check_positive(op, "head_dim", p.head_dim);
  if (p.head_dim > 32 * mkv_params::kAudioDimsPerLane)
    fail(op, "head_dim " + str(p.head_dim) + " is above " + str(32 * mkv_params::kAudioDimsPerLane));
  if (p.n_valid > p.n_tokens) fail(op, "n_valid " + str(p.n_valid) + " is past n_tokens " + str(p.n_tokens));
  if (!(p.softcap > 0.0f)) fail(op, "softcap must be > 0");
  const uint64_t width = uint64_t(p.n_heads) * p.head_dim, n = p.n_tokens * width;
  below_2_32(op, "q", n);
  for (auto [what, view] : {std::pair{"q (n_tokens, n_heads head_dim) float32", &q}, {"k (same) float32", &k},
                            {"v (same) float32", &v}, {"out (same) float32", &out}})
    check_view(op, what, *view, n * 4, 4);
  check_view(op, "pos (left + right + 1, n_heads head_dim) float32", pos, (uint64_t(p.left) + p.right + 1) * width * 4,
             4);
  check_view(op, "qscale (head_dim) float32", qscale, size_t(p.head_dim) * 4, 4);
  for (const BufferView* in : {&q, &k, &v})
    if (overlaps(*in, n * 4, out, n * 4)) fail(op, "out must not overlap q, k or v");
  enc.set_pipeline(device.pipeline("audio_attention_f32"));
  bind_params(enc, p, 0);
  bind(enc, q, 1);
  bind(enc, k, 2);
  bind(enc, v, 3);
  bind(enc, pos, 4);
  bind(enc, qscale, 5);
  bind(enc, out, 6);
  enc.dispatch_threadgroups({p.n_tokens * p.n_heads, 1, 1}, {32, 1, 1});
}

void depthwise_conv(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& x, const BufferView& w,
                    const BufferView& out, uint32_t n_rows, uint32_t channels, uint32_t taps) {
  const char* op = "depthwise_conv";
  check_positive(op, "n_rows", n_rows);
  check_positive(op, "channels", channels);
  check_positive(op, "taps", taps);
  const uint64_t n = uint64_t(n_rows) * channels;
  below_2_32(op, "x", n);
  check_view(op, "x (n_rows, channels) float32", x, n * 4, 4);
  check_view(op, "w (taps, channels) float32", w, uint64_t(channels) * taps * 4, 4);
  check_view(op, "out (n_rows, channels) float32", out, n * 4, 4);
  if (overlaps(x, n * 4, out, n * 4)) fail(op, "out must not overlap x");
  enc.set_pipeline(device.pipeline("depthwise_conv_f32"));
  bind_params(enc, mkv_params::DepthwiseConv{n_rows, channels, taps}, 0);
  bind(enc, x, 1);
  bind(enc, w, 2);
  bind(enc, out, 3);
  dispatch_threads(enc, n);
}

void glu(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& x, const BufferView& out,
         uint32_t n_rows, uint32_t dim) {
  const char* op = "glu";
  check_positive(op, "n_rows", n_rows);
  check_positive(op, "dim", dim);
  const uint64_t n = uint64_t(n_rows) * dim;
  below_2_32(op, "x", 2 * n);
  check_view(op, "x (n_rows, 2 dim) float32", x, 2 * n * 4, 4);
  check_view(op, "out (n_rows, dim) float32", out, n * 4, 4);
  if (overlaps(x, 2 * n * 4, out, n * 4)) fail(op, "out must not overlap x");
  enc.set_pipeline(device.pipeline("glu_f32"));
  bind_params(enc, mkv_params::Rows{n_rows, dim, 0}, 0);
  bind(enc, x, 1);
  bind(enc, out, 2);
  dispatch_threads(enc, n);
}

void take_rows(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& x, const BufferView& out,
               uint32_t n_rows, uint32_t dim, uint32_t stride) {
  const char* op = "take_rows";
  check_positive(op, "n_rows", n_rows);
  check_positive(op, "dim", dim);
  check_positive(op, "stride", stride);
  const uint64_t n_in = (uint64_t(n_rows - 1) * stride + 1) * dim, n = uint64_t(n_rows) * dim;
  below_2_32(op, "x", n_in);
  check_view(op, "x ((n_rows - 1) stride + 1, dim) float32", x, n_in * 4, 4);
  check_view(op, "out (n_rows, dim) float32", out, n * 4, 4);
  if (overlaps(x, n_in * 4, out, n * 4)) fail(op, "out must not overlap x");
  enc.set_pipeline(device.pipeline("take_rows_f32"));
  bind_params(enc, mkv_params::Rows{n_rows, dim, stride}, 0);
  bind(enc, x, 1);
  bind(enc, out, 2);
  dispatch_threads(enc, n);
}

void silu(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& y, uint64_t n) {
  const char* op = "silu";
  check_positive(op, "n", n);
  below_2_32(op, "n", n);
  check_view(op, "y (n) float32", y, n * 4, 4);
  enc.set_pipeline(device.pipeline("silu_f32"));
  bind_params(enc, mkv_params::Elementwise{uint32_t(n), 0.0f}, 0);
  bind(enc, y, 1);
  dispatch_elements(enc, n);
}

std::vector<std::string> audio_kernel_names() {
  return {"im2col_f32", "cumulative_norm_f32", "audio_attention_f32", "depthwise_conv_f32",
          "glu_f32",    "take_rows_f32",       "silu_f32"};
}

}  // namespace mkv::ops
