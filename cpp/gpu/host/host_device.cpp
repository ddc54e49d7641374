#include "host_device.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <variant>

#include <sys/mman.h>
#include <unistd.h>

#include "../command_rules.h"
#include "executor.h"
#include "metal/linear_params.h"
#include "registry.h"

namespace mkv::gpu {
namespace {

class HostBuffer final : public Buffer {
 public:
  explicit HostBuffer(size_t length) : length_(length) {
    const size_t rounded = (length + 63) / 64 * 64;
    if (rounded >= kMapped) {
      // Large buffers (a KV pool) from the kernel's zero pages: memory is taken as it is first written.
      void* p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      data_ = p == MAP_FAILED ? nullptr : p;
      mapped_ = data_ != nullptr;
    } else if (posix_memalign(&data_, 64, rounded ? rounded : 64) != 0) {  // not aligned_alloc: macOS < 10.15
      data_ = nullptr;
    }
    if (!data_) throw GpuError("[host] out of memory allocating " + std::to_string(length) + " bytes");
    if (!mapped_) std::memset(data_, 0, rounded);
  }
  ~HostBuffer() override {
    if (mapped_)
      munmap(data_, (length_ + 63) / 64 * 64);
    else
      std::free(data_);
  }
  void* contents() override { return data_; }
  size_t length() const override { return length_; }

 private:
  static constexpr size_t kMapped = size_t(1) << 20;
  void* data_ = nullptr;
  size_t length_;
  bool mapped_ = false;
};

class HostPipeline final : public Pipeline {
 public:
  explicit HostPipeline(const host::KernelDesc* desc) : desc_(desc), name_(desc->name) {}
  const std::string& name() const override { return name_; }
  uint32_t max_total_threads_per_threadgroup() const override { return desc_->max_threads; }
  uint32_t thread_execution_width() const override { return host::kSimdWidth; }
  // A worker runs one threadgroup at a time, to completion.
  uint32_t resident_threadgroups_per_unit(uint32_t, size_t) const override { return 1; }
  const host::KernelDesc* desc() const { return desc_; }

 private:
  const host::KernelDesc* desc_;
  std::string name_;
};

struct DispatchCommand {
  host::Dispatch dispatch;
  std::vector<BufferPtr> keep_alive;
  PipelinePtr pipeline;
};
struct CopyCommand {
  BufferPtr src, dst;
  size_t src_offset, dst_offset, size;
};
struct FillCommand {
  BufferPtr buffer;
  size_t offset, size;
  uint8_t value;
};
using Command = std::variant<DispatchCommand, CopyCommand, FillCommand>;

class HostCommandBuffer;

class HostComputeEncoder final : public RecordingEncoder<ComputeEncoder, HostCommandBuffer, EncoderKind::compute> {
 public:
  using RecordingEncoder::RecordingEncoder;
  void begin() {
    pipeline_.reset();
    current_ = DispatchCommand{};
  }
  void set_pipeline(const PipelinePtr& pipeline) override;
  void set_buffer(const BufferPtr& buffer, size_t offset, uint32_t index) override;
  void set_bytes(const void* data, size_t length, uint32_t index) override;
  void set_threadgroup_memory_length(size_t length, uint32_t index) override;
  void dispatch_threadgroups(Size3 threadgroups, Size3 threads) override;

 private:
  PipelinePtr pipeline_;
  DispatchCommand current_;  // bindings persist across dispatches, as in Metal
};

class HostBlitEncoder final : public RecordingEncoder<BlitEncoder, HostCommandBuffer, EncoderKind::blit> {
 public:
  using RecordingEncoder::RecordingEncoder;
  void copy(const BufferPtr& src, size_t src_offset, const BufferPtr& dst, size_t dst_offset,
            size_t size) override;
  void fill(const BufferPtr& buffer, size_t offset, size_t size, uint8_t value) override;
};

class HostCommandBuffer final : public CommandBuffer {
 public:
  HostCommandBuffer(std::shared_ptr<CounterSink> sink, host::ExecutorOptions options)
      : state_(std::move(sink), ""), options_(options), compute_(*this, state_), blit_(*this, state_) {}

  ComputeEncoder& compute_encoder() override {
    state_.begin_encoder(EncoderKind::compute);
    compute_.begin();
    return compute_;
  }
  BlitEncoder& blit_encoder() override {
    state_.begin_encoder(EncoderKind::blit);
    return blit_;
  }

  void commit() override {
    state_.commit();
    const bool profile = state_.sink().profile();
    std::map<std::string, KernelTime> times;
    try {
      for (Command& c : commands_) {
        if (!profile) {
          run(c);
          continue;
        }
        const auto t0 = std::chrono::steady_clock::now();
        run(c);
        KernelTime& kt = times[command_name(c)];
        ++kt.calls;
        kt.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
    } catch (const GpuError& e) {
      error_ = e.what();
    }
    if (profile) state_.sink().add_times(times);
    commands_.clear();  // release buffers now that the work is done
    bytes_.clear();
  }

  void wait() override {
    state_.wait();
    if (!error_.empty()) throw GpuError(error_);
  }

  const Counters& counters() const override { return state_.counters(); }

  void record(Command c) { commands_.push_back(std::move(c)); }
  const void* keep_bytes(const void* data, size_t length) {
    bytes_.emplace_back(new unsigned char[(length + 15) / 16 * 16]());
    std::memcpy(bytes_.back().get(), data, length);
    return bytes_.back().get();
  }

 private:
  static std::string command_name(const Command& c) {
    if (auto* d = std::get_if<DispatchCommand>(&c)) return d->dispatch.kernel->name;
    return std::holds_alternative<CopyCommand>(c) ? "blit_copy" : "blit_fill";
  }
  void run(Command& c) {
    if (auto* d = std::get_if<DispatchCommand>(&c)) {
      host::execute(d->dispatch, options_);
    } else if (auto* cp = std::get_if<CopyCommand>(&c)) {
      std::memmove(static_cast<char*>(cp->dst->contents()) + cp->dst_offset,
                   static_cast<char*>(cp->src->contents()) + cp->src_offset, cp->size);
    } else if (auto* f = std::get_if<FillCommand>(&c)) {
      std::memset(static_cast<char*>(f->buffer->contents()) + f->offset, f->value, f->size);
    }
  }

  CommandBufferState state_;  // before the encoders, which use it
  host::ExecutorOptions options_;
  HostComputeEncoder compute_;
  HostBlitEncoder blit_;
  std::vector<Command> commands_;
  std::deque<std::unique_ptr<unsigned char[]>> bytes_;  // set_bytes copies
  std::string error_;
};

void HostComputeEncoder::set_pipeline(const PipelinePtr& pipeline) {
  check_open();
  state_.check_set_pipeline(pipeline);
  pipeline_ = pipeline;
  current_.pipeline = pipeline;
  current_.dispatch.kernel = static_cast<const HostPipeline&>(*pipeline).desc();
}

void HostComputeEncoder::set_buffer(const BufferPtr& buffer, size_t offset, uint32_t index) {
  check_open();
  state_.check_index(index, host::kMaxBufferBindings, "buffer");
  state_.check_set_buffer(buffer, offset);
  current_.dispatch.buffers[index] = static_cast<char*>(buffer->contents()) + offset;
  current_.dispatch.buffer_bytes[index] = buffer->length() - offset;
  current_.dispatch.buffer_bound[index] = true;
  current_.keep_alive.push_back(buffer);
}

void HostComputeEncoder::set_bytes(const void* data, size_t length, uint32_t index) {
  check_open();
  state_.check_index(index, host::kMaxBufferBindings, "buffer");
  state_.check_set_bytes(length);
  current_.dispatch.buffers[index] = const_cast<void*>(cb_.keep_bytes(data, length));
  current_.dispatch.buffer_bytes[index] = length;
  current_.dispatch.buffer_bound[index] = true;
}

void HostComputeEncoder::set_threadgroup_memory_length(size_t length, uint32_t index) {
  check_open();
  state_.check_index(index, host::kMaxThreadgroupBindings, "threadgroup memory");
  current_.dispatch.threadgroup_bytes[index] = (length + 15) / 16 * 16;
}

void HostComputeEncoder::dispatch_threadgroups(Size3 threadgroups, Size3 threads) {
  check_open();
  state_.check_dispatch(pipeline_ != nullptr);
  current_.dispatch.threadgroups = threadgroups;
  current_.dispatch.threads_per_threadgroup = threads;
  host::validate(current_.dispatch);
  cb_.record(current_);
  ++state_.counters().dispatches;
}

void HostBlitEncoder::copy(const BufferPtr& src, size_t src_offset, const BufferPtr& dst,
                           size_t dst_offset, size_t size) {
  check_open();
  state_.check_blit_range("copy source", src, src_offset, size);
  state_.check_blit_range("copy destination", dst, dst_offset, size);
  state_.check_copy_alignment(src_offset, dst_offset, size);
  cb_.record(CopyCommand{src, dst, src_offset, dst_offset, size});
  state_.counters().blit_bytes_copied += size;
}

void HostBlitEncoder::fill(const BufferPtr& buffer, size_t offset, size_t size, uint8_t value) {
  check_open();
  state_.check_blit_range("fill", buffer, offset, size);
  cb_.record(FillCommand{buffer, offset, size, value});
}

class HostCommandQueue final : public CommandQueue {
 public:
  HostCommandQueue(std::shared_ptr<CounterSink> sink, host::ExecutorOptions options)
      : sink_(std::move(sink)), options_(options) {}
  CommandBufferPtr command_buffer() override {
    return std::make_shared<HostCommandBuffer>(sink_, options_);
  }

 private:
  std::shared_ptr<CounterSink> sink_;
  host::ExecutorOptions options_;
};

class HostDevice final : public Device {
 public:
  HostDevice(host::ExecutorOptions options, bool profile)
      : options_(options), sink_(std::make_shared<CounterSink>(profile)) {}
  std::string kind() const override { return "host"; }
  std::string name() const override {
    return "host executor (" + std::to_string(host::executor_threads()) + " threads, fiber order " +
           host::fiber_order_name(options_.order) + ")";
  }
  // One unit per executor thread, each running one threadgroup (up to the
  // 1024 threads a threadgroup may have) with Metal's 32 KiB of threadgroup memory.
  // Lanes are fibers (device.h): the shapes with the fewest collectives, which
  // this build also compiles (MKV_HOST_SHAPES).
  DeviceProperties properties() const override {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    DeviceProperties p{uint32_t(host::executor_threads()), 1024, 32768,
                       pages > 0 && page > 0 ? size_t(pages) * size_t(page) : 0};
    p.lanes_are_fibers = true;
    p.has_host_shapes = true;
    p.gemv_rows = mkv_params::kGemvRowsWide;
    p.gemv_tokens = mkv_params::kGemvTokensHost;
    p.gemm_decode_rows = mkv_params::kGemmDecodeRowsHost;
    return p;
  }
  BufferPtr new_buffer(size_t length) override {
    if (length == 0) throw GpuError("[host] buffer length must be at least 1 byte");
    return metered(std::make_shared<HostBuffer>(length));
  }
  PipelinePtr pipeline(const std::string& name) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = pipelines_.find(name);
    if (it != pipelines_.end()) return it->second;
    const host::KernelDesc* desc = host::find_kernel(name);
    if (!desc) {
      std::string known;
      for (const auto& n : host::kernel_names()) known += (known.empty() ? "" : ", ") + n;
      throw GpuError("[host] unknown kernel '" + name + "'; known kernels: " + known);
    }
    return pipelines_[name] = std::make_shared<HostPipeline>(desc);
  }
  std::vector<std::string> kernel_names() const override { return host::kernel_names(); }
  CommandQueuePtr new_command_queue() override {
    return std::make_shared<HostCommandQueue>(sink_, options_);
  }
  Counters counters() const override { return sink_->totals(); }
  void reset_counters() override { sink_->reset(); }
  std::map<std::string, KernelTime> kernel_times() const override { return sink_->times(); }

 private:
  host::ExecutorOptions options_;
  std::shared_ptr<CounterSink> sink_;
  std::mutex mutex_;
  std::map<std::string, PipelinePtr> pipelines_;
};

}  // namespace

DevicePtr create_host_device(const DeviceOptions& options) {
  host::ExecutorOptions exec;
  std::string order = options.fiber_order;
  if (order.empty()) {
    const char* env = std::getenv("METALKV_FIBER_ORDER");
    order = env && *env ? env : "forward";
  }
  exec.order = host::parse_fiber_order(order);
  exec.seed = options.seed;
#if defined(__SANITIZE_ADDRESS__)
  exec.stack_bytes = 256 * 1024;  // instrumented frames are several times larger
#endif
  const char* profile = std::getenv("METALKV_PROFILE");
  const bool env_profile = profile && *profile && std::strcmp(profile, "0") != 0;
  return std::make_shared<HostDevice>(exec, options.profile || env_profile);
}

}  // namespace mkv::gpu
