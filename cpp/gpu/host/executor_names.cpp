// The host executor's names and settings: collective names for its messages,
// fiber orders by name, the worker count ($METALKV_HOST_THREADS). Apart from
// executor.cpp, which runs dispatches.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>

#include "executor.h"
#include "gpu/errors.h"
#include "lane_api.h"

namespace mkv::host {

const char* collective_name(Collective op) {
  switch (op) {
#define MKV_NAME(x) \
  case Collective::x: return #x;
    MKV_NAME(threadgroup_barrier) MKV_NAME(simdgroup_barrier) MKV_NAME(simd_sum)
    MKV_NAME(simd_product) MKV_NAME(simd_max) MKV_NAME(simd_min) MKV_NAME(simd_and)
    MKV_NAME(simd_or) MKV_NAME(simd_xor) MKV_NAME(simd_prefix_inclusive_sum)
    MKV_NAME(simd_prefix_exclusive_sum) MKV_NAME(simd_prefix_inclusive_product)
    MKV_NAME(simd_prefix_exclusive_product) MKV_NAME(simd_shuffle) MKV_NAME(simd_shuffle_xor)
    MKV_NAME(simd_shuffle_up) MKV_NAME(simd_shuffle_down) MKV_NAME(simd_broadcast)
    MKV_NAME(simd_broadcast_first) MKV_NAME(simd_all) MKV_NAME(simd_any) MKV_NAME(simd_ballot)
    MKV_NAME(simd_is_first) MKV_NAME(simdgroup_multiply_accumulate)
#undef MKV_NAME
  }
  return "collective";
}

FiberOrder parse_fiber_order(const std::string& name) {
  if (name == "forward") return FiberOrder::forward;
  if (name == "reverse") return FiberOrder::reverse;
  if (name == "random") return FiberOrder::random;
  throw gpu::GpuError("[host] unknown fiber order '" + name +
                      "'; expected 'forward', 'reverse' or 'random'");
}

const char* fiber_order_name(FiberOrder order) {
  switch (order) {
    case FiberOrder::forward: return "forward";
    case FiberOrder::reverse: return "reverse";
    case FiberOrder::random: return "random";
  }
  return "?";
}

int executor_threads() {
  if (const char* env = std::getenv("METALKV_HOST_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace mkv::host
