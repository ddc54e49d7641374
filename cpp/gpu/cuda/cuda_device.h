// CUDA backend entry points (built when the CUDA toolkit is found:
// METALKV_HAVE_CUDA=1). Free of CUDA headers, like metal/metal_device.h.
#pragma once

#include <string>

#include "../device.h"

namespace mkv::gpu {

// True if this process sees a CUDA GPU; otherwise *why says what CUDA answered
// (no driver, no device, ...). Cheap after the first call.
bool cuda_device_available(std::string* why = nullptr);

// The first CUDA GPU behind the Device interface. Raises GpuError if there is none.
DevicePtr create_cuda_device();

}  // namespace mkv::gpu
