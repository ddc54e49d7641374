// EncoderSession: the one open encoder of a command buffer, switched on demand.
//
// Metal allows one open encoder per command buffer, and switching between a
// compute and a blit encoder costs an encoder end/begin on the GPU. Code that
// encodes a step (the model, the KV stores) asks the session for the kind of
// encoder it needs: compute() returns the compute encoder that is already open
// (adding nothing), blit() ends it and opens a blit encoder, and the next
// compute() opens a fresh compute encoder. The session counts what it opened,
// so "encoders per step" is measurable.
//
// Rules: end encoders only through the session, and re-ask compute() after any
// call that may have switched (an encoder reference from before a switch has
// been ended). Call end() before committing; the destructor ends an encoder
// left open (e.g. when encoding threw).
//
// A session made from a queue owns its command buffers and may split the work:
// flush() commits what was encoded so far (without waiting) and continues in a
// new command buffer, so the GPU runs the first layers of a step while the CPU
// encodes the rest; finish() commits the last one and waits for all, in order.
// A session made from one command buffer never splits (flush() does nothing).
#pragma once

#include <cstdint>
#include <vector>

#include "gpu/device.h"

namespace mkv::kv {

class EncoderSession {
 public:
  explicit EncoderSession(gpu::CommandBuffer& cb) : cb_(&cb) {}
  explicit EncoderSession(gpu::CommandQueue& queue);
  EncoderSession(const EncoderSession&) = delete;
  EncoderSession& operator=(const EncoderSession&) = delete;
  ~EncoderSession();

  gpu::ComputeEncoder& compute();  // the open compute encoder, opening one if needed
  gpu::BlitEncoder& blit();        // the open blit encoder, opening one if needed
  void end();                      // ends the open encoder, if any
  void flush();                    // queue sessions: commit, continue in a new command buffer
  // Queue sessions: commit the last command buffer, wait for every one in commit
  // order (the first failure is rethrown once all have completed); their counters summed.
  gpu::Counters finish();

  bool compute_open() const { return open_ == Open::compute; }
  bool blit_open() const { return open_ == Open::blit; }
  uint32_t compute_encoders() const { return n_compute_; }  // opened by this session
  uint32_t blit_encoders() const { return n_blit_; }
  gpu::CommandBuffer& command_buffer() { return *cb_; }  // the one being encoded

 private:
  enum class Open { none, compute, blit };
  void check_encoding() const;  // raises once finish() has run
  gpu::CommandBuffer* cb_;
  gpu::CommandQueue* queue_ = nullptr;           // queue sessions only
  std::vector<gpu::CommandBufferPtr> buffers_;   // queue sessions: committed ones, then cb_
  Open open_ = Open::none;
  gpu::ComputeEncoder* compute_ = nullptr;
  gpu::BlitEncoder* blit_ = nullptr;
  uint32_t n_compute_ = 0;
  uint32_t n_blit_ = 0;
};

}  // namespace mkv::kv
