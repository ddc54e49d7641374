// Device layer: a small interface in Metal's own terms.
//
// Everything above cpp/gpu (ops, kv, model, engine, bindings) talks to the GPU
// only through these classes. Three implementations exist:
//   host  (cpp/gpu/host)  runs metal/*.metal on the CPU with GPU semantics;
//   metal (cpp/gpu/metal) drives a real Apple GPU through metal-cpp;
//   cuda  (cpp/gpu/cuda)  runs the same kernels on NVIDIA GPUs (built where nvcc is).
//
// Lifetime: objects are handed out as shared_ptr; a command buffer keeps the
// buffers and pipelines bound to it alive until it has completed.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "errors.h"  // GpuError, ArgumentError

namespace mkv::gpu {

struct Size3 {
  uint32_t x = 1, y = 1, z = 1;
  uint64_t volume() const { return uint64_t(x) * y * z; }
};

// Device memory. On the host executor and on Apple Silicon the CPU sees the
// same bytes as the GPU (contents() is that memory, zero-copy); on a discrete
// GPU (cuda) it does not, and contents() is nullptr. write/read work on every
// device: call them when no committed, unfinished work uses those bytes (after
// wait()); they are synchronous.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* contents() = 0;  // CPU-visible bytes, or nullptr
  virtual size_t length() const = 0;
  // Raise GpuError("[buffer] ...") for a range outside the buffer.
  virtual void write(size_t offset, const void* src, size_t bytes);
  virtual void read(size_t offset, void* dst, size_t bytes) const;
  bool host_visible() { return contents() != nullptr; }

 protected:
  void check_range(const char* what, size_t offset, size_t bytes) const;
};
using BufferPtr = std::shared_ptr<Buffer>;

// What launch sizes depend on, as each device reports it; cpp/ops/launch.h
// turns it into grid choices (the one place that does).
struct DeviceProperties {
  uint32_t compute_units = 1;          // CUDA: SMs; Metal: GPU cores; host: executor threads
  uint32_t max_threads_per_unit = 1;   // threads one unit keeps resident at once
  size_t threadgroup_memory_per_unit = 0;  // bytes of threadgroup memory one unit holds
  // Memory the device's buffers may take, what default budgets (the engine's KV
  // pool) are a share of: CUDA: the GPU's global memory; Metal: the working set
  // the system recommends; host: physical RAM.
  size_t memory_bytes = 0;

  // How the device runs a kernel, where that changes which kernel shape an op
  // picks. Ops read these traits, never the device's kind(), so a new device
  // states its answers here and the ops follow (docs/ARCHITECTURE.md, "Ops").
  //
  // A SIMD-group's lanes run as fibers taking turns on one CPU thread (the host
  // executor): every simd_* collective and threadgroup barrier is a rendezvous
  // that switches through all the lanes, while registers cost nothing. Ops then
  // pick the shapes with the fewest collectives: one SIMD-group a row for
  // rms_norm, a fixed few for argmax, the "_h" decode attention shape. GPUs
  // (false): a collective costs a few cycles and registers bound occupancy.
  bool lanes_are_fibers = false;
  // The device's kernel library also holds the shapes built for fiber lanes
  // only (MKV_HOST_SHAPES: the "_h" decode attention kernels, the 8-token
  // gemv): an op may run them when asked. GPU compilers never see them (they
  // would not fit GPU registers and cost nvcc minutes).
  bool has_host_shapes = false;
  // gemv rows per SIMD-group when the device has one best width: 32 on the host
  // executor (a row a lane, no collective: kGemvRowsWide); 0 (GPUs): ops pick 1,
  // 2 or 4 to fill one wave of the device (ops/linear.h gemv_rows).
  uint32_t gemv_rows = 0;
  // Tokens per threadgroup of the gemv over several tokens: kGemvTokensGpu (4,
  // every token's activations and sums in registers) on GPUs, kGemvTokensHost
  // (8) on the host executor (metal/linear_params.h, ops/linear.h gemv_tokens).
  uint32_t gemv_tokens = 1;
  // simdgroup_matrix runs on matrix units (Apple GPUs from the Apple7 family,
  // M1 and A14; NVIDIA GPUs from sm_80, as mma.sync): the prefill gemm and
  // prefill attention take their mma shapes (metal/gemm_mma.h,
  // attention_prefill_mma.h). On the host the matrices are emulated: the ops
  // keep their SIMD shapes and tests run the mma ones.
  bool matrix_units = false;
  // Which lanes hold which elements of a simdgroup_matrix (metal/fragment.h):
  // "apple" (Apple GPUs and the host executor) or "mma" (the CUDA device:
  // mma.sync's accumulator layout).
  const char* matrix_layout = "apple";
  // Decoding sequences from which a step's projections run faster as one gemm
  // than as the several-token gemv, measured per device (docs/BATCHING.md
  // "Decode rows in the gemm"); taken only by an engine that gives up batch
  // invariance (EngineOptions::batch_invariant). 0: never (the gemm does not
  // win at any count on this device).
  uint32_t gemm_decode_rows = 0;
};

class Pipeline {
 public:
  virtual ~Pipeline() = default;
  virtual const std::string& name() const = 0;
  virtual uint32_t max_total_threads_per_threadgroup() const = 0;
  virtual uint32_t thread_execution_width() const = 0;  // SIMD-group width: 32
  // Threadgroups of `threads` threads using `threadgroup_memory` bytes that one
  // compute unit runs at once, given this kernel's registers (>= 1 when the
  // launch is possible at all).
  virtual uint32_t resident_threadgroups_per_unit(uint32_t threads, size_t threadgroup_memory) const = 0;
};
using PipelinePtr = std::shared_ptr<Pipeline>;

class ComputeEncoder {
 public:
  virtual ~ComputeEncoder() = default;
  virtual void set_pipeline(const PipelinePtr& pipeline) = 0;
  virtual void set_buffer(const BufferPtr& buffer, size_t offset, uint32_t index) = 0;
  // Copies `length` bytes now (like setBytes); at most 4 KiB.
  virtual void set_bytes(const void* data, size_t length, uint32_t index) = 0;
  virtual void set_threadgroup_memory_length(size_t length, uint32_t index) = 0;
  virtual void dispatch_threadgroups(Size3 threadgroups, Size3 threads_per_threadgroup) = 0;
  virtual void end_encoding() = 0;
};

class BlitEncoder {
 public:
  virtual ~BlitEncoder() = default;
  virtual void copy(const BufferPtr& src, size_t src_offset, const BufferPtr& dst,
                    size_t dst_offset, size_t size) = 0;
  virtual void fill(const BufferPtr& buffer, size_t offset, size_t size, uint8_t value) = 0;
  virtual void end_encoding() = 0;
};

// Work counted per command buffer; the device keeps running totals.
struct Counters {
  uint64_t dispatches = 0;
  uint64_t compute_encoders = 0;
  uint64_t blit_encoders = 0;
  uint64_t command_buffers_committed = 0;
  uint64_t waits = 0;
  uint64_t blit_bytes_copied = 0;

  Counters& operator+=(const Counters& o);
  std::map<std::string, uint64_t> as_map() const;
};

// Time spent running one kernel (host executor with profiling on).
struct KernelTime {
  uint64_t calls = 0;
  double seconds = 0;  // wall time of its dispatches, all threadgroups
};

class CommandBuffer {
 public:
  virtual ~CommandBuffer() = default;
  // Only one encoder may be open at a time; the returned encoder is valid until
  // end_encoding().
  virtual ComputeEncoder& compute_encoder() = 0;
  virtual BlitEncoder& blit_encoder() = 0;
  virtual void commit() = 0;
  // Blocks until the work has completed. Raises GpuError if it failed.
  virtual void wait() = 0;
  virtual const Counters& counters() const = 0;
};
using CommandBufferPtr = std::shared_ptr<CommandBuffer>;

class CommandQueue {
 public:
  virtual ~CommandQueue() = default;
  virtual CommandBufferPtr command_buffer() = 0;
};
using CommandQueuePtr = std::shared_ptr<CommandQueue>;

// The device memory a Device's buffers hold: live, every buffer not yet freed,
// and the most live at once since the device was made or reset_memory_peak().
struct MemoryUse {
  size_t live = 0;
  size_t peak = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string kind() const = 0;  // "host", "metal" or "cuda"
  virtual std::string name() const = 0;  // human-readable
  virtual DeviceProperties properties() const = 0;
  virtual BufferPtr new_buffer(size_t length) = 0;  // zero-filled
  // Raises GpuError naming the kernel if it does not exist.
  virtual PipelinePtr pipeline(const std::string& kernel_name) = 0;
  virtual std::vector<std::string> kernel_names() const = 0;
  virtual CommandQueuePtr new_command_queue() = 0;
  virtual Counters counters() const = 0;  // totals since creation / reset
  virtual void reset_counters() = 0;      // also clears kernel_times()
  // Per kernel name (blits as "blit_copy" / "blit_fill"): calls and seconds
  // since creation / reset. Empty unless the device profiles (host executor
  // with DeviceOptions::profile or $METALKV_PROFILE=1).
  virtual std::map<std::string, KernelTime> kernel_times() const { return {}; }
  MemoryUse memory_use() const { return {meter_->live.load(), meter_->peak.load()}; }
  void reset_memory_peak() { meter_->peak = meter_->live.load(); }

 protected:
  // Each backend's new_buffer returns its buffer through this: counted live until freed.
  BufferPtr metered(BufferPtr buffer) {
    const size_t bytes = buffer->length();
    const size_t live = meter_->live += bytes;
    size_t p = meter_->peak.load();
    while (live > p && !meter_->peak.compare_exchange_weak(p, live)) {
    }
    Buffer* at = buffer.get();
    return BufferPtr(at, [buffer = std::move(buffer), meter = meter_, bytes](Buffer*) mutable {
      buffer.reset();
      meter->live -= bytes;
    });
  }

 private:
  struct Meter {
    std::atomic<size_t> live{0}, peak{0};
  };
  std::shared_ptr<Meter> meter_ = std::make_shared<Meter>();  // buffers may outlive their device: they share it
};
using DevicePtr = std::shared_ptr<Device>;

struct DeviceOptions {
  // Host executor only: order in which the fibers of a threadgroup run —
  // "forward", "reverse" or "random" (seeded). Empty: $METALKV_FIBER_ORDER,
  // else "forward". Tests run kernels in several orders to expose races.
  std::string fiber_order;
  uint64_t seed = 0;
  // Host executor only: time every dispatch by kernel (kernel_times()).
  // Also on when $METALKV_PROFILE=1. Costs two clock reads per dispatch.
  bool profile = false;
};

// "auto" (metal where available and its kernels compile, else host), "host"
// or "metal" (raises when it cannot be had). device_select.h has the rules.
DevicePtr create_device(const std::string& kind = "auto", const DeviceOptions& options = {});
struct DeviceChoice;
// The same, telling also why "auto" fell back to the host (DeviceChoice::fallback).
DeviceChoice choose_device(const std::string& kind, const DeviceOptions& options);
// Kinds that can be created on this machine, best first.
std::vector<std::string> available_device_kinds();
// The GPU backends compiled into this build ({"metal": bool, "cuda": bool}).
std::map<std::string, bool> built_backends();

}  // namespace mkv::gpu
