// Device selection and the small shared pieces of the device layer.
#include "device.h"

#include <cstring>

#include "device_select.h"
#include "host/host_device.h"
#ifdef METALKV_HAVE_METAL
#include "metal/metal_device.h"
#endif
#ifdef METALKV_HAVE_CUDA
#include "cuda/cuda_device.h"
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

void Buffer::check_range(const char* what, size_t offset, size_t bytes) const {
  if (offset > length() || bytes > length() - offset)
    throw GpuError(std::string("[buffer] ") + what + " " + std::to_string(bytes) + " bytes at offset " +
                   std::to_string(offset) + " overflows the " + std::to_string(length()) + "-byte buffer");
}

// Shared-memory devices: a copy through contents(). A device without CPU-visible
// memory overrides both.
void Buffer::write(size_t offset, const void* src, size_t bytes) {
  check_range("writing", offset, bytes);
  if (bytes) std::memcpy(static_cast<char*>(contents()) + offset, src, bytes);
}

void Buffer::read(size_t offset, void* dst, size_t bytes) const {
  check_range("reading", offset, bytes);
  if (bytes) std::memcpy(dst, static_cast<const char*>(const_cast<Buffer*>(this)->contents()) + offset, bytes);
}

std::map<std::string, uint64_t> Counters::as_map() const {
  return {{"dispatches", dispatches},
          {"compute_encoders", compute_encoders},
          {"blit_encoders", blit_encoders},
          {"command_buffers_committed", command_buffers_committed},
          {"waits", waits},
          {"blit_bytes_copied", blit_bytes_copied}};
}

namespace {

std::vector<GpuBackend> gpu_backends() {
  GpuBackend metal{"metal", false, "'metal' needs macOS on Apple Silicon; this build has only the 'host' "
                                   "device (the CPU executor)", [] { return false; }, nullptr};
#ifdef METALKV_HAVE_METAL
  metal.built = true;
  metal.available = metal_device_available;
  metal.create = create_metal_device;
#endif
  GpuBackend cuda{"cuda", false, "'cuda' needs a build with the CUDA toolkit (nvcc found at install time; "
                                 "docs/BUILD.md); this build has no CUDA device", [] { return false; }, nullptr};
#ifdef METALKV_HAVE_CUDA
  cuda.built = true;
  cuda.available = [] { return cuda_device_available(); };
  cuda.create = create_cuda_device;
  cuda.why_unavailable = [] {
    std::string why;
    cuda_device_available(&why);
    return why;
  };
#endif
  return {metal, cuda};  // the order "auto" tries them in
}

}  // namespace

std::map<std::string, bool> built_backends() {
  std::map<std::string, bool> built;
  for (const GpuBackend& gpu : gpu_backends()) built[gpu.kind] = gpu.built;
  return built;
}

std::vector<std::string> available_device_kinds() {
  std::vector<std::string> kinds;
  for (const GpuBackend& gpu : gpu_backends())
    if (gpu.built && gpu.available()) kinds.push_back(gpu.kind);
  kinds.push_back("host");
  return kinds;
}

DeviceChoice choose_device(const std::string& kind, const DeviceOptions& options) {
  return choose_device(kind, gpu_backends(), [&] { return create_host_device(options); });
}

DevicePtr create_device(const std::string& kind, const DeviceOptions& options) {
  return choose_device(kind, options).device;
}

}  // namespace mkv::gpu
