// CUDA command queues, command buffers and encoders (see cuda_objects.h).
//
// A dispatch is checked and its arguments packed when it is encoded, like the
// host executor's (threads within the pipeline's limit, every parameter bound,
// constant structs at least sizeof the kernel's type, threadgroup memory within
// Metal's 32 KiB); commit() launches everything in order on the queue's stream.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "cuda_command.h"

namespace mkv::gpu::cuda {
namespace {

using mkv::cuda::KernelDesc;
using mkv::cuda::ParamSpec;

constexpr size_t kMaxThreadgroupMemory = 32768;  // Metal's, so kernels stay portable

// Command buffers run as CUDA graphs unless METALKV_CUDA_GRAPHS=0 (read when a
// queue is made): on an H200 the 8B decode step ran 4-5 % faster with them.
bool graphs_enabled() {
  const char* v = std::getenv("METALKV_CUDA_GRAPHS");
  return !v || !*v || std::strcmp(v, "0") != 0;
}

// Executable graphs kept for reuse. A decode step
// records the same launches every token with new argument values (positions,
// lengths), so the step's captured graph updates the executable of the last
// step in place (cudaGraphExecUpdate) instead of being instantiated anew; a few
// shapes (a prefill chunk, a decode step, sampling) are kept, most recent first.
class GraphCache {
 public:
  GraphCache() = default;
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;
  ~GraphCache() {
    for (cudaGraphExec_t e : execs_) cudaGraphExecDestroy(e);
  }
  // An executable that runs `graph` (which the caller still owns).
  cudaGraphExec_t exec_for(cudaGraph_t graph) {
    for (size_t i = 0; i < execs_.size(); ++i) {
      cudaGraphExecUpdateResultInfo info{};
      if (cudaGraphExecUpdate(execs_[i], graph, &info) == cudaSuccess) {
        std::rotate(execs_.begin(), execs_.begin() + i, execs_.begin() + i + 1);
        return execs_.front();
      }
      cudaGetLastError();  // a topology that does not match: not an error of the work
    }
    cudaGraphExec_t exec = nullptr;
    check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    if (execs_.size() == kKept) {
      cudaGraphExecDestroy(execs_.back());  // deferred by CUDA until its launches complete
      execs_.pop_back();
    }
    execs_.insert(execs_.begin(), exec);
    return exec;
  }

 private:
  static constexpr size_t kKept = 4;
  std::vector<cudaGraphExec_t> execs_;
};

// A stream, shared by its queue and every command buffer made from it: a command
// buffer may outlive the queue object (e.g. a temporary queue for one blit).
// Its graph cache is used by one command buffer at a time: commit() runs on the
// thread that encodes, and the stream orders the launches.
struct Stream {
  cudaStream_t stream = nullptr;
  GraphCache graphs;
  std::mutex commit_mutex;  // command buffers of one queue may commit from several threads
  Stream() { check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~Stream() { cudaStreamDestroy(stream); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
};

class CudaCommandBuffer;

class CudaComputeEncoder final : public RecordingEncoder<ComputeEncoder, CudaCommandBuffer, EncoderKind::compute> {
 public:
  using RecordingEncoder::RecordingEncoder;
  void begin() {
    pipeline_ = nullptr;
    for (Binding& b : bindings_) b = Binding{};
    for (size_t& t : tg_bytes_) t = 0;
  }
  void set_pipeline(const PipelinePtr& pipeline) override {
    check_open();
    state_.check_set_pipeline(pipeline);
    pipeline_ = &static_cast<const CudaPipeline&>(*pipeline);
  }
  void set_buffer(const BufferPtr& buffer, size_t offset, uint32_t index) override;
  void set_bytes(const void* data, size_t length, uint32_t index) override;
  void set_threadgroup_memory_length(size_t length, uint32_t index) override {
    check_open();
    state_.check_index(index, mkv::cuda::kMaxThreadgroupBindings, "threadgroup memory");
    tg_bytes_[index] = (length + 15) / 16 * 16;
  }
  void dispatch_threadgroups(Size3 threadgroups, Size3 threads) override;

 private:
  struct Binding {
    enum Kind { none, device_buffer, bytes } kind = none;
    BufferPtr buffer;  // kept alive by the command buffer once dispatched
    size_t offset = 0;
    std::vector<unsigned char> data;
  };
  [[noreturn]] void bad(const KernelDesc& k, const std::string& detail) const {
    fail("kernel '" + std::string(k.name) + "' (" + k.file + ":" + std::to_string(k.line) + "): " + detail);
  }

  const CudaPipeline* pipeline_ = nullptr;
  Binding bindings_[mkv::cuda::kMaxBufferBindings];
  size_t tg_bytes_[mkv::cuda::kMaxThreadgroupBindings] = {};
};

class CudaBlitEncoder final : public RecordingEncoder<BlitEncoder, CudaCommandBuffer, EncoderKind::blit> {
 public:
  using RecordingEncoder::RecordingEncoder;
  void copy(const BufferPtr& src, size_t src_offset, const BufferPtr& dst, size_t dst_offset, size_t size) override;
  void fill(const BufferPtr& buffer, size_t offset, size_t size, uint8_t value) override;
};

class CudaCommandBuffer final : public CommandBuffer {
 public:
  CudaCommandBuffer(std::shared_ptr<Stream> stream, std::shared_ptr<CounterSink> sink, bool graphs)
      : owner_(std::move(stream)), stream_(owner_->stream), state_(std::move(sink), "[cuda] "), graphs_(graphs),
        compute_(*this, state_), blit_(*this, state_) {}

  ComputeEncoder& compute_encoder() override {
    state_.begin_encoder(EncoderKind::compute);
    compute_.begin();
    return compute_;
  }
  BlitEncoder& blit_encoder() override {
    state_.begin_encoder(EncoderKind::blit);
    return blit_;
  }
  void commit() override;
  void wait() override;
  const Counters& counters() const override { return state_.counters(); }

  void record(Command c, std::vector<BufferPtr> keep) {
    commands_.push_back(std::move(c));
    for (BufferPtr& b : keep) keep_.push_back(std::move(b));
  }

 private:
  void enqueue();  // every command onto stream_

  std::shared_ptr<Stream> owner_;
  cudaStream_t stream_;
  CommandBufferState state_;  // before the encoders, which use it
  bool graphs_;
  CudaComputeEncoder compute_;
  CudaBlitEncoder blit_;
  std::vector<Command> commands_;
  std::vector<BufferPtr> keep_;  // bound buffers, until the work completes
  std::string error_;  // a failure at commit(), reported by wait()
};

void CudaComputeEncoder::set_buffer(const BufferPtr& buffer, size_t offset, uint32_t index) {
  check_open();
  state_.check_index(index, mkv::cuda::kMaxBufferBindings, "buffer");
  state_.check_set_buffer(buffer, offset);
  if (!dynamic_cast<const CudaBuffer*>(buffer.get())) fail("set_buffer: the buffer belongs to another device");
  bindings_[index] = Binding{Binding::device_buffer, buffer, offset, {}};
}

void CudaComputeEncoder::set_bytes(const void* data, size_t length, uint32_t index) {
  check_open();
  state_.check_index(index, mkv::cuda::kMaxBufferBindings, "buffer");
  state_.check_set_bytes(length);
  const auto* p = static_cast<const unsigned char*>(data);
  bindings_[index] = Binding{Binding::bytes, nullptr, 0, std::vector<unsigned char>(p, p + length)};
}

void CudaComputeEncoder::dispatch_threadgroups(Size3 threadgroups, Size3 threads) {
  check_open();
  state_.check_dispatch(pipeline_ != nullptr);
  const KernelDesc& k = *pipeline_->desc();
  const uint64_t n = threads.volume();
  if (n == 0 || n > pipeline_->max_total_threads_per_threadgroup())
    bad(k, "threads_per_threadgroup (" + std::to_string(threads.x) + "," + std::to_string(threads.y) + "," +
               std::to_string(threads.z) + ") = " + std::to_string(n) + " threads; this pipeline holds 1 to " +
               std::to_string(pipeline_->max_total_threads_per_threadgroup()));
  if (threadgroups.volume() == 0) bad(k, "an empty grid of threadgroups");
  Launch launch{&k, dim3(threadgroups.x, threadgroups.y, threadgroups.z), dim3(threads.x, threads.y, threads.z),
                0, {}};
  // Threadgroup areas are laid out in index order in one dynamic shared buffer.
  uint32_t tg_offset[mkv::cuda::kMaxThreadgroupBindings] = {};
  size_t smem = 0;
  for (int i = 0; i < mkv::cuda::kMaxThreadgroupBindings; ++i) {
    tg_offset[i] = uint32_t(smem);
    smem += tg_bytes_[i];
  }
  if (smem > kMaxThreadgroupMemory)
    bad(k, "threadgroup memory of " + std::to_string(smem) + " bytes exceeds the 32768-byte limit");
  launch.dynamic_smem = uint32_t(smem);
  std::vector<BufferPtr> keep;
  for (uint32_t p = 0; p < k.n_params; ++p) {
    const ParamSpec& s = k.params[p];
    std::vector<unsigned char> value(s.size);
    if (s.kind == ParamSpec::threadgroup_memory) {
      if (tg_bytes_[s.index] == 0)
        bad(k, "threadgroup memory [[threadgroup(" + std::to_string(s.index) + ")]] '" + s.name + "' has no length");
      std::memcpy(value.data(), &tg_offset[s.index], sizeof(uint32_t));
    } else {
      const Binding& b = bindings_[s.index];
      if (b.kind == Binding::none)
        bad(k, "[[buffer(" + std::to_string(s.index) + ")]] '" + s.name + "' is not bound");
      if (s.kind == ParamSpec::bytes) {
        if (b.kind != Binding::bytes)
          bad(k, "'" + std::string(s.name) + "' is a constant struct passed by value: bind it with set_bytes");
        if (b.data.size() < s.size)
          bad(k, "'" + std::string(s.name) + "' takes " + std::to_string(s.size) + " bytes; " +
                     std::to_string(b.data.size()) + " were bound");
        std::memcpy(value.data(), b.data.data(), s.size);
      } else if (b.kind == Binding::bytes) {  // small data bound by value to a pointer parameter
        bad(k, "'" + std::string(s.name) + "' is a device pointer; bind a buffer (set_bytes is for constant structs)");
      } else {
        char* ptr = static_cast<CudaBuffer&>(*b.buffer).device_ptr() + b.offset;
        std::memcpy(value.data(), &ptr, sizeof ptr);
        keep.push_back(b.buffer);
      }
    }
    launch.values.push_back(std::move(value));
  }
  cb_.record(std::move(launch), std::move(keep));
  ++state_.counters().dispatches;
}

// The shared checks, and that the buffer is this device's (a CUDA copy needs device pointers).
void check_range(const CommandBufferState& state, const char* what, const BufferPtr& b, size_t offset,
                 size_t size) {
  if (b && !dynamic_cast<const CudaBuffer*>(b.get()))
    fail(std::string("[blit] ") + what + ": a buffer of another device");
  state.check_blit_range(what, b, offset, size);
}

void CudaBlitEncoder::copy(const BufferPtr& src, size_t src_offset, const BufferPtr& dst, size_t dst_offset,
                           size_t size) {
  check_open();
  check_range(state_, "copy source", src, src_offset, size);
  check_range(state_, "copy destination", dst, dst_offset, size);
  state_.check_copy_alignment(src_offset, dst_offset, size);
  cb_.record(Copy{src, dst, src_offset, dst_offset, size}, {src, dst});
  state_.counters().blit_bytes_copied += size;
}

void CudaBlitEncoder::fill(const BufferPtr& buffer, size_t offset, size_t size, uint8_t value) {
  check_open();
  check_range(state_, "fill", buffer, offset, size);
  cb_.record(Fill{buffer, offset, size, value}, {buffer});
}

void CudaCommandBuffer::enqueue() {
  for (Command& c : commands_) {
    if (auto* l = std::get_if<Launch>(&c)) {
      std::vector<void*> args;
      for (auto& v : l->values) args.push_back(v.data());
      check(cudaLaunchKernel(l->desc->fn, l->grid, l->block, args.data(), l->dynamic_smem, stream_),
            (std::string("launching ") + l->desc->name).c_str());
    } else if (auto* cp = std::get_if<Copy>(&c)) {
      check(cudaMemcpyAsync(static_cast<CudaBuffer&>(*cp->dst).device_ptr() + cp->dst_offset,
                            static_cast<CudaBuffer&>(*cp->src).device_ptr() + cp->src_offset, cp->size,
                            cudaMemcpyDeviceToDevice, stream_),
            "blit copy");
    } else if (auto* f = std::get_if<Fill>(&c)) {
      check(cudaMemsetAsync(static_cast<CudaBuffer&>(*f->buffer).device_ptr() + f->offset, f->value, f->size,
                            stream_),
            "blit fill");
    }
  }
}

void CudaCommandBuffer::commit() {
  state_.commit();
  try {
    if (!graphs_ || commands_.empty()) {
      enqueue();
    } else {  // one graph of the whole command buffer: one launch instead of one per command
      std::lock_guard<std::mutex> lock(owner_->commit_mutex);
      cudaGraph_t graph = nullptr;
      check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
      try {
        enqueue();
      } catch (...) {
        cudaStreamEndCapture(stream_, &graph);
        if (graph) cudaGraphDestroy(graph);
        throw;
      }
      check(cudaStreamEndCapture(stream_, &graph), "cudaStreamEndCapture");
      cudaGraphExec_t exec = nullptr;
      try {
        exec = owner_->graphs.exec_for(graph);
      } catch (...) {
        cudaGraphDestroy(graph);
        throw;
      }
      cudaGraphDestroy(graph);
      check(cudaGraphLaunch(exec, stream_), "cudaGraphLaunch");
    }
  } catch (const GpuError& e) {
    error_ = e.what();
  }
  commands_.clear();  // argument values are copied at launch
}

void CudaCommandBuffer::wait() {
  state_.wait();
  const cudaError_t e = cudaStreamSynchronize(stream_);
  keep_.clear();
  if (!error_.empty()) throw GpuError(error_);
  check(e, "the command buffer failed on the GPU (cudaStreamSynchronize)");
}

class CudaCommandQueue final : public CommandQueue {
 public:
  explicit CudaCommandQueue(std::shared_ptr<CounterSink> sink)
      : stream_(std::make_shared<Stream>()), sink_(std::move(sink)), graphs_(graphs_enabled()) {}
  CommandBufferPtr command_buffer() override { return std::make_shared<CudaCommandBuffer>(stream_, sink_, graphs_); }

 private:
  std::shared_ptr<Stream> stream_;
  std::shared_ptr<CounterSink> sink_;
  bool graphs_;
};

}  // namespace

CommandQueuePtr make_command_queue(std::shared_ptr<CounterSink> sink) {
  return std::make_shared<CudaCommandQueue>(std::move(sink));
}

}  // namespace mkv::gpu::cuda
