// Which device a kind names, and what "auto" falls back to.
//
//   "host"   the host executor, always.
//   "metal"  that GPU backend, or an error saying why not (not built, no GPU,
//            or its kernels did not compile: the compiler's message).
//   "auto"   the first GPU backend that is built, available and whose kernels
//            compile; else the host executor, with a note saying why, which
//            Python turns into a warning.
//
// The rules live here, apart from the backends, so that a test can drive them
// with fake backends (tests/gpu/device_select_check.cpp).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "device.h"

namespace mkv::gpu {

struct GpuBackend {
  std::string kind;                          // "metal"
  bool built = false;                        // compiled into this binary
  std::string not_built;                     // why not, for the error: "'metal' needs macOS ..."
  std::function<bool()> available;           // a GPU is there (cheap probe)
  std::function<DevicePtr()> create;         // creates it and compiles its kernels; throws GpuError
  std::function<std::string()> why_unavailable = nullptr;  // optional detail for the error
};

struct DeviceChoice {
  DevicePtr device;
  std::string fallback;  // non-empty: "auto" fell back to the host, and why
};

DeviceChoice choose_device(const std::string& kind, const std::vector<GpuBackend>& gpus,
                           const std::function<DevicePtr()>& host);

}  // namespace mkv::gpu
