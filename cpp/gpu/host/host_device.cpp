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

#include "executor.h"
#include "metal/linear_params.h"
#include "registry.h"

namespace mkv::gpu {
namespace {

constexpr size_t kMaxSetBytes = 4096;  // Metal's setBytes limit

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

// Shared by a device and its command buffers, so a command buffer may outlive
// the Python object of its device.
struct CounterSink {
  explicit CounterSink(bool profile) : profile(profile) {}
  const bool profile;  // time each command by kernel name
  std::mutex mutex;
  Counters totals;
  std::map<std::string, KernelTime> times;
  void add(const Counters& c) {
    std::lock_guard<std::mutex> lock(mutex);
    totals += c;
  }
  void add_times(const std::map<std::string, KernelTime>& t) {
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& [name, kt] : t) {
      times[name].calls += kt.calls;
      times[name].seconds += kt.seconds;
    }
  }
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

void check_range(const char* what, const BufferPtr& b, size_t offset, size_t size) {
  if (!b) throw GpuError(std::string("[blit] ") + what + ": buffer is null");
  if (offset > b->length() || size > b->length() - offset)
    throw GpuError(std::string("[blit] ") + what + ": range [" + std::to_string(offset) + ", " +
                   std::to_string(offset + size) + ") is outside the " +
                   std::to_string(b->length()) + "-byte buffer");
}

class HostCommandBuffer;

class HostComputeEncoder final : public ComputeEncoder {
 public:
  explicit HostComputeEncoder(HostCommandBuffer& cb) : cb_(cb) {}
  void begin() {
    open_ = true;
    pipeline_.reset();
    current_ = DispatchCommand{};
  }
  bool open() const { return open_; }
  void set_pipeline(const PipelinePtr& pipeline) override;
  void set_buffer(const BufferPtr& buffer, size_t offset, uint32_t index) override;
  void set_bytes(const void* data, size_t length, uint32_t index) override;
  void set_threadgroup_memory_length(size_t length, uint32_t index) override;
  void dispatch_threadgroups(Size3 threadgroups, Size3 threads) override;
  void end_encoding() override {
    check_open();
    open_ = false;
  }

 private:
  void check_open() const {
    if (!open_) throw GpuError("[compute] the encoder has ended; ask the command buffer for a new one");
  }
  void check_index(uint32_t index, int limit, const char* what) const {
    if (int(index) >= limit)
      throw GpuError(std::string("[compute] ") + what + " index " + std::to_string(index) +
                     " is out of range; Metal allows 0.." + std::to_string(limit - 1));
  }
  HostCommandBuffer& cb_;
  bool open_ = false;
  PipelinePtr pipeline_;
  DispatchCommand current_;  // bindings persist across dispatches, as in Metal
};

class HostBlitEncoder final : public BlitEncoder {
 public:
  explicit HostBlitEncoder(HostCommandBuffer& cb) : cb_(cb) {}
  void begin() { open_ = true; }
  bool open() const { return open_; }
  void copy(const BufferPtr& src, size_t src_offset, const BufferPtr& dst, size_t dst_offset,
            size_t size) override;
  void fill(const BufferPtr& buffer, size_t offset, size_t size, uint8_t value) override;
  void end_encoding() override {
    check_open();
    open_ = false;
  }

 private:
  void check_open() const {
    if (!open_) throw GpuError("[blit] the encoder has ended; ask the command buffer for a new one");
  }
  HostCommandBuffer& cb_;
  bool open_ = false;
};

class HostCommandBuffer final : public CommandBuffer {
 public:
  HostCommandBuffer(std::shared_ptr<CounterSink> sink, host::ExecutorOptions options)
      : sink_(std::move(sink)), options_(options), compute_(*this), blit_(*this) {}

  ComputeEncoder& compute_encoder() override {
    begin_encoder();
    ++counters_.compute_encoders;
    compute_.begin();
    return compute_;
  }
  BlitEncoder& blit_encoder() override {
    begin_encoder();
    ++counters_.blit_encoders;
    blit_.begin();
    return blit_;
  }

  void commit() override {
    if (committed_) throw GpuError("[command buffer] commit() called twice");
    if (compute_.open() || blit_.open())
      throw GpuError("[command buffer] call end_encoding() on the open encoder before commit()");
    committed_ = true;
    counters_.command_buffers_committed = 1;
    sink_->add(counters_);
    std::map<std::string, KernelTime> times;
    try {
      for (Command& c : commands_) {
        if (!sink_->profile) {
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
    if (sink_->profile) sink_->add_times(times);
    commands_.clear();  // release buffers now that the work is done
    bytes_.clear();
  }

  void wait() override {
    if (!committed_) throw GpuError("[command buffer] wait() called before commit()");
    ++counters_.waits;
    Counters one;
    one.waits = 1;
    sink_->add(one);
    if (!error_.empty()) throw GpuError(error_);
  }

  const Counters& counters() const override { return counters_; }

  void record(Command c) { commands_.push_back(std::move(c)); }
  Counters& counters_mut() { return counters_; }
  const void* keep_bytes(const void* data, size_t length) {
    bytes_.emplace_back(new unsigned char[(length + 15) / 16 * 16]());
    std::memcpy(bytes_.back().get(), data, length);
    return bytes_.back().get();
  }

 private:
  void begin_encoder() {
    if (committed_) throw GpuError("[command buffer] already committed; create a new one");
    if (compute_.open() || blit_.open())
      throw GpuError("[command buffer] only one encoder may be open; call end_encoding() first");
  }
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

  std::shared_ptr<CounterSink> sink_;
  host::ExecutorOptions options_;
  HostComputeEncoder compute_;
  HostBlitEncoder blit_;
  std::vector<Command> commands_;
  std::deque<std::unique_ptr<unsigned char[]>> bytes_;  // set_bytes copies
  Counters counters_;
  bool committed_ = false;
  std::string error_;
};

void HostComputeEncoder::set_pipeline(const PipelinePtr& pipeline) {
  check_open();
  if (!pipeline) throw GpuError("[compute] set_pipeline: pipeline is null");
  pipeline_ = pipeline;
  current_.pipeline = pipeline;
  current_.dispatch.kernel = static_cast<const HostPipeline&>(*pipeline).desc();
}

void HostComputeEncoder::set_buffer(const BufferPtr& buffer, size_t offset, uint32_t index) {
  check_open();
  check_index(index, host::kMaxBufferBindings, "buffer");
  if (!buffer) throw GpuError("[compute] set_buffer: buffer is null");
  if (offset > buffer->length())
    throw GpuError("[compute] set_buffer: offset " + std::to_string(offset) + " is past the end of the " +
                   std::to_string(buffer->length()) + "-byte buffer");
  current_.dispatch.buffers[index] = static_cast<char*>(buffer->contents()) + offset;
  current_.dispatch.buffer_bytes[index] = buffer->length() - offset;
  current_.dispatch.buffer_bound[index] = true;
  current_.keep_alive.push_back(buffer);
}

void HostComputeEncoder::set_bytes(const void* data, size_t length, uint32_t index) {
  check_open();
  check_index(index, host::kMaxBufferBindings, "buffer");
  if (length > kMaxSetBytes)
    throw GpuError("[compute] set_bytes: " + std::to_string(length) +
                   " bytes; Metal allows at most 4096, use a buffer instead");
  current_.dispatch.buffers[index] = const_cast<void*>(cb_.keep_bytes(data, length));
  current_.dispatch.buffer_bytes[index] = length;
  current_.dispatch.buffer_bound[index] = true;
}

void HostComputeEncoder::set_threadgroup_memory_length(size_t length, uint32_t index) {
  check_open();
  check_index(index, host::kMaxThreadgroupBindings, "threadgroup memory");
  current_.dispatch.threadgroup_bytes[index] = (length + 15) / 16 * 16;
}

void HostComputeEncoder::dispatch_threadgroups(Size3 threadgroups, Size3 threads) {
  check_open();
  if (!pipeline_) throw GpuError("[compute] dispatch_threadgroups before set_pipeline");
  current_.dispatch.threadgroups = threadgroups;
  current_.dispatch.threads_per_threadgroup = threads;
  host::validate(current_.dispatch);
  cb_.record(current_);
  ++cb_.counters_mut().dispatches;
}

void HostBlitEncoder::copy(const BufferPtr& src, size_t src_offset, const BufferPtr& dst,
                           size_t dst_offset, size_t size) {
  check_open();
  check_range("copy source", src, src_offset, size);
  check_range("copy destination", dst, dst_offset, size);
  // macOS Metal requires this; checking here keeps host-only code honest.
  if (src_offset % 4 || dst_offset % 4 || size % 4)
    throw GpuError("[blit] copy offsets and size must be multiples of 4 bytes (got " +
                   std::to_string(src_offset) + ", " + std::to_string(dst_offset) + ", " +
                   std::to_string(size) + ")");
  cb_.record(CopyCommand{src, dst, src_offset, dst_offset, size});
  cb_.counters_mut().blit_bytes_copied += size;
}

void HostBlitEncoder::fill(const BufferPtr& buffer, size_t offset, size_t size, uint8_t value) {
  check_open();
  check_range("fill", buffer, offset, size);
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
    return p;
  }
  BufferPtr new_buffer(size_t length) override {
    if (length == 0) throw GpuError("[host] buffer length must be at least 1 byte");
    return std::make_shared<HostBuffer>(length);
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
  Counters counters() const override {
    std::lock_guard<std::mutex> lock(sink_->mutex);
    return sink_->totals;
  }
  void reset_counters() override {
    std::lock_guard<std::mutex> lock(sink_->mutex);
    sink_->totals = Counters{};
    sink_->times.clear();
  }
  std::map<std::string, KernelTime> kernel_times() const override {
    std::lock_guard<std::mutex> lock(sink_->mutex);
    return sink_->times;
  }

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
