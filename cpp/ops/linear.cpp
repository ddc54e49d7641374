// Linear layers: pick gemv_<wtype> or gemm_<wtype>, check every shape and
// buffer, bind mkv_params::Matmul and dispatch (see metal/matmul.metal).
#include "ops/linear.h"

#include <algorithm>
#include <iterator>
#include <set>

#include "metal/linear_params.h"
#include "metal/linear_variants.h"
#include "ops/launch.h"

namespace mkv::ops {
namespace {

constexpr const char* kOp = "matmul";

}  // namespace

namespace {

// The gemv variants built (metal/linear_variants.h): GPU widths, the GPU
// widths with a several-token shape, the formats with a c4 fallback.
#define MKV_GEMV_ROWS_ITEM(R, unused) R,
constexpr uint32_t kGpuRows[] = {MKV_GEMV_GPU_ROWS(MKV_GEMV_ROWS_ITEM, )};
constexpr uint32_t kGpuTokenRows[] = {MKV_GEMV_GPU_TOKEN_ROWS(MKV_GEMV_ROWS_ITEM, )};
#undef MKV_GEMV_ROWS_ITEM
#define MKV_GEMV_C4_ITEM(fmt, F, unused) WeightType::fmt,
constexpr WeightType kC4Formats[] = {MKV_GEMV_C4_FORMATS(MKV_GEMV_C4_ITEM, )};
#undef MKV_GEMV_C4_ITEM

// "1, 2, 4" or "1 or 2" for error messages.
template <size_t N>
std::string rows_text(const uint32_t (&list)[N], const char* last) {
  std::string s;
  for (size_t i = 0; i < N; ++i) s += (i == 0 ? "" : i + 1 == N ? last : ", ") + std::to_string(list[i]);
  return s;
}

// What the rules below assume of the lists: ascending GPU widths up to
// kGemvRowsMaxGpu, below the host's, the default among them, every width the
// halving from the default reaches, the token widths among them.
constexpr bool gemv_lists_agree() {
  for (size_t i = 1; i < std::size(kGpuRows); ++i)
    if (kGpuRows[i] <= kGpuRows[i - 1]) return false;
  if (kGpuRows[std::size(kGpuRows) - 1] != mkv_params::kGemvRowsMaxGpu) return false;
  if (mkv_params::kGemvRowsMaxGpu >= mkv_params::kGemvRows) return false;
  for (uint32_t r = mkv_params::kGemvRowsDefaultGpu; r >= 1; r /= 2)
    if (!listed(kGpuRows, r)) return false;
  for (uint32_t r : kGpuTokenRows)
    if (!listed(kGpuRows, r)) return false;
  return true;
}
static_assert(gemv_lists_agree(), "metal/linear_variants.h disagrees with the rules of this file");

// Rows per SIMD-group of each shape, and SIMD-groups per threadgroup.
uint32_t gemv_simds(uint32_t rows) {
  return rows == mkv_params::kGemvRowsWide ? mkv_params::kGemvSimdsWide : mkv_params::kGemvSimds;
}

// f16/bf16 GPU shapes read 16 bytes per lane step: rows must start 16-byte aligned.
bool needs_c4_fallback(WeightType wtype, uint32_t rows, uint32_t n_in, const BufferView& w) {
  return listed(kC4Formats, wtype) && listed(kGpuRows, rows) && (n_in % 8 != 0 || w.offset % 16 != 0);
}

// "gemv_q4_1" (8 rows), "gemv_q4_1_r32", "gemv_swiglu_f16_r2", "gemv_f16_c4_r4",
// "gemv_q4_1_r32_t8" (8 tokens a threadgroup), "gemv_f16_r2_t4".
std::string gemv_name(const char* prefix, WeightType wtype, uint32_t rows, bool c4, uint32_t tokens) {
  std::string name = std::string(prefix) + weight_type_name(wtype) + (c4 ? "_c4" : "");
  if (rows != mkv_params::kGemvRows) name += "_r" + std::to_string(rows);
  return tokens == 1 ? name : name + "_t" + std::to_string(tokens);
}

}  // namespace

uint32_t gemv_rows(gpu::Device& device, WeightType wtype, uint32_t n_out, uint32_t n_tokens) {
  // A device with one best width (the host executor: a row a lane, no
  // collective, gemv_lanes, for every format; the 8-row simd_sum shape stays as
  // a bench and test variant, docs/KERNELS.md, issue 17).
  if (const uint32_t fixed = device.properties().gemv_rows) return fixed;
  // SIMD-groups the device holds at once (the R = 1 shape; R = 2, 4 use a few more registers).
  const uint32_t simds = gemv_simds(1);
  const gpu::PipelinePtr pipeline = device.pipeline(gemv_name("gemv_", wtype, 1, false, 1));
  const uint64_t wave = uint64_t(device_wave(device, *pipeline, 32 * simds)) * simds;
  // Quantized rows cost 4 bytes of activations (cache hits) per weight against
  // 0.5-1 byte from DRAM: at least 2 rows share each activation load.
  // Start at 2, not 4: nvcc gives the 4-row shapes 200-255 registers (8 SIMD-groups
  // per SM, q6_k spills), the 2-row ones 120-200 (docs/KERNELS.md).
  const uint32_t min_rows = is_quantized(wtype) ? 2 : 1;
  uint32_t rows = mkv_params::kGemvRowsDefaultGpu;
  while (rows > min_rows && uint64_t(ceil_div(n_out, rows)) * n_tokens < wave) rows /= 2;
  return rows;
}

uint32_t gemv_tokens(gpu::Device& device, uint32_t n_tokens) {
  if (n_tokens <= 1) return 1;
  return device.properties().gemv_tokens;
}

void check_view(const char* op, const char* what, const BufferView& view, size_t bytes,
                size_t align) {
  if (!view.buffer) fail(op, std::string(what) + " buffer is missing");
  const size_t length = view.buffer->length();
  if (view.offset > length || bytes > length - view.offset)
    fail(op, std::string(what) + " needs " + std::to_string(bytes) + " bytes at offset " +
                 std::to_string(view.offset) + ", but the buffer has " + std::to_string(length) +
                 " bytes");
  if (view.offset % align != 0)
    fail(op, std::string(what) + " offset " + std::to_string(view.offset) +
                 " must be a multiple of " + std::to_string(align) + " bytes");
}

namespace {

// The prefill gemm's shapes (metal/gemm.h, gemm_host.h, gemm_mma.h).
enum class GemmShape { gpu, host, mma };

// x16: the activations in the weights' 16-bit type (gemm_mma_<wtype>_x16), matrix units only.
std::string gemm_name(WeightType wtype, GemmShape shape, bool x16 = false) {
  const char* prefix = shape == GemmShape::mma ? "gemm_mma_" : "gemm_";
  return prefix + std::string(weight_type_name(wtype)) + (shape == GemmShape::host ? "_h" : "") +
         (x16 && shape == GemmShape::mma ? "_x16" : "");
}

// The weight types with a gemm_mma_<wtype>_x16 kernel (metal/gemm_mma16.metal).
bool has_x16_gemm(WeightType wtype) { return wtype == WeightType::f16 || wtype == WeightType::bf16; }

// The shape asked for, or the device's own: matrix units where it has them;
// the host executor's where lanes are fibers (the SIMD shape's two barriers
// per 64 inputs are two switches through 64 fibers each there); else the SIMD one.
GemmShape gemm_shape(const gpu::Device& device, MatmulKernel kernel) {
  const gpu::DeviceProperties& props = device.properties();
  switch (kernel) {
    case MatmulKernel::gemm_host:
      if (!props.has_host_shapes)
        fail(kOp, "kernel 'gemm_host' is the host executor's shape; this device has none (use 'gemm')");
      return GemmShape::host;
    case MatmulKernel::gemm_gpu: return GemmShape::gpu;
    case MatmulKernel::gemm_mma: return GemmShape::mma;
    default: break;
  }
  if (props.matrix_units) return GemmShape::mma;
  return picks_host_shapes(props) ? GemmShape::host : GemmShape::gpu;
}

uint32_t gemm_threads(GemmShape shape) {
  switch (shape) {
    case GemmShape::host: return mkv_params::kGemmHostThreads;
    case GemmShape::mma: return mkv_params::kGemmMmaThreads;
    default: return mkv_params::kGemmThreads;
  }
}

void check_common(const char* op, uint32_t n_tokens, uint32_t n_out) {
  if (n_tokens == 0 || n_out == 0)
    fail(op, "n_tokens and n_out must be positive, got n_tokens=" + std::to_string(n_tokens) +
                 ", n_out=" + std::to_string(n_out));
}

// The kernels read x while other SIMD-groups write y.
void check_no_overlap(const char* op, const BufferView& x, size_t x_bytes, const BufferView& y,
                      size_t y_bytes) {
  if (overlaps(x, x_bytes, y, y_bytes))
    fail(op, "y overlaps x; the output needs its own memory");
}

// The gemv tokens per threadgroup to run: 0 picks the device's, or, for a
// forced width (rows), the several-token shape built for it; else 1 or a
// several-token count (pick_gemv_rows checks it is built for the width).
uint32_t pick_gemv_tokens(const char* op, gpu::Device& device, uint32_t asked, uint32_t rows, uint32_t n_tokens) {
  if (asked == 0) {
    if (rows == 0 || n_tokens <= 1) return gemv_tokens(device, n_tokens);
    if (rows == mkv_params::kGemvRows || rows == mkv_params::kGemvRowsWide)
      return device.properties().has_host_shapes ? mkv_params::kGemvTokensHost : 1;
    return listed(kGpuTokenRows, rows) ? mkv_params::kGemvTokensGpu : 1;
  }
  if (asked != 1 && asked != mkv_params::kGemvTokensHost && asked != mkv_params::kGemvTokensGpu)
    fail(op, "gemv_tokens must be 0 (the device's choice), 1, " + std::to_string(mkv_params::kGemvTokensGpu) +
                 " or " + std::to_string(mkv_params::kGemvTokensHost) + ", got " + std::to_string(asked));
  if (asked == mkv_params::kGemvTokensHost && !device.properties().has_host_shapes)  // metal/gemv_tokens.metal
    fail(op, "gemv_tokens " + std::to_string(asked) + " is a host executor shape, not built for " + device.kind() +
                 " (GPUs: 1 or " + std::to_string(mkv_params::kGemvTokensGpu) + ")");
  return asked;
}

// The gemv width to run: 0 picks the device's; else one of the instantiated shapes.
uint32_t pick_gemv_rows(const char* op, gpu::Device& device, WeightType wtype, uint32_t asked, uint32_t n_out,
                        uint32_t n_tokens, uint32_t tokens) {
  // The several-token shapes exist for rows 8 and 32 (kGemvTokensHost) or kGpuTokenRows (kGemvTokensGpu).
  const bool host_tokens = tokens == mkv_params::kGemvTokensHost, gpu_tokens = tokens == mkv_params::kGemvTokensGpu;
  uint32_t rows = asked;
  if (rows == 0) {
    rows = gemv_rows(device, wtype, n_out, ceil_div(n_tokens, tokens));
    if (gpu_tokens && !listed(kGpuTokenRows, rows)) rows = kGpuTokenRows[std::size(kGpuTokenRows) - 1];
    if (host_tokens && listed(kGpuRows, rows)) rows = mkv_params::kGemvRows;
  }
  if (!listed(kGpuRows, rows) && rows != mkv_params::kGemvRows && rows != mkv_params::kGemvRowsWide)
    fail(op, "gemv_rows must be 0 (the device's choice), " + rows_text(kGpuRows, ", ") + ", " +
                 std::to_string(mkv_params::kGemvRows) +
                 " or " + std::to_string(mkv_params::kGemvRowsWide) + ", got " + std::to_string(asked));
  if ((host_tokens && listed(kGpuRows, rows)) || (gpu_tokens && !listed(kGpuTokenRows, rows)))
    fail(op, "gemv_tokens " + std::to_string(tokens) + " is built for " +
                 (host_tokens ? std::to_string(mkv_params::kGemvRows) + " or " +
                                    std::to_string(mkv_params::kGemvRowsWide)
                              : rows_text(kGpuTokenRows, " or ")) +
                 " gemv_rows, got " + std::to_string(rows));
  return rows;
}

void dispatch_gemv(gpu::ComputeEncoder& enc, uint32_t rows, uint32_t tokens, uint32_t n_out, uint32_t n_tokens) {
  const uint32_t simds = gemv_simds(rows);
  enc.dispatch_threadgroups({ceil_div(n_out, rows * simds), ceil_div(n_tokens, tokens), 1}, {32 * simds, 1, 1});
}

// A split's three outputs: 0 < split_a < split_b < n_out, each (n_tokens, its
// columns) float32, none overlapping x.
void check_split_outputs(const MatmulArgs& a, size_t x_bytes) {
  if (!(a.split_a < a.split_b && a.split_b < a.n_out))
    fail(kOp, "split_a and split_b must cut n_out in three: 0 < split_a < split_b < n_out, got " +
                  std::to_string(a.split_a) + ", " + std::to_string(a.split_b) + " of " + std::to_string(a.n_out));
  if (a.split_f16 && a.accumulate) fail(kOp, "accumulate adds to float outputs; split_f16 writes f16 ones");
  const size_t row = size_t(a.n_tokens) * 4, row2 = size_t(a.n_tokens) * (a.split_f16 ? 2 : 4);
  const char* kv = a.split_f16 ? "f16" : "float32";
  const std::string y2 = std::string("y2 (n_tokens, split_b - split_a) ") + kv,
                    y3 = std::string("y3 (n_tokens, n_out - split_b) ") + kv;
  const struct { const char* what; const BufferView& v; size_t bytes, align; } outs[] = {
      {"y (n_tokens, split_a) float32", a.y, row * a.split_a, 4},
      {y2.c_str(), a.y2, row2 * (a.split_b - a.split_a), a.split_f16 ? 2u : 4u},
      {y3.c_str(), a.y3, row2 * (a.n_out - a.split_b), a.split_f16 ? 2u : 4u}};
  for (const auto& o : outs) {
    check_view(kOp, o.what, o.v, o.bytes, o.align);
    check_no_overlap(kOp, a.x, x_bytes, o.v, o.bytes);
  }
}

}  // namespace

uint64_t matmul_weight_bytes_read(gpu::Device& device, const MatmulArgs& a) {
  const bool gemv = a.kernel == MatmulKernel::gemv ||
                    (a.kernel == MatmulKernel::automatic && a.n_tokens == 1);
  const bool x16 = !gemv && a.activations_16bit && gemm_shape(device, a.kernel) == GemmShape::mma;
  const uint32_t per_pass = gemv ? (a.gemv_tokens ? a.gemv_tokens : gemv_tokens(device, a.n_tokens))
                            : x16 ? mkv_params::kGemm16Tokens
                                  : mkv_params::kGemmTokens;
  return ceil_div(a.n_tokens, per_pass) * weight_bytes(a.wtype, a.n_out, a.n_in, kOp);
}

void matmul(gpu::Device& device, gpu::ComputeEncoder& enc, const MatmulArgs& a) {
  // 1. Check shapes and buffers.
  check_common(kOp, a.n_tokens, a.n_out);
  const size_t w_bytes = weight_bytes(a.wtype, a.n_out, a.n_in, kOp);
  const size_t x_bytes = size_t(a.n_tokens) * a.n_in * 4, y_bytes = size_t(a.n_tokens) * a.n_out * 4;
  check_view(kOp, "x (n_tokens, n_in) float32", a.x, x_bytes, 16);
  check_view(kOp, ("w (n_out, n_in) " + std::string(weight_type_name(a.wtype))).c_str(), a.w,
             w_bytes, weight_align(a.wtype));
  const bool split = a.split_a != 0;
  if (a.split_f16 && !split) fail(kOp, "split_f16 is for split outputs (split_a > 0)");
  if (split) {
    check_split_outputs(a, x_bytes);
  } else {
    check_view(kOp, "y (n_tokens, n_out) float32", a.y, y_bytes, 4);
    check_no_overlap(kOp, a.x, x_bytes, a.y, y_bytes);
  }
  const bool has_bias = a.bias.buffer != nullptr;
  if (has_bias) check_view(kOp, "bias (n_out) float32", a.bias, size_t(a.n_out) * 4, 4);

  // 2. Pick the kernel.
  const bool gemv = a.kernel == MatmulKernel::gemv ||
                    (a.kernel == MatmulKernel::automatic && a.n_tokens == 1);
  if (split && gemv) fail(kOp, "split outputs (split_a) need a gemm kernel: kernel='gemm' and more than one token");
  if (a.activations_16bit && !has_x16_gemm(a.wtype))
    fail(kOp, std::string("activations_16bit is built for f16 and bf16 weights, not ") + weight_type_name(a.wtype));
  const uint32_t tokens = gemv ? pick_gemv_tokens(kOp, device, a.gemv_tokens, a.gemv_rows, a.n_tokens) : 0;
  const uint32_t rows = gemv ? pick_gemv_rows(kOp, device, a.wtype, a.gemv_rows, a.n_out, a.n_tokens, tokens) : 0;
  const GemmShape shape = gemv ? GemmShape::gpu : gemm_shape(device, a.kernel);
  auto pipeline = device.pipeline(
      gemv ? gemv_name("gemv_", a.wtype, rows, needs_c4_fallback(a.wtype, rows, a.n_in, a.w), tokens)
           : gemm_name(a.wtype, shape, a.activations_16bit));

  // 3. Bind and dispatch. Without a bias, x stands in at index 4 (never read).
  const uint32_t flags = (has_bias ? mkv_params::kMatmulBias : 0u) |
                         (a.accumulate ? mkv_params::kMatmulAccumulate : 0u) | (split ? mkv_params::kMatmulSplit : 0u) |
                         (a.activation == MatmulActivation::gelu_tanh ? mkv_params::kMatmulGelu : 0u) |
                         (a.split_f16 ? mkv_params::kMatmulSplitF16 : 0u);
  const mkv_params::Matmul p{a.n_tokens, a.n_in, a.n_out, flags, a.split_a, a.split_b};
  enc.set_pipeline(pipeline);
  bind_params(enc, p, 0);
  bind(enc, a.w, 1);
  bind(enc, a.x, 2);
  bind(enc, a.y, 3);
  bind(enc, has_bias ? a.bias : a.x, 4);
  if (!gemv) {  // without a split, y stands in for the second and third outputs (never written)
    bind(enc, split ? a.y2 : a.y, 5);
    bind(enc, split ? a.y3 : a.y, 6);
  }
  if (gemv) {
    dispatch_gemv(enc, rows, tokens, a.n_out, a.n_tokens);
  } else if (shape == GemmShape::mma && a.activations_16bit) {  // metal/gemm_mma16.h's tile
    enc.dispatch_threadgroups({ceil_div(a.n_out, mkv_params::kGemm16Rows),
                               ceil_div(a.n_tokens, mkv_params::kGemm16Tokens), 1},
                              {mkv_params::kGemm16Threads, 1, 1});
  } else {
    enc.dispatch_threadgroups({ceil_div(a.n_out, mkv_params::kGemmRows),
                               ceil_div(a.n_tokens, mkv_params::kGemmTokens), 1},
                              {gemm_threads(shape), 1, 1});
  }
}

void matmul_glu(gpu::Device& device, gpu::ComputeEncoder& enc, const GluArgs& a) {
  constexpr const char* op = "matmul_glu";
  check_common(op, a.n_tokens, a.n_out);
  const size_t w_bytes = weight_bytes(a.wtype, uint64_t(a.n_out) * 2, a.n_in, op);
  const size_t x_bytes = size_t(a.n_tokens) * a.n_in * 4, y_bytes = size_t(a.n_tokens) * a.n_out * 4;
  check_view(op, "x (n_tokens, n_in) float32", a.x, x_bytes, 16);
  check_view(op, ("w (2 n_out, n_in) " + std::string(weight_type_name(a.wtype))).c_str(), a.w, w_bytes,
             weight_align(a.wtype));
  check_view(op, "y (n_tokens, n_out) float32", a.y, y_bytes, 4);
  check_no_overlap(op, a.x, x_bytes, a.y, y_bytes);

  if (a.kernel != MatmulKernel::automatic && a.kernel != MatmulKernel::gemv) {  // prefill: a gemm with the GLU epilogue
    const GemmShape shape = gemm_shape(device, a.kernel);
    const uint32_t flags = a.act == GluActivation::silu ? mkv_params::kMatmulSwiglu : mkv_params::kMatmulGeglu;
    enc.set_pipeline(device.pipeline(gemm_name(a.wtype, shape)));
    bind_params(enc, mkv_params::Matmul{a.n_tokens, a.n_in, a.n_out, flags}, 0);
    bind(enc, a.w, 1);
    bind(enc, a.x, 2);
    bind(enc, a.y, 3);
    bind(enc, a.x, 4);  // no bias: a placeholder, never read
    bind(enc, a.y, 5);  // no split: placeholders, never written
    bind(enc, a.y, 6);
    enc.dispatch_threadgroups({ceil_div(a.n_out, mkv_params::kGemmRows / 2), ceil_div(a.n_tokens, mkv_params::kGemmTokens), 1},
                              {gemm_threads(shape), 1, 1});
    return;
  }
  const char* act = a.act == GluActivation::silu ? "gemv_swiglu_" : "gemv_geglu_";
  // A GLU SIMD-group computes its rows of both halves: half the rows of a gemv
  // over the stacked 2 n_out (GPU shapes; the host's shapes stay as they are).
  const uint32_t tokens = pick_gemv_tokens(op, device, a.gemv_tokens, a.gemv_rows, a.n_tokens);
  uint32_t rows = a.gemv_rows;
  if (rows == 0) {
    rows = gemv_rows(device, a.wtype, 2 * a.n_out, ceil_div(a.n_tokens, tokens));
    if (listed(kGpuRows, rows)) rows = std::max(rows / 2, 1u);
  }
  rows = pick_gemv_rows(op, device, a.wtype, rows, a.n_out, a.n_tokens, tokens);
  const mkv_params::Matmul p{a.n_tokens, a.n_in, a.n_out, 0u};
  enc.set_pipeline(
      device.pipeline(gemv_name(act, a.wtype, rows, needs_c4_fallback(a.wtype, rows, a.n_in, a.w), tokens)));
  bind_params(enc, p, 0);
  bind(enc, a.w, 1);
  bind(enc, a.x, 2);
  bind(enc, a.y, 3);
  dispatch_gemv(enc, rows, tokens, a.n_out, a.n_tokens);
}

std::vector<std::string> linear_kernel_names(gpu::Device& device) {
  // The widths and token counts the ops accept when asked (what the device's
  // own choice picks is among them), through the same checks and name builder.
  std::set<std::string> names;
  for (const std::string& type : weight_type_names()) {
    const WeightType wtype = parse_weight_type(type, kOp);
    names.insert(gemm_name(wtype, GemmShape::gpu));
    names.insert(gemm_name(wtype, GemmShape::mma));
    if (has_x16_gemm(wtype)) names.insert(gemm_name(wtype, GemmShape::mma, true));
    if (device.properties().has_host_shapes) names.insert(gemm_name(wtype, GemmShape::host));
    std::vector<uint32_t> widths(std::begin(kGpuRows), std::end(kGpuRows));
    widths.insert(widths.end(), {mkv_params::kGemvRows, mkv_params::kGemvRowsWide});
    for (uint32_t asked_tokens : {1u, mkv_params::kGemvTokensGpu, mkv_params::kGemvTokensHost})
      for (uint32_t asked_rows : widths) {
        uint32_t tokens = 0, rows = 0;
        try {
          tokens = pick_gemv_tokens(kOp, device, asked_tokens, asked_rows, 2 * asked_tokens);
          rows = pick_gemv_rows(kOp, device, wtype, asked_rows, 64, 2 * asked_tokens, tokens);
        } catch (const gpu::GpuError&) {
          continue;  // a shape the ops refuse on this device
        }
        // Rows that start 16-byte aligned (n_in 8) and rows that do not (n_in 4).
        for (uint32_t n_in : {8u, 4u})
          for (const char* prefix : {"gemv_", "gemv_swiglu_", "gemv_geglu_"})
            names.insert(gemv_name(prefix, wtype, rows, needs_c4_fallback(wtype, rows, n_in, {}), tokens));
      }
  }
  return {names.begin(), names.end()};
}

}  // namespace mkv::ops
