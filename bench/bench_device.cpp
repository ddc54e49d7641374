// Device-layer benchmarks on the host executor: the cost of a fiber switch.
// (The GEMVs, including the f16 49152 x 576 lm_head, are in bench_linear.cpp.)

#include "bench.h"
#include "gpu/device.h"
#include "gpu/host/executor.h"
#include "gpu/host/fiber.h"

namespace mkv::bench {
namespace {

std::vector<Result> fiber_switch(const Context&) {
  const int iterations = 2000000;
  host::measure_fiber_switch_ns(iterations / 10);  // warm-up
  const double ns = host::measure_fiber_switch_ns(iterations);
  return {{"fiber_switch", {{"ns_per_switch", ns}}, std::to_string(iterations) + " round trips"}};
}

MKV_BENCH("fiber", "host executor: the cost of one fiber switch", fiber_switch);

}  // namespace
}  // namespace mkv::bench
