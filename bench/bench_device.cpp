// Device-layer benchmarks on the host executor: the cost of a fiber switch and
// an f16 GEMV the size of SmolLM2-135M's lm_head (49152 x 576).
#include <cstring>
#include <random>

#include "bench.h"
#include "gpu/device.h"
#include "gpu/host/executor.h"
#include "gpu/host/fiber.h"
#include "metal/params.h"

namespace mkv::bench {
namespace {

std::vector<Result> fiber_switch(const Context&) {
  const int iterations = 2000000;
  host::measure_fiber_switch_ns(iterations / 10);  // warm-up
  const double ns = host::measure_fiber_switch_ns(iterations);
  return {{"fiber_switch", {{"ns_per_switch", ns}}, std::to_string(iterations) + " round trips"}};
}

std::vector<Result> gemv_f16(const Context& ctx) {
  const uint32_t rows = 49152, cols = 576;
  auto dev = gpu::create_device("host");
  auto queue = dev->new_command_queue();
  auto w = dev->new_buffer(size_t(rows) * cols * 2);
  auto x = dev->new_buffer(cols * 4);
  auto y = dev->new_buffer(rows * 4);
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  auto* wp = static_cast<_Float16*>(w->contents());
  for (size_t i = 0; i < size_t(rows) * cols; ++i) wp[i] = _Float16(dist(rng));
  auto* xp = static_cast<float*>(x->contents());
  for (uint32_t i = 0; i < cols; ++i) xp[i] = dist(rng);
  auto pipeline = dev->pipeline("gemv_f16");
  const mkv_params::Gemv p{rows, cols};
  const uint32_t simds = 2, rows_per_group = simds * 4;  // gemv.metal: 4 rows per SIMD-group

  const double ms = median_ms(ctx.repeat, [&] {
    auto cb = queue->command_buffer();
    auto& enc = cb->compute_encoder();
    enc.set_pipeline(pipeline);
    enc.set_bytes(&p, sizeof p, 0);
    enc.set_buffer(w, 0, 1);
    enc.set_buffer(x, 0, 2);
    enc.set_buffer(y, 0, 3);
    enc.dispatch_threadgroups({(rows + rows_per_group - 1) / rows_per_group, 1, 1}, {32 * simds, 1, 1});
    enc.end_encoding();
    cb->commit();
    cb->wait();
  });
  const double bytes = double(rows) * cols * 2;
  return {{"gemv_f16_49152x576",
           {{"ms", ms}, {"GB_per_s", bytes / (ms * 1e-3) / 1e9}, {"threads", double(host::executor_threads())}},
           "host executor"}};
}

MKV_BENCH("fiber", fiber_switch);
MKV_BENCH("gemv", gemv_f16);

}  // namespace
}  // namespace mkv::bench
