// Device-layer benchmarks of the host executor: the cost of a fiber switch
// (host only: on another --device the row says it was skipped).
// (The GEMVs, including the f16 49152 x 576 lm_head, are in bench_linear.cpp.)

#include "bench.h"
#include "gpu/device.h"
#include "gpu/host/executor.h"
#include "gpu/host/fiber.h"

namespace mkv::bench {
namespace {

std::vector<Result> fiber_switch(const Context& ctx) {
  if (!ctx.is_host())
    return {{"fiber_switch", {}, "skipped: fibers are the host executor's (--device " + ctx.device->kind() + ")"}};
  const int iterations = 2000000;
  host::measure_fiber_switch_ns(iterations / 10);  // warm-up
  const double ns = host::measure_fiber_switch_ns(iterations);
  return {{"fiber_switch", {{"ns_per_switch", ns}}, std::to_string(iterations) + " round trips"}};
}

MKV_BENCH("fiber", "host executor: the cost of one fiber switch", fiber_switch);

}  // namespace
}  // namespace mkv::bench
