// Linear-layer benchmarks on the bench's device (group "linear"; the host
// executor unless --device; GPU kernel times: the gpu_kernels group): gemv for every
// weight type at SmolLM2-135M's shapes (n_out x n_in: 1536x576 gate/up,
// 576x1536 down, 49152x576 lm_head), gemm for a 64-token prefill chunk, and
// the small per-token ops (argmax, softmax, rms_norm, swiglu, embedding).
// Prints ms per call (median wall time), cpu_ms (mean CPU time of the whole
// process per call: steadier than wall time when other work shares the
// cores) and the weight bytes each call reads.
//
//   metalkv-bench --filter linear [--repeat N] [--device KIND]
#include <ctime>
#include <random>

#include "bench.h"
#include "gpu/device.h"
#include "gpu/host/executor.h"
#include "metal/linear_params.h"
#include "ops/elementwise.h"
#include "ops/linear.h"
#include "ops/weight_pack.h"

namespace mkv::bench {
namespace {

using ops::WeightType;

// Random weights: random bytes, then every block's scale (and min) set to a
// finite half, so no NaN or infinity slows or skews the arithmetic; packed as
// the kernels read them (ops/weight_pack.h).
gpu::BufferPtr random_weights(gpu::Device& dev, WeightType t, uint32_t rows, uint32_t cols) {
  const size_t bytes = ops::file_weight_bytes(t, rows, cols, "bench");
  std::vector<unsigned char> host(bytes);
  unsigned char* p = host.data();
  std::mt19937 rng(rows * 31 + cols);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  if (t == WeightType::f32 || t == WeightType::f16) {
    for (size_t i = 0; i < size_t(rows) * cols; ++i) {
      if (t == WeightType::f32) reinterpret_cast<float*>(p)[i] = dist(rng);
      else reinterpret_cast<_Float16*>(p)[i] = _Float16(dist(rng));
    }
  } else {
    for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(rng());
    const size_t block = bytes / (size_t(rows) * cols / 32);
    const int halves = t == WeightType::q4_1 ? 2 : 1;  // d, and m for Q4_1
    for (size_t b = 0; b < bytes; b += block)
      for (int h = 0; h < halves; ++h) reinterpret_cast<_Float16*>(p + b)[h] = _Float16(0.01f * dist(rng));
  }
  std::vector<unsigned char> packed(ops::weight_bytes(t, rows, cols, "bench"));
  ops::pack_weights(t, rows, cols, p, packed.data());
  auto buf = dev.new_buffer(packed.size());
  buf->write(0, packed.data(), packed.size());
  return buf;
}

double process_cpu_ms() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

Result time_matmul(gpu::Device& dev, gpu::CommandQueue& queue, const Context& ctx, WeightType t,
                   uint32_t n_tokens, uint32_t n_out, uint32_t n_in, ops::MatmulKernel kernel) {
  ops::MatmulArgs a;
  a.w = {random_weights(dev, t, n_out, n_in)};
  a.x = {dev.new_buffer(size_t(n_tokens) * n_in * 4)};
  a.y = {dev.new_buffer(size_t(n_tokens) * n_out * 4)};
  std::vector<float> x(size_t(n_tokens) * n_in);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 17) / 17.0f - 0.5f;
  a.x.buffer->write(0, x.data(), x.size() * 4);
  a.n_tokens = n_tokens;
  a.n_in = n_in;
  a.n_out = n_out;
  a.wtype = t;
  a.kernel = kernel;
  const double cpu0 = process_cpu_ms();
  const double ms = median_ms(ctx.repeat, [&] {
    auto cb = queue.command_buffer();
    auto& enc = cb->compute_encoder();
    ops::matmul(dev, enc, a);
    enc.end_encoding();
    cb->commit();
    cb->wait();
  });
  const double cpu_ms = (process_cpu_ms() - cpu0) / (ctx.repeat + 1);  // + the warm-up run
  const double bytes = double(ops::matmul_weight_bytes_read(dev, a));
  const std::string shape = std::to_string(n_out) + "x" + std::to_string(n_in);
  const bool gemv = kernel == ops::MatmulKernel::gemv;
  std::string name = std::string(gemv ? "gemv_" : "gemm_") + ops::weight_type_name(t) + "_" + shape;
  if (!gemv) name += "_t" + std::to_string(n_tokens);
  const double macs = double(n_tokens) * n_out * n_in;
  return {name,
          {{"ms", ms},
           {"cpu_ms", cpu_ms},
           {"weight_MB", bytes / 1e6},
           {"GB_per_s", bytes / (ms * 1e-3) / 1e9},
           {"GMAC_per_s", macs / (ms * 1e-3) / 1e9}},
          dev.kind() == "host" ? "host, " + std::to_string(host::executor_threads()) + " threads" : dev.name()};
}

// One op encoded alone in a command buffer: ms and cpu_ms per call.
Result time_op(gpu::CommandQueue& queue, const Context& ctx, const std::string& name,
               const std::function<void(gpu::ComputeEncoder&)>& encode) {
  const double cpu0 = process_cpu_ms();
  const double ms = median_ms(ctx.repeat, [&] {
    auto cb = queue.command_buffer();
    auto& enc = cb->compute_encoder();
    encode(enc);
    enc.end_encoding();
    cb->commit();
    cb->wait();
  });
  return {name, {{"ms", ms}, {"cpu_ms", (process_cpu_ms() - cpu0) / (ctx.repeat + 1)}}, ctx.device->kind()};
}

// The small per-token ops of a SmolLM2 decode step, for scale.
std::vector<Result> small_ops(gpu::Device& dev, gpu::CommandQueue& queue, const Context& ctx) {
  const uint32_t vocab = 49152, hidden = 576, ff = 1536;
  ops::BufferView logits{dev.new_buffer(vocab * 4)}, ids{dev.new_buffer(4)};
  ops::BufferView h{dev.new_buffer(hidden * 4)}, norm_w{dev.new_buffer(hidden * 4)};
  ops::BufferView gate{dev.new_buffer(ff * 4)}, up{dev.new_buffer(ff * 4)};
  ops::BufferView table{random_weights(dev, WeightType::q4_1, vocab, hidden)};
  return {
      time_op(queue, ctx, "argmax_f32_49152",
              [&](auto& enc) { ops::argmax(dev, enc, logits, ids, 1, vocab); }),
      time_op(queue, ctx, "softmax_f32_49152",
              [&](auto& enc) { ops::softmax(dev, enc, logits, logits, 1, vocab); }),
      time_op(queue, ctx, "rms_norm_f32_576",
              [&](auto& enc) { ops::rms_norm(dev, enc, h, norm_w, WeightType::f32, h, 1, hidden, 1e-5f); }),
      time_op(queue, ctx, "swiglu_f32_1536",
              [&](auto& enc) { ops::swiglu(dev, enc, gate, up, gate, ff); }),
      time_op(queue, ctx, "embedding_q4_1_576",
              [&](auto& enc) { ops::embedding(dev, enc, table, WeightType::q4_1, ids, h, 1, hidden, vocab); }),
  };
}

std::vector<Result> linear(const Context& ctx) {
  const gpu::DevicePtr& dev = ctx.device;
  auto queue = dev->new_command_queue();
  const WeightType types[] = {WeightType::f32, WeightType::f16, WeightType::q8_0,
                              WeightType::q4_0, WeightType::q4_1};
  const uint32_t shapes[][2] = {{1536, 576}, {576, 1536}, {49152, 576}};  // (n_out, n_in)
  std::vector<Result> out;
  for (WeightType t : types)
    for (const auto& s : shapes)
      out.push_back(time_matmul(*dev, *queue, ctx, t, 1, s[0], s[1], ops::MatmulKernel::gemv));
  for (WeightType t : types)
    out.push_back(time_matmul(*dev, *queue, ctx, t, 64, 1536, 576, ops::MatmulKernel::gemm));
  // The same 64 tokens through gemv: what tiling saves.
  out.push_back(time_matmul(*dev, *queue, ctx, WeightType::q4_1, 64, 1536, 576, ops::MatmulKernel::gemv));
  out.back().name += "_t64";
  for (Result& r : small_ops(*dev, *queue, ctx)) out.push_back(std::move(r));
  return out;
}

MKV_BENCH("linear", "gemv/gemm for every weight type at SmolLM2-135M shapes, and the per-token small ops", linear);

}  // namespace
}  // namespace mkv::bench
