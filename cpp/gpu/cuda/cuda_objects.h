// The CUDA backend's classes (internal to cpp/gpu/cuda).
//
// Metal's model on a CUDA stream: a command queue is a stream; a command
// buffer records its launches, copies and fills while encoders are open and
// enqueues them all at commit() (as one CUDA graph when METALKV_CUDA_GRAPHS=1);
// wait() synchronizes the stream and turns a CUDA error into a GpuError.
// Buffers are device memory (cudaMalloc): contents() is nullptr, write/read
// copy synchronously.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "../command_rules.h"  // CounterSink, CommandBufferState
#include "../device.h"
#include "kernel_abi.h"

namespace mkv::gpu::cuda {

[[noreturn]] void fail(const std::string& message);  // GpuError("[cuda] ...")
void check(cudaError_t e, const char* what);          // fail() naming `what` and CUDA's message

class CudaBuffer final : public Buffer {
 public:
  explicit CudaBuffer(size_t length);
  ~CudaBuffer() override;
  void* contents() override { return nullptr; }  // not CPU-visible
  size_t length() const override { return length_; }
  void write(size_t offset, const void* src, size_t bytes) override;
  void read(size_t offset, void* dst, size_t bytes) const override;
  char* device_ptr() const { return static_cast<char*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  size_t length_;
};

class CudaPipeline final : public Pipeline {
 public:
  explicit CudaPipeline(const mkv::cuda::KernelDesc* desc);
  const std::string& name() const override { return name_; }
  uint32_t max_total_threads_per_threadgroup() const override { return max_threads_; }
  uint32_t thread_execution_width() const override { return 32; }
  // cudaOccupancyMaxActiveBlocksPerMultiprocessor: registers, shared memory, threads;
  // asked once per (threads, memory), since ops ask per dispatch.
  uint32_t resident_threadgroups_per_unit(uint32_t threads, size_t threadgroup_memory) const override;
  const mkv::cuda::KernelDesc* desc() const { return desc_; }
  int registers() const { return registers_; }

 private:
  const mkv::cuda::KernelDesc* desc_;
  std::string name_;
  uint32_t max_threads_;  // the kernel's declared limit and what its registers allow
  int registers_;
  mutable std::mutex occupancy_mutex_;
  mutable std::map<std::pair<uint32_t, size_t>, uint32_t> occupancy_;
};

// One recorded launch: its argument values, stored so that the pointers
// cudaLaunchKernel takes stay valid until commit().
struct Launch {
  const mkv::cuda::KernelDesc* desc;
  dim3 grid, block;
  uint32_t dynamic_smem;
  std::vector<std::vector<unsigned char>> values;  // one per thunk parameter
};
struct Copy {
  BufferPtr src, dst;
  size_t src_offset, dst_offset, size;
};
struct Fill {
  BufferPtr buffer;
  size_t offset, size;
  uint8_t value;
};
using Command = std::variant<Launch, Copy, Fill>;

}  // namespace mkv::gpu::cuda
