// Internal classes of the Metal backend. Only files in cpp/gpu/metal include
// this; everything else sees the interface in cpp/gpu/device.h.
//
// Ownership: every Objective-C object we keep is held in an NS::SharedPtr.
// Objects from new*/alloc/Create/Copy calls arrive with +1 and are adopted with
// NS::TransferPtr; objects from other getters are autoreleased and are kept
// with NS::RetainPtr. Entry points that can create autoreleased objects open an
// AutoreleaseScope, because C++ threads have no pool of their own.
#pragma once

#include <Foundation/Foundation.hpp>
#include <Metal/Metal.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "../device.h"

namespace mkv::gpu::metal {

class AutoreleaseScope {
 public:
  AutoreleaseScope() : pool_(NS::AutoreleasePool::alloc()->init()) {}
  ~AutoreleaseScope() { pool_->release(); }  // release drains the pool
  AutoreleaseScope(const AutoreleaseScope&) = delete;
  AutoreleaseScope& operator=(const AutoreleaseScope&) = delete;

 private:
  NS::AutoreleasePool* pool_;
};

std::string to_std_string(const NS::String* s);  // "" for nil
std::string describe(const NS::Error* error);    // localizedDescription

// Device-wide totals. Shared (not borrowed) by command buffers because a
// command buffer may outlive the Device object that created it.
class CounterTotals {
 public:
  void add(const Counters& delta);
  Counters snapshot() const;
  void reset();

 private:
  mutable std::mutex mu_;
  Counters totals_;
};

class MetalBuffer final : public Buffer {
 public:
  MetalBuffer(NS::SharedPtr<MTL::Buffer> buffer, size_t length);
  void* contents() override { return contents_; }
  size_t length() const override { return length_; }
  MTL::Buffer* mtl() const { return buffer_.get(); }

 private:
  NS::SharedPtr<MTL::Buffer> buffer_;
  void* contents_;  // stable for shared storage, so fetched once
  size_t length_;
};

class MetalPipeline final : public Pipeline {
 public:
  MetalPipeline(std::string name, NS::SharedPtr<MTL::ComputePipelineState> state);
  const std::string& name() const override { return name_; }
  uint32_t max_total_threads_per_threadgroup() const override { return max_threads_; }
  uint32_t thread_execution_width() const override { return simd_width_; }
  // Apple reports no occupancy: the threads a core holds (kAppleThreadsPerCore,
  // or fewer when this kernel's registers cap a threadgroup lower) over the
  // threadgroup's, and the core's threadgroup memory over the threadgroup's.
  uint32_t resident_threadgroups_per_unit(uint32_t threads, size_t threadgroup_memory) const override;
  MTL::ComputePipelineState* mtl() const { return state_.get(); }

 private:
  std::string name_;
  NS::SharedPtr<MTL::ComputePipelineState> state_;
  uint32_t max_threads_;
  uint32_t simd_width_;
};

class MetalCommandBuffer;

// Encoders are owned by their command buffer and reused: begin() attaches a
// fresh MTL encoder, end_encoding() detaches it.
class MetalComputeEncoder final : public ComputeEncoder {
 public:
  explicit MetalComputeEncoder(MetalCommandBuffer& owner) : owner_(owner) {}
  void begin(NS::SharedPtr<MTL::ComputeCommandEncoder> encoder);
  bool is_open() const { return bool(encoder_); }

  void set_pipeline(const PipelinePtr& pipeline) override;
  void set_buffer(const BufferPtr& buffer, size_t offset, uint32_t index) override;
  void set_bytes(const void* data, size_t length, uint32_t index) override;
  void set_threadgroup_memory_length(size_t length, uint32_t index) override;
  void dispatch_threadgroups(Size3 threadgroups, Size3 threads_per_threadgroup) override;
  void end_encoding() override;

 private:
  MTL::ComputeCommandEncoder* active(const char* call) const;  // throws once ended

  MetalCommandBuffer& owner_;
  NS::SharedPtr<MTL::ComputeCommandEncoder> encoder_;
  const MetalPipeline* pipeline_ = nullptr;  // kept alive by owner_
};

class MetalBlitEncoder final : public BlitEncoder {
 public:
  explicit MetalBlitEncoder(MetalCommandBuffer& owner) : owner_(owner) {}
  void begin(NS::SharedPtr<MTL::BlitCommandEncoder> encoder);
  bool is_open() const { return bool(encoder_); }

  void copy(const BufferPtr& src, size_t src_offset, const BufferPtr& dst, size_t dst_offset,
            size_t size) override;
  void fill(const BufferPtr& buffer, size_t offset, size_t size, uint8_t value) override;
  void end_encoding() override;

 private:
  MTL::BlitCommandEncoder* active(const char* call) const;  // throws once ended

  MetalCommandBuffer& owner_;
  NS::SharedPtr<MTL::BlitCommandEncoder> encoder_;
};

class MetalCommandBuffer final : public CommandBuffer {
 public:
  MetalCommandBuffer(NS::SharedPtr<MTL::CommandBuffer> command_buffer,
                     std::shared_ptr<CounterTotals> totals, size_t max_threadgroup_memory);
  ~MetalCommandBuffer() override;

  ComputeEncoder& compute_encoder() override;
  BlitEncoder& blit_encoder() override;
  void commit() override;
  void wait() override;
  const Counters& counters() const override { return counters_; }

  // Used by the encoders.
  void count(uint64_t Counters::*field, uint64_t n = 1);
  const MetalBuffer& bind(const BufferPtr& buffer, const char* call);
  const MetalPipeline& bind(const PipelinePtr& pipeline);
  size_t max_threadgroup_memory() const { return max_threadgroup_memory_; }

 private:
  enum class State { kEncoding, kCommitted, kCompleted };
  void require_no_open_encoder(const char* call) const;

  NS::SharedPtr<MTL::CommandBuffer> command_buffer_;
  std::shared_ptr<CounterTotals> totals_;
  size_t max_threadgroup_memory_;
  State state_ = State::kEncoding;
  Counters counters_;
  MetalComputeEncoder compute_{*this};
  MetalBlitEncoder blit_{*this};
  // Keep our wrappers alive until completion, as device.h promises. (Metal's
  // retained-reference command buffers also retain the MTL objects themselves.)
  std::vector<BufferPtr> bound_buffers_;
  std::vector<PipelinePtr> bound_pipelines_;
};

class MetalCommandQueue final : public CommandQueue {
 public:
  MetalCommandQueue(NS::SharedPtr<MTL::CommandQueue> queue,
                    std::shared_ptr<CounterTotals> totals, size_t max_threadgroup_memory);
  CommandBufferPtr command_buffer() override;

 private:
  NS::SharedPtr<MTL::CommandQueue> queue_;
  std::shared_ptr<CounterTotals> totals_;
  size_t max_threadgroup_memory_;
};

class MetalDevice final : public Device {
 public:
  explicit MetalDevice(NS::SharedPtr<MTL::Device> device);

  std::string kind() const override { return "metal"; }
  std::string name() const override { return name_; }
  // Cores from the chip's name (apple_gpu.h: Metal does not report them),
  // kAppleThreadsPerCore, and maxThreadgroupMemoryLength per core.
  DeviceProperties properties() const override;
  BufferPtr new_buffer(size_t length) override;
  PipelinePtr pipeline(const std::string& kernel_name) override;     // metal_library.cpp
  std::vector<std::string> kernel_names() const override;            // metal_library.cpp
  CommandQueuePtr new_command_queue() override;
  Counters counters() const override { return totals_->snapshot(); }
  void reset_counters() override { totals_->reset(); }

  // Compiles every embedded source now (create_metal_device calls it) and
  // raises GpuError quoting Apple's compiler if a kernel source the engine uses
  // failed, so that device="auto" can fall back to the host. Test-only sources
  // (metal/test/) that fail cost only their own kernels, as before.
  void compile_kernels() const;  // metal_library.cpp

 private:
  // Compiles every embedded source once; mu_ must be held.
  void load_libraries_locked() const;
  std::vector<std::string> kernel_names_locked() const;
  [[noreturn]] void throw_not_found_locked(const std::string& kernel_name) const;

  // Sources Apple's compiler rejected. compile_kernels() raises for the
  // engine's; a test-only source (metal/test/) costs only its own kernels.
  struct FailedSource {
    std::string path;
    std::string message;  // the compiler's
    std::string_view source;
  };

  NS::SharedPtr<MTL::Device> device_;
  std::string name_;
  size_t max_threadgroup_memory_;
  std::shared_ptr<CounterTotals> totals_ = std::make_shared<CounterTotals>();

  mutable std::mutex mu_;  // guards libraries_ and pipelines_
  mutable std::vector<NS::SharedPtr<MTL::Library>> libraries_;
  mutable std::vector<FailedSource> failed_sources_;
  mutable bool libraries_loaded_ = false;
  std::map<std::string, PipelinePtr> pipelines_;
};

}  // namespace mkv::gpu::metal
