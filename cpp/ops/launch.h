// Launch sizes from what the device reports (gpu::DeviceProperties and a
// pipeline's occupancy): the one place where ops turn device properties into
// grid choices. docs/KERNELS.md lists what each op derives from them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gpu/device.h"

namespace mkv::ops {

// Threadgroups of `pipeline` (threads, threadgroup memory each) that the whole
// device runs at once: compute units x resident threadgroups per unit (>= 1).
// A grid of fewer leaves units idle; a grid of a few times more hides the tail.
uint32_t device_wave(const gpu::Device& device, const gpu::Pipeline& pipeline, uint32_t threads,
                     size_t threadgroup_memory = 0);

}  // namespace mkv::ops
