// Device selection and the small shared pieces of the device layer.
#include "device.h"

#include "host/host_device.h"
#ifdef METALKV_HAVE_METAL
#include "metal/metal_device.h"
#endif

namespace mkv::gpu {

Counters& Counters::operator+=(const Counters& o) {
  dispatches += o.dispatches;
  compute_encoders += o.compute_encoders;
  blit_encoders += o.blit_encoders;
  command_buffers_committed += o.command_buffers_committed;
  waits += o.waits;
  blit_bytes_copied += o.blit_bytes_copied;
  return *this;
}

std::map<std::string, uint64_t> Counters::as_map() const {
  return {{"dispatches", dispatches},
          {"compute_encoders", compute_encoders},
          {"blit_encoders", blit_encoders},
          {"command_buffers_committed", command_buffers_committed},
          {"waits", waits},
          {"blit_bytes_copied", blit_bytes_copied}};
}

std::vector<std::string> available_device_kinds() {
  std::vector<std::string> kinds;
#ifdef METALKV_HAVE_METAL
  if (metal_device_available()) kinds.push_back("metal");
#endif
  kinds.push_back("host");
  return kinds;
}

DevicePtr create_device(const std::string& kind, const DeviceOptions& options) {
  if (kind == "host") return create_host_device(options);
  if (kind == "metal" || kind == "auto") {
#ifdef METALKV_HAVE_METAL
    if (metal_device_available()) return create_metal_device();
    if (kind == "metal") throw GpuError("[device] no Metal GPU is available on this Mac");
#else
    if (kind == "metal")
      throw GpuError("[device] 'metal' needs macOS on Apple Silicon; this build has only the "
                     "'host' device (the CPU executor)");
#endif
    return create_host_device(options);
  }
  throw GpuError("[device] unknown device kind '" + kind + "'; expected 'auto', 'host' or 'metal'");
}

}  // namespace mkv::gpu
