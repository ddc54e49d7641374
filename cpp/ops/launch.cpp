#include "ops/launch.h"

#include <algorithm>

#include "metal/linear_params.h"
#include "ops/linear.h"  // check_view
#include "ops/ops.h"

namespace mkv::ops {

uint32_t device_wave(const gpu::Device& device, const gpu::Pipeline& pipeline, uint32_t threads,
                     size_t threadgroup_memory) {
  const uint32_t units = std::max(device.properties().compute_units, 1u);
  const uint32_t per_unit = std::max(pipeline.resident_threadgroups_per_unit(threads, threadgroup_memory), 1u);
  return units * per_unit;
}

uint32_t strided_threads(const gpu::Device& device, uint64_t items, uint32_t cap) {
  if (device.properties().lanes_are_fibers) return 1;
  const uint64_t simds = std::max<uint64_t>((items + 31) / 32, 1);
  return uint32_t(std::min<uint64_t>(cap, simds * 32));
}

uint32_t row_threads(const gpu::Device& device) {
  return 32 * (device.properties().lanes_are_fibers ? 1u : mkv_params::kRowSimds);
}

void dispatch_elements(gpu::ComputeEncoder& enc, uint64_t n) {
  const uint64_t per_group = mkv_params::kElementThreads * mkv_params::kElementsPerThread;
  enc.dispatch_threadgroups({uint32_t((n + per_group - 1) / per_group), 1, 1}, {mkv_params::kElementThreads, 1, 1});
}

void dispatch_threads(gpu::ComputeEncoder& enc, uint64_t n) {
  const uint32_t threads = mkv_params::kElementThreads;
  enc.dispatch_threadgroups({uint32_t((n + threads - 1) / threads), 1, 1}, {threads, 1, 1});
}

void below_2_32(const char* op, const char* what, uint64_t n) {
  if (n >= (uint64_t(1) << 32)) fail(op, std::string(what) + " must be below 2^32 floats");
}

void check_gather(const char* op, const BufferView& x, const char* x_what, uint64_t n_in, const BufferView& out,
                  const char* out_what, uint64_t n_out) {
  below_2_32(op, "x", n_in);
  below_2_32(op, "out", n_out);
  check_view(op, x_what, x, n_in * 4, 4);
  check_view(op, out_what, out, n_out * 4, 4);
  if (overlaps(x, n_in * 4, out, n_out * 4)) fail(op, "out must not overlap x");
}

}  // namespace mkv::ops
