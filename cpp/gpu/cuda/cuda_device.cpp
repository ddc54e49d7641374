// CUDA backend: the kernel registry, buffers, pipelines and the device.
#include "cuda_device.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "cuda_command.h"
#include "cuda_objects.h"
#include "metal/linear_params.h"

namespace mkv::cuda {
namespace {

std::map<std::string, const KernelDesc*>& registry() {
  static std::map<std::string, const KernelDesc*> kernels;
  return kernels;
}

}  // namespace

KernelRegistrar::KernelRegistrar(const KernelDesc* desc) { registry()[desc->name] = desc; }

}  // namespace mkv::cuda

namespace mkv::gpu {
namespace cuda {

void fail(const std::string& message) { throw GpuError("[cuda] " + message); }

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

CudaBuffer::CudaBuffer(size_t length) : length_(length) {
  if (length == 0) fail("buffer length must be at least 1 byte");
  check(cudaMalloc(&ptr_, length), ("cudaMalloc of " + std::to_string(length) + " bytes").c_str());
  check(cudaMemset(ptr_, 0, length), "cudaMemset");  // zero-filled, as on every device
}

CudaBuffer::~CudaBuffer() { cudaFree(ptr_); }

void CudaBuffer::write(size_t offset, const void* src, size_t bytes) {
  check_range("writing", offset, bytes);
  if (bytes) check(cudaMemcpy(device_ptr() + offset, src, bytes, cudaMemcpyHostToDevice), "write (cudaMemcpy)");
}

void CudaBuffer::read(size_t offset, void* dst, size_t bytes) const {
  check_range("reading", offset, bytes);
  if (bytes) check(cudaMemcpy(dst, device_ptr() + offset, bytes, cudaMemcpyDeviceToHost), "read (cudaMemcpy)");
}

CudaPipeline::CudaPipeline(const mkv::cuda::KernelDesc* desc) : desc_(desc), name_(desc->name) {
  cudaFuncAttributes a{};
  check(cudaFuncGetAttributes(&a, desc->fn), ("cudaFuncGetAttributes(" + name_ + ")").c_str());
  // The kernel's declared limit, and what its register use allows on this GPU.
  max_threads_ = std::min<uint32_t>(desc->max_threads, uint32_t(a.maxThreadsPerBlock));
  registers_ = a.numRegs;
}

uint32_t CudaPipeline::resident_threadgroups_per_unit(uint32_t threads, size_t threadgroup_memory) const {
  std::lock_guard<std::mutex> lock(occupancy_mutex_);
  const auto key = std::make_pair(threads, threadgroup_memory);
  if (auto it = occupancy_.find(key); it != occupancy_.end()) return it->second;
  int blocks = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, desc_->fn, int(threads), threadgroup_memory),
        ("cudaOccupancyMaxActiveBlocksPerMultiprocessor(" + name_ + ")").c_str());
  return occupancy_[key] = uint32_t(std::max(blocks, 0));
}

namespace {

class CudaDevice final : public Device {
 public:
  CudaDevice(int ordinal, const cudaDeviceProp& prop)
      : ordinal_(ordinal),
        name_(prop.name),
        props_{uint32_t(prop.multiProcessorCount), uint32_t(prop.maxThreadsPerMultiProcessor),
               size_t(prop.sharedMemPerMultiprocessor), size_t(prop.totalGlobalMem)},
        sink_(std::make_shared<CounterSink>()) {
    // SIMT lanes (device.h): the GPU shapes, gemv widths chosen by the wave.
    props_.gemv_tokens = mkv_params::kGemvTokensGpu;
    // mma.sync's bfloat16 shapes (the prelude's products) need sm_80.
    props_.matrix_units = prop.major >= 8;
    props_.matrix_layout = "mma";
    // gemm_decode_rows stays 0 until measured: the gemv at 4 tokens a
    // threadgroup against the gemm on tensor cores (docs/BATCHING.md).
  }
  std::string kind() const override { return "cuda"; }
  std::string name() const override { return name_; }
  DeviceProperties properties() const override { return props_; }
  BufferPtr new_buffer(size_t length) override {
    select();
    return metered(std::make_shared<CudaBuffer>(length));
  }
  PipelinePtr pipeline(const std::string& name) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = pipelines_.find(name); it != pipelines_.end()) return it->second;
    auto& kernels = mkv::cuda::registry();
    auto it = kernels.find(name);
    if (it == kernels.end()) {
      std::string known;
      for (const auto& [n, d] : kernels) known += (known.empty() ? "" : ", ") + n;
      fail("unknown kernel '" + name + "'; known kernels: " + known);
    }
    select();
    return pipelines_[name] = std::make_shared<CudaPipeline>(it->second);
  }
  std::vector<std::string> kernel_names() const override {
    std::vector<std::string> names;
    for (const auto& [n, d] : mkv::cuda::registry()) names.push_back(n);
    return names;
  }
  CommandQueuePtr new_command_queue() override {
    select();
    return make_command_queue(sink_);
  }
  Counters counters() const override { return sink_->totals(); }
  void reset_counters() override { sink_->reset(); }

 private:
  void select() const { check(cudaSetDevice(ordinal_), "cudaSetDevice"); }
  int ordinal_;
  std::string name_;
  DeviceProperties props_;
  std::shared_ptr<CounterSink> sink_;
  std::mutex mutex_;
  std::map<std::string, PipelinePtr> pipelines_;
};

}  // namespace
}  // namespace cuda

bool cuda_device_available(std::string* why) {
  // The answer cannot change while the process runs; ask CUDA once.
  static const std::pair<bool, std::string> answer = [] {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
      cudaGetLastError();  // not sticky, but leave nothing behind
      return std::pair<bool, std::string>{false, std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e)};
    }
    if (count == 0) return std::pair<bool, std::string>{false, "CUDA sees no GPU"};
    return std::pair<bool, std::string>{true, ""};
  }();
  if (why) *why = answer.second;
  return answer.first;
}

DevicePtr create_cuda_device() {
  std::string why;
  if (!cuda_device_available(&why)) throw GpuError("[cuda] no CUDA GPU is usable here (" + why + ")");
  cudaDeviceProp prop{};
  cuda::check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  return std::make_shared<cuda::CudaDevice>(0, prop);
}

}  // namespace mkv::gpu
