// Host executor: runs one compute dispatch of a kernel compiled from .metal on
// the CPU with GPU semantics.
//
// Threadgroups are spread over a thread pool (one worker per core, the calling
// thread included). Inside a threadgroup every GPU thread is a fiber; lanes
// 32k..32k+31 form SIMD-group k. Fibers run until they reach a barrier or SIMD
// collective (a rendezvous) or return, in the configured fiber order. The
// executor also validates: see the error catalogue in docs/HOST_EXECUTOR.md.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "../device.h"
#include "kernel_abi.h"

namespace mkv::host {

enum class FiberOrder : uint8_t { forward, reverse, random };
FiberOrder parse_fiber_order(const std::string& name);  // throws GpuError
const char* fiber_order_name(FiberOrder order);

struct ExecutorOptions {
  FiberOrder order = FiberOrder::forward;
  uint64_t seed = 0;             // for FiberOrder::random
  size_t stack_bytes = 64 * 1024;  // per fiber
};

// kMaxThreadsPerThreadgroup (1024): kernel_abi.h, which the generated thunks see
constexpr size_t kMaxThreadgroupMemory = 32 * 1024;

struct Dispatch {
  const KernelDesc* kernel = nullptr;
  std::array<void*, kMaxBufferBindings> buffers{};        // base + offset
  std::array<size_t, kMaxBufferBindings> buffer_bytes{};  // bytes from offset to end
  std::array<bool, kMaxBufferBindings> buffer_bound{};
  std::array<size_t, kMaxThreadgroupBindings> threadgroup_bytes{};  // 0 = unset
  gpu::Size3 threadgroups;
  gpu::Size3 threads_per_threadgroup;
};

// Checks threadgroup size, threadgroup memory and that every parameter of the
// kernel is bound; throws GpuError naming the kernel and the parameter.
void validate(const Dispatch& dispatch);

// Validates the bindings, runs every threadgroup, and throws GpuError naming
// the kernel, the .metal line, the threadgroup and the lanes on any error.
void execute(const Dispatch& dispatch, const ExecutorOptions& options);

// Number of OS threads that run threadgroups (METALKV_HOST_THREADS overrides).
int executor_threads();

}  // namespace mkv::host
