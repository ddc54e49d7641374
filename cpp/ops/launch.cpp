#include "ops/launch.h"

#include <algorithm>

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

}  // namespace mkv::ops
