#include "command_rules.h"

namespace mkv::gpu {

void CounterSink::add(const Counters& c) {
  std::lock_guard<std::mutex> lock(mutex_);
  totals_ += c;
}

void CounterSink::add_times(const std::map<std::string, KernelTime>& t) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [name, kt] : t) {
    times_[name].calls += kt.calls;
    times_[name].seconds += kt.seconds;
  }
}

Counters CounterSink::totals() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return totals_;
}

std::map<std::string, KernelTime> CounterSink::times() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return times_;
}

void CounterSink::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  totals_ = Counters{};
  times_.clear();
}

void CommandBufferState::fail(const char* object, const std::string& message) const {
  throw GpuError(tag_ + object + " " + message);
}

void CommandBufferState::begin_encoder(EncoderKind kind) {
  if (committed_) fail("[command buffer]", "already committed; create a new one");
  if (open_ != Open::none) fail("[command buffer]", "only one encoder may be open; call end_encoding() first");
  if (kind == EncoderKind::compute) {
    open_ = Open::compute;
    ++counters_.compute_encoders;
  } else {
    open_ = Open::blit;
    ++counters_.blit_encoders;
  }
}

void CommandBufferState::check_open(EncoderKind kind) const {
  if (kind == EncoderKind::compute && open_ != Open::compute)
    fail("[compute]", "the encoder has ended; ask the command buffer for a new one");
  if (kind == EncoderKind::blit && open_ != Open::blit)
    fail("[blit]", "the encoder has ended; ask the command buffer for a new one");
}

void CommandBufferState::end_encoder(EncoderKind kind) {
  check_open(kind);
  open_ = Open::none;
}

void CommandBufferState::commit() {
  if (committed_) fail("[command buffer]", "commit() called twice");
  if (open_ != Open::none) fail("[command buffer]", "call end_encoding() on the open encoder before commit()");
  committed_ = true;
  counters_.command_buffers_committed = 1;
  sink_->add(counters_);
}

void CommandBufferState::wait() {
  if (!committed_) fail("[command buffer]", "wait() called before commit()");
  ++counters_.waits;
  Counters one;
  one.waits = 1;
  sink_->add(one);
}

void CommandBufferState::check_index(uint32_t index, int limit, const char* what) const {
  if (int(index) >= limit)
    fail("[compute]", std::string(what) + " index " + std::to_string(index) + " is out of range; Metal allows 0.." +
                          std::to_string(limit - 1));
}

void CommandBufferState::check_set_pipeline(const PipelinePtr& pipeline) const {
  if (!pipeline) fail("[compute]", "set_pipeline: pipeline is null");
}

void CommandBufferState::check_set_buffer(const BufferPtr& buffer, size_t offset) const {
  if (!buffer) fail("[compute]", "set_buffer: buffer is null");
  if (offset > buffer->length())
    fail("[compute]", "set_buffer: offset " + std::to_string(offset) + " is past the end of the " +
                          std::to_string(buffer->length()) + "-byte buffer");
}

void CommandBufferState::check_set_bytes(size_t length) const {
  if (length > kMaxSetBytes)
    fail("[compute]", "set_bytes: " + std::to_string(length) + " bytes; Metal allows at most " +
                          std::to_string(kMaxSetBytes) + ", use a buffer instead");
}

void CommandBufferState::check_dispatch(bool pipeline_set) const {
  if (!pipeline_set) fail("[compute]", "dispatch_threadgroups before set_pipeline");
}

void CommandBufferState::check_blit_range(const char* what, const BufferPtr& buffer, size_t offset,
                                          size_t size) const {
  if (!buffer) fail("[blit]", std::string(what) + ": buffer is null");
  if (offset > buffer->length() || size > buffer->length() - offset)
    fail("[blit]", std::string(what) + ": range [" + std::to_string(offset) + ", " + std::to_string(offset + size) +
                       ") is outside the " + std::to_string(buffer->length()) + "-byte buffer");
}

void CommandBufferState::check_copy_alignment(size_t src_offset, size_t dst_offset, size_t size) const {
  // macOS Metal requires it; every device checks, so host-only code stays honest.
  if (src_offset % 4 || dst_offset % 4 || size % 4)
    fail("[blit]", "copy offsets and size must be multiples of 4 bytes (got " + std::to_string(src_offset) + ", " +
                       std::to_string(dst_offset) + ", " + std::to_string(size) + ")");
}

}  // namespace mkv::gpu
