// The contract between the kernels cuda_pass.py generates from metal/*.metal
// and the CUDA device (cuda_device.cpp), which launches them.
//
// For each MSL kernel (or [[host_name]] instantiation) the pass emits one
//   extern "C" __global__ void <thunk>(<params>)
// whose parameters are the kernel's non-builtin parameters, in their order:
//   device T* x [[buffer(n)]]           -> T* x               ParamSpec{buffer, n, sizeof(void*)}
//   constant T& p [[buffer(n)]]         -> T p (by value)     ParamSpec{bytes, n, sizeof(T)}
//                                          (Metal's setBytes; the device passes the bound bytes)
//   threadgroup T* t [[threadgroup(n)]] -> uint32_t t_offset  ParamSpec{threadgroup_memory, n, 4}
//                                          (byte offset into the one dynamic shared buffer,
//                                          which holds every [[threadgroup(n)]] area, 16-aligned)
// Builtins ([[thread_position_in_grid]], [[thread_index_in_simdgroup]], ...)
// are not parameters: the thunk computes them from threadIdx/blockIdx. The
// thunk calls the kernel (a __device__ function after the pass) and a static
// KernelRegistrar in the same translation unit registers its KernelDesc.
#pragma once

#include <cstdint>

namespace mkv::cuda {

constexpr int kMaxBufferBindings = 31;  // Metal's argument table size
constexpr int kMaxThreadgroupBindings = 31;
constexpr uint32_t kMaxThreadsPerThreadgroup = 1024;

struct ParamSpec {
  enum Kind : uint8_t { buffer, bytes, threadgroup_memory };
  Kind kind;
  uint8_t index;     // the [[buffer(n)]] / [[threadgroup(n)]] index
  uint32_t size;     // bytes of the thunk's parameter: 8 (pointer), sizeof(T) (by value), 4 (offset)
  const char* name;  // the MSL parameter's name, for error messages
};

struct KernelDesc {
  const char* name;         // host name, e.g. "attn_decode_f16_d128"
  const char* file;         // .metal path relative to the project root
  int line;
  const void* fn;           // the __global__ thunk, for cudaLaunchKernel / cudaFuncGetAttributes
  const ParamSpec* params;  // the thunk's parameters, in order
  uint32_t n_params;
  uint32_t max_threads;     // [[max_total_threads_per_threadgroup(n)]], else kMaxThreadsPerThreadgroup
};

struct KernelRegistrar {
  explicit KernelRegistrar(const KernelDesc* desc);  // defined by the device (cuda_registry.cpp)
};

}  // namespace mkv::cuda
