// Metal backend: command queues, command buffers and their encoders.
//
// Argument checks here mirror Metal's own rules so that a mistake becomes a
// GpuError naming the call, instead of a validation-layer abort or a silent
// GPU fault with Metal's validation off (the default outside Xcode).
#include "metal_objects.h"

namespace mkv::gpu::metal {
namespace {

constexpr size_t kMaxSetBytes = 4096;  // Metal's documented limit for setBytes

MTL::Size to_mtl(Size3 s) { return MTL::Size(s.x, s.y, s.z); }

std::string to_string(Size3 s) {
  return "(" + std::to_string(s.x) + ", " + std::to_string(s.y) + ", " + std::to_string(s.z) + ")";
}

void check_range(const char* what, const MetalBuffer& buffer, size_t offset, size_t size) {
  if (offset > buffer.length() || size > buffer.length() - offset) {
    throw GpuError(std::string("[metal] ") + what + ": bytes [" + std::to_string(offset) + ", " +
                   std::to_string(offset) + " + " + std::to_string(size) + ") fall outside a " +
                   std::to_string(buffer.length()) + "-byte buffer");
  }
}

}  // namespace

// ---- CommandQueue ---------------------------------------------------------

MetalCommandQueue::MetalCommandQueue(NS::SharedPtr<MTL::CommandQueue> queue,
                                     std::shared_ptr<CounterTotals> totals,
                                     size_t max_threadgroup_memory)
    : queue_(std::move(queue)),
      totals_(std::move(totals)),
      max_threadgroup_memory_(max_threadgroup_memory) {}

CommandBufferPtr MetalCommandQueue::command_buffer() {
  AutoreleaseScope pool;
  // commandBuffer() (not ...WithUnretainedReferences): Metal itself retains
  // every resource we bind until the work completes.
  MTL::CommandBuffer* raw = queue_->commandBuffer();  // autoreleased
  if (!raw) throw GpuError("[metal] could not create a command buffer");
  return std::make_shared<MetalCommandBuffer>(NS::RetainPtr(raw), totals_,
                                              max_threadgroup_memory_);
}

// ---- CommandBuffer --------------------------------------------------------

MetalCommandBuffer::MetalCommandBuffer(NS::SharedPtr<MTL::CommandBuffer> command_buffer,
                                       std::shared_ptr<CounterTotals> totals,
                                       size_t max_threadgroup_memory)
    : command_buffer_(std::move(command_buffer)),
      totals_(std::move(totals)),
      max_threadgroup_memory_(max_threadgroup_memory) {}

MetalCommandBuffer::~MetalCommandBuffer() {
  // Releasing an encoder that was never ended trips a Metal assertion; a caller
  // that threw half-way through encoding should not turn into an abort.
  if (compute_.is_open()) compute_.end_encoding();
  if (blit_.is_open()) blit_.end_encoding();
}

void MetalCommandBuffer::require_no_open_encoder(const char* call) const {
  if (state_ != State::kEncoding) {
    throw GpuError(std::string("[metal] ") + call +
                   " on a command buffer that was already committed; get a new one from "
                   "the command queue");
  }
  const char* open = compute_.is_open() ? "compute" : blit_.is_open() ? "blit" : nullptr;
  if (open) {
    throw GpuError(std::string("[metal] ") + call + " while a " + open +
                   " encoder is still open on this command buffer (one encoder at a time); "
                   "call end_encoding() on it first");
  }
}

ComputeEncoder& MetalCommandBuffer::compute_encoder() {
  require_no_open_encoder("compute_encoder()");
  AutoreleaseScope pool;
  // The default (serial) dispatch type runs each dispatch after the previous
  // one has finished, which is the ordering the host executor gives too.
  MTL::ComputeCommandEncoder* raw = command_buffer_->computeCommandEncoder();  // autoreleased
  if (!raw) throw GpuError("[metal] could not create a compute encoder");
  compute_.begin(NS::RetainPtr(raw));
  count(&Counters::compute_encoders);
  return compute_;
}

BlitEncoder& MetalCommandBuffer::blit_encoder() {
  require_no_open_encoder("blit_encoder()");
  AutoreleaseScope pool;
  MTL::BlitCommandEncoder* raw = command_buffer_->blitCommandEncoder();  // autoreleased
  if (!raw) throw GpuError("[metal] could not create a blit encoder");
  blit_.begin(NS::RetainPtr(raw));
  count(&Counters::blit_encoders);
  return blit_;
}

void MetalCommandBuffer::commit() {
  require_no_open_encoder("commit()");
  AutoreleaseScope pool;
  command_buffer_->commit();
  state_ = State::kCommitted;
  count(&Counters::command_buffers_committed);
  // Device totals count submitted work only (as the host device does), so a
  // command buffer dropped before commit adds nothing to them.
  totals_->add(counters_);
}

void MetalCommandBuffer::wait() {
  if (state_ == State::kEncoding) {
    throw GpuError("[metal] wait() before commit(); commit the command buffer first");
  }
  AutoreleaseScope pool;  // error() and its description are autoreleased
  count(&Counters::waits);
  Counters one_wait;
  one_wait.waits = 1;
  totals_->add(one_wait);
  command_buffer_->waitUntilCompleted();
  state_ = State::kCompleted;
  bound_buffers_.clear();
  bound_pipelines_.clear();
  if (command_buffer_->status() == MTL::CommandBufferStatusError) {
    throw GpuError("[metal] command buffer failed on the GPU: " +
                   describe(command_buffer_->error()) +
                   ". Run the same work on the host device, which checks buffer bounds, "
                   "barriers and threadgroup limits and names the kernel line");
  }
}

void MetalCommandBuffer::count(uint64_t Counters::*field, uint64_t n) { counters_.*field += n; }

const MetalBuffer& MetalCommandBuffer::bind(const BufferPtr& buffer, const char* call) {
  const auto* metal_buffer = dynamic_cast<const MetalBuffer*>(buffer.get());
  if (!metal_buffer) {
    throw GpuError(std::string("[metal] ") + call +
                   (buffer ? ": the buffer was not created by this metal device"
                           : ": the buffer is null"));
  }
  // Consecutive binds of one buffer are common (e.g. a blit within a buffer).
  if (bound_buffers_.empty() || bound_buffers_.back() != buffer) bound_buffers_.push_back(buffer);
  return *metal_buffer;
}

const MetalPipeline& MetalCommandBuffer::bind(const PipelinePtr& pipeline) {
  const auto* metal_pipeline = dynamic_cast<const MetalPipeline*>(pipeline.get());
  if (!metal_pipeline) {
    throw GpuError(pipeline ? "[metal] set_pipeline(): the pipeline was not created by a metal device"
                            : "[metal] set_pipeline(): the pipeline is null");
  }
  if (bound_pipelines_.empty() || bound_pipelines_.back() != pipeline) {
    bound_pipelines_.push_back(pipeline);
  }
  return *metal_pipeline;
}

// ---- ComputeEncoder -------------------------------------------------------

void MetalComputeEncoder::begin(NS::SharedPtr<MTL::ComputeCommandEncoder> encoder) {
  encoder_ = std::move(encoder);
  pipeline_ = nullptr;
}

MTL::ComputeCommandEncoder* MetalComputeEncoder::active(const char* call) const {
  if (!encoder_) {
    throw GpuError(std::string("[metal] ") + call +
                   " on a compute encoder after end_encoding(); call compute_encoder() "
                   "on the command buffer again");
  }
  return encoder_.get();
}

void MetalComputeEncoder::set_pipeline(const PipelinePtr& pipeline) {
  MTL::ComputeCommandEncoder* encoder = active("set_pipeline()");
  pipeline_ = &owner_.bind(pipeline);
  encoder->setComputePipelineState(pipeline_->mtl());
}

void MetalComputeEncoder::set_buffer(const BufferPtr& buffer, size_t offset, uint32_t index) {
  MTL::ComputeCommandEncoder* encoder = active("set_buffer()");
  const MetalBuffer& bound = owner_.bind(buffer, "set_buffer()");
  if (offset > bound.length()) {
    throw GpuError("[metal] set_buffer(index " + std::to_string(index) + "): offset " +
                   std::to_string(offset) + " is past the end of a " +
                   std::to_string(bound.length()) + "-byte buffer");
  }
  encoder->setBuffer(bound.mtl(), offset, index);
}

void MetalComputeEncoder::set_bytes(const void* data, size_t length, uint32_t index) {
  MTL::ComputeCommandEncoder* encoder = active("set_bytes()");
  if (length > kMaxSetBytes || (!data && length > 0)) {
    throw GpuError("[metal] set_bytes(index " + std::to_string(index) + "): " +
                   (data ? std::to_string(length) + " bytes is over Metal's 4096-byte limit; "
                                                    "put the data in a buffer and use set_buffer()"
                         : std::string("data is null")));
  }
  encoder->setBytes(data, length, index);  // Metal copies the bytes now
}

void MetalComputeEncoder::set_threadgroup_memory_length(size_t length, uint32_t index) {
  MTL::ComputeCommandEncoder* encoder = active("set_threadgroup_memory_length()");
  // Metal requires a multiple of 16 bytes; rounding up lets callers pass exact sizes.
  const size_t rounded = (length + 15) / 16 * 16;
  if (rounded > owner_.max_threadgroup_memory()) {
    throw GpuError("[metal] set_threadgroup_memory_length(index " + std::to_string(index) +
                   "): " + std::to_string(length) + " bytes exceeds this GPU's " +
                   std::to_string(owner_.max_threadgroup_memory()) +
                   "-byte threadgroup memory; use smaller tiles");
  }
  encoder->setThreadgroupMemoryLength(rounded, index);
}

void MetalComputeEncoder::dispatch_threadgroups(Size3 threadgroups, Size3 threads_per_threadgroup) {
  MTL::ComputeCommandEncoder* encoder = active("dispatch_threadgroups()");
  if (!pipeline_) throw GpuError("[metal] dispatch_threadgroups() before set_pipeline()");
  const Size3 tpg = threads_per_threadgroup;
  const uint32_t limit = pipeline_->max_total_threads_per_threadgroup();
  if (tpg.volume() == 0 || tpg.volume() > limit) {
    throw GpuError("[metal] kernel '" + pipeline_->name() + "': " + to_string(tpg) +
                   " threads per threadgroup; expected 1 to " + std::to_string(limit) +
                   " in total (this pipeline's max_total_threads_per_threadgroup())");
  }
  // Counted even when empty so that counts match the host device.
  owner_.count(&Counters::dispatches);
  // An empty grid is a legal no-op for callers, but Metal's validation rejects it.
  if (threadgroups.volume() == 0) return;
  encoder->dispatchThreadgroups(to_mtl(threadgroups), to_mtl(tpg));
}

void MetalComputeEncoder::end_encoding() {
  active("end_encoding()")->endEncoding();
  encoder_.reset();
  pipeline_ = nullptr;
}

// ---- BlitEncoder ----------------------------------------------------------

void MetalBlitEncoder::begin(NS::SharedPtr<MTL::BlitCommandEncoder> encoder) {
  encoder_ = std::move(encoder);
}

MTL::BlitCommandEncoder* MetalBlitEncoder::active(const char* call) const {
  if (!encoder_) {
    throw GpuError(std::string("[metal] ") + call +
                   " on a blit encoder after end_encoding(); call blit_encoder() on the "
                   "command buffer again");
  }
  return encoder_.get();
}

void MetalBlitEncoder::copy(const BufferPtr& src, size_t src_offset, const BufferPtr& dst,
                            size_t dst_offset, size_t size) {
  MTL::BlitCommandEncoder* encoder = active("copy()");
  const MetalBuffer& from = owner_.bind(src, "blit copy() source");
  const MetalBuffer& to = owner_.bind(dst, "blit copy() destination");
  check_range("blit copy() source", from, src_offset, size);
  check_range("blit copy() destination", to, dst_offset, size);
  // Apple documents this restriction for macOS (not iOS).
  if (src_offset % 4 || dst_offset % 4 || size % 4) {
    throw GpuError("[metal] blit copy(): source offset " + std::to_string(src_offset) +
                   ", destination offset " + std::to_string(dst_offset) + " and size " +
                   std::to_string(size) + " must all be multiples of 4 bytes on macOS");
  }
  // Metal leaves overlapping copies within one buffer undefined.
  if (&from == &to && src_offset < dst_offset + size && dst_offset < src_offset + size) {
    throw GpuError("[metal] blit copy(): source and destination ranges overlap in one buffer");
  }
  if (size == 0) return;
  encoder->copyFromBuffer(from.mtl(), src_offset, to.mtl(), dst_offset, size);
  owner_.count(&Counters::blit_bytes_copied, size);
}

void MetalBlitEncoder::fill(const BufferPtr& buffer, size_t offset, size_t size, uint8_t value) {
  MTL::BlitCommandEncoder* encoder = active("fill()");
  const MetalBuffer& bound = owner_.bind(buffer, "blit fill()");
  check_range("blit fill()", bound, offset, size);
  if (size == 0) return;
  encoder->fillBuffer(bound.mtl(), NS::Range(offset, size), value);
}

void MetalBlitEncoder::end_encoding() {
  active("end_encoding()")->endEncoding();
  encoder_.reset();
}

}  // namespace mkv::gpu::metal
