// What the devices that record commands themselves (host, cuda) share: the
// totals a device counts, Metal's order of calls on a command buffer, and
// Metal's limits on the encoders' arguments, each checked the same way on both.
// (The metal device has Metal check the order: cpp/gpu/metal/metal_command.cpp.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "device.h"

namespace mkv::gpu {

constexpr size_t kMaxSetBytes = 4096;  // Metal's setBytes limit

// Device-wide totals of committed work and, when the device profiles, time per
// kernel name. Shared by a device and its command buffers, so a command buffer
// may outlive the Python object of its device.
class CounterSink {
 public:
  explicit CounterSink(bool profile = false) : profile_(profile) {}
  bool profile() const { return profile_; }  // time each command by kernel name
  void add(const Counters& c);
  void add_times(const std::map<std::string, KernelTime>& t);
  Counters totals() const;
  std::map<std::string, KernelTime> times() const;
  void reset();  // totals and times

 private:
  const bool profile_;
  mutable std::mutex mutex_;
  Counters totals_;
  std::map<std::string, KernelTime> times_;
};

enum class EncoderKind { compute, blit };

// One command buffer's state: which encoder is open (one at a time, none at
// commit()), whether it is committed (once; wait() only after), and its
// counters, added to the device's sink at commit() and wait(). The argument
// checks live here too, so each error carries the device's `tag` ("" on the
// host, "[cuda] ") before the object's ("[compute] ", "[blit] ", ...).
class CommandBufferState {
 public:
  CommandBufferState(std::shared_ptr<CounterSink> sink, std::string tag)
      : sink_(std::move(sink)), tag_(std::move(tag)) {}

  void begin_encoder(EncoderKind kind);     // compute_encoder() / blit_encoder(): counted
  void check_open(EncoderKind kind) const;  // every call of that encoder
  void end_encoder(EncoderKind kind);       // its end_encoding()
  void commit();                            // adds this buffer's counters to the sink
  void wait();                              // counts the wait here and in the sink
  Counters& counters() { return counters_; }
  const Counters& counters() const { return counters_; }
  CounterSink& sink() { return *sink_; }

  // The encoders' arguments, against Metal's limits.
  void check_index(uint32_t index, int limit, const char* what) const;  // "buffer", "threadgroup memory"
  void check_set_pipeline(const PipelinePtr& pipeline) const;
  void check_set_buffer(const BufferPtr& buffer, size_t offset) const;
  void check_set_bytes(size_t length) const;
  void check_dispatch(bool pipeline_set) const;
  void check_blit_range(const char* what, const BufferPtr& buffer, size_t offset, size_t size) const;
  void check_copy_alignment(size_t src_offset, size_t dst_offset, size_t size) const;

 private:
  enum class Open { none, compute, blit };
  [[noreturn]] void fail(const char* object, const std::string& message) const;

  std::shared_ptr<CounterSink> sink_;
  std::string tag_;
  Open open_ = Open::none;
  bool committed_ = false;
  Counters counters_;
};

// The base of a recording device's encoders (Interface: ComputeEncoder or
// BlitEncoder): its calls check, and end_encoding() ends, through the state of
// the command buffer `cb_` that recorded it.
template <class Interface, class CommandBufferT, EncoderKind kKind>
class RecordingEncoder : public Interface {
 public:
  RecordingEncoder(CommandBufferT& cb, CommandBufferState& state) : cb_(cb), state_(state) {}
  void end_encoding() override { state_.end_encoder(kKind); }

 protected:
  void check_open() const { state_.check_open(kKind); }
  CommandBufferT& cb_;
  CommandBufferState& state_;  // cb_'s
};

}  // namespace mkv::gpu
