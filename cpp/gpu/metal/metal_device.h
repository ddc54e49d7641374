// Metal backend entry points (Apple only; built when METALKV_HAVE_METAL=1).
//
// This header is free of metal-cpp so that cpp/gpu/device.cpp can include it
// without pulling Objective-C runtime headers into the rest of the core.
#pragma once

#include "../device.h"

namespace mkv::gpu {

// True if this process can see a Metal GPU. Creates and drops a device handle;
// call it lazily (never at import time).
bool metal_device_available();

// The system's default Metal GPU behind the Device interface. Raises GpuError
// if there is none.
DevicePtr create_metal_device();

}  // namespace mkv::gpu
