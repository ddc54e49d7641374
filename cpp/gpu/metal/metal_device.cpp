// Metal backend: device creation, buffers, counters and shared helpers.
// Kernel compilation lives in metal_library.cpp, command encoding in
// metal_command.cpp.

// metal-cpp is header-only; exactly one translation unit must emit the
// selector and class symbol definitions, and it is this one.
#define NS_PRIVATE_IMPLEMENTATION
#define MTL_PRIVATE_IMPLEMENTATION
#include "metal_objects.h"

#include "metal_device.h"

#include <algorithm>

#include "../apple_gpu.h"
#include "metal/linear_params.h"

namespace mkv::gpu {
namespace metal {

std::string to_std_string(const NS::String* s) {
  if (!s) return "";
  const char* utf8 = s->utf8String();
  return utf8 ? std::string(utf8) : std::string();
}

std::string describe(const NS::Error* error) {
  if (!error) return "unknown error (Metal gave no NSError)";
  return to_std_string(error->localizedDescription());
}

void CounterTotals::add(const Counters& delta) {
  std::lock_guard<std::mutex> lock(mu_);
  totals_ += delta;
}

Counters CounterTotals::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return totals_;
}

void CounterTotals::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  totals_ = Counters{};
}

MetalBuffer::MetalBuffer(NS::SharedPtr<MTL::Buffer> buffer, size_t length)
    : buffer_(std::move(buffer)), contents_(buffer_->contents()), length_(length) {}

MetalPipeline::MetalPipeline(std::string name, NS::SharedPtr<MTL::ComputePipelineState> state)
    : name_(std::move(name)),
      state_(std::move(state)),
      max_threads_(uint32_t(state_->maxTotalThreadsPerThreadgroup())),
      simd_width_(uint32_t(state_->threadExecutionWidth())) {}

uint32_t MetalPipeline::resident_threadgroups_per_unit(uint32_t threads, size_t threadgroup_memory) const {
  if (threads == 0 || threads > max_threads_) return 0;
  const uint32_t by_threads = std::min(kAppleThreadsPerCore, std::max(max_threads_, threads)) / threads;
  const size_t by_memory = threadgroup_memory ? kAppleThreadgroupMemoryPerCore / threadgroup_memory : by_threads;
  return uint32_t(std::min<size_t>(by_threads, by_memory));
}

MetalDevice::MetalDevice(NS::SharedPtr<MTL::Device> device)
    : device_(std::move(device)),
      max_threadgroup_memory_(size_t(device_->maxThreadgroupMemoryLength())) {
  AutoreleaseScope pool;  // name() returns an autoreleased string
  name_ = to_std_string(device_->name());
}

DeviceProperties MetalDevice::properties() const {
  DeviceProperties p{apple_gpu_cores(name_), kAppleThreadsPerCore, max_threadgroup_memory_,
                     size_t(device_->recommendedMaxWorkingSetSize())};
  // SIMD lanes in hardware (device.h): the GPU shapes, gemv widths chosen by the wave.
  p.gemv_tokens = mkv_params::kGemvTokensGpu;
  p.matrix_units = device_->supportsFamily(MTL::GPUFamilyApple7);  // simdgroup_matrix in hardware
  p.gemm_decode_rows = p.matrix_units ? mkv_params::kGemmDecodeRowsApple : 0;
  return p;
}

BufferPtr MetalDevice::new_buffer(size_t length) {
  // Metal returns nil for zero-length buffers; say so plainly (as the host device does).
  if (length == 0) throw GpuError("[metal] buffer length must be at least 1 byte");
  AutoreleaseScope pool;
  // newBuffer(length, options) zero-fills, which is what device.h promises.
  MTL::Buffer* raw = device_->newBuffer(length, MTL::ResourceStorageModeShared);
  if (!raw) {
    throw GpuError("[metal] could not allocate a buffer of " + std::to_string(length) +
                   " bytes on '" + name_ + "' (largest allowed: " +
                   std::to_string(device_->maxBufferLength()) +
                   " bytes); use smaller buffers or a smaller model/context");
  }
  return metered(std::make_shared<MetalBuffer>(NS::TransferPtr(raw), length));
}

CommandQueuePtr MetalDevice::new_command_queue() {
  AutoreleaseScope pool;
  MTL::CommandQueue* raw = device_->newCommandQueue();
  if (!raw) throw GpuError("[metal] could not create a command queue on '" + name_ + "'");
  return std::make_shared<MetalCommandQueue>(NS::TransferPtr(raw), totals_,
                                             max_threadgroup_memory_);
}

namespace {

// MTLCreateSystemDefaultDevice has been seen to return nil in some command-line
// processes, where MTLCopyAllDevices still lists the GPU (MLX reads that list
// first). CopyAllDevices is macOS-only and returns nil elsewhere.
NS::SharedPtr<MTL::Device> system_device() {
  AutoreleaseScope pool;
  if (MTL::Device* device = MTL::CreateSystemDefaultDevice()) return NS::TransferPtr(device);
  NS::SharedPtr<NS::Array> all = NS::TransferPtr(MTL::CopyAllDevices());
  if (all && all->count() > 0) {
    if (MTL::Device* first = all->object<MTL::Device>(0)) return NS::RetainPtr(first);
  }
  return {};
}

}  // namespace
}  // namespace metal

bool metal_device_available() {
  // The answer cannot change while the process runs; ask Metal once.
  static const bool available = bool(metal::system_device());
  return available;
}

DevicePtr create_metal_device() {
  NS::SharedPtr<MTL::Device> device = metal::system_device();
  if (!device) {
    throw GpuError(
        "[metal] no Metal GPU found on this machine; use the host device instead "
        "(create_device(\"host\"))");
  }
  auto metal_device = std::make_shared<metal::MetalDevice>(std::move(device));
  metal_device->compile_kernels();  // a rejected source is an error now, not at the first dispatch
  return metal_device;
}

}  // namespace mkv::gpu
