// The host implementation of the device layer: buffers are plain memory,
// command buffers record commands and run them on commit through the host
// executor. Errors found while running are raised by wait(), as on a GPU.
#pragma once

#include "../device.h"

namespace mkv::gpu {

DevicePtr create_host_device(const DeviceOptions& options);

}  // namespace mkv::gpu
