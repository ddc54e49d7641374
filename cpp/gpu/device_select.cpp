#include "device_select.h"

namespace mkv::gpu {

DeviceChoice choose_device(const std::string& kind, const std::vector<GpuBackend>& gpus,
                           const std::function<DevicePtr()>& host) {
  if (kind == "host") return {host(), ""};
  for (const GpuBackend& gpu : gpus) {
    if (kind != gpu.kind) continue;
    if (!gpu.built) throw GpuError("[device] " + gpu.not_built);
    if (!gpu.available()) {
      std::string why;
      if (gpu.why_unavailable) why = gpu.why_unavailable();
      throw GpuError("[device] no " + gpu.kind + " GPU is available on this machine" +
                     (why.empty() ? "" : " (" + why + ")"));
    }
    return {gpu.create(), ""};  // errors, kernel compilation included, are the caller's to see
  }
  if (kind != "auto") {
    std::string kinds = "'auto', 'host'";
    for (const GpuBackend& gpu : gpus) kinds += ", '" + gpu.kind + "'";
    throw GpuError("[device] unknown device kind '" + kind + "'; expected " + kinds);
  }
  std::string why;
  for (const GpuBackend& gpu : gpus) {
    if (!gpu.built || !gpu.available()) continue;
    try {
      return {gpu.create(), ""};
    } catch (const GpuError& e) {
      why += (why.empty() ? "" : "; ") + gpu.kind + ": " + e.what();
    }
  }
  return {host(), why.empty() ? "" : why + " -- running on the host executor (the CPU) instead"};
}

}  // namespace mkv::gpu
