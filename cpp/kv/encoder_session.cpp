#include "kv/encoder_session.h"

#include <exception>

namespace mkv::kv {

EncoderSession::EncoderSession(gpu::CommandQueue& queue) : queue_(&queue) {
  buffers_.push_back(queue.command_buffer());
  cb_ = buffers_.back().get();
}

EncoderSession::~EncoderSession() {
  try {
    end();
  } catch (...) {  // a destructor must not throw; the command buffer reports misuse on commit
  }
  // Encoding threw after a flush: let the committed work finish before the
  // buffers it reads may go (the caller restores what it changed).
  for (size_t i = 0; i + 1 < buffers_.size(); ++i) {
    try {
      buffers_[i]->wait();
    } catch (...) {
    }
  }
}

void EncoderSession::flush() {
  if (!queue_) return;
  check_encoding();
  end();
  cb_->commit();
  buffers_.push_back(queue_->command_buffer());
  cb_ = buffers_.back().get();
}

gpu::Counters EncoderSession::finish() {
  if (!queue_) throw gpu::GpuError("[encoder] finish() needs a session made from a queue");
  check_encoding();
  end();
  cb_->commit();
  gpu::Counters total;
  std::exception_ptr first;
  for (const gpu::CommandBufferPtr& cb : buffers_) {
    try {
      cb->wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
    total += cb->counters();
  }
  buffers_.clear();  // all completed: the destructor has nothing to wait for
  cb_ = nullptr;
  if (first) std::rethrow_exception(first);
  return total;
}

void EncoderSession::check_encoding() const {
  if (!cb_) throw gpu::GpuError("[encoder] the session has finished; start a new one");
}

gpu::ComputeEncoder& EncoderSession::compute() {
  if (open_ == Open::compute) return *compute_;
  check_encoding();
  end();
  compute_ = &cb_->compute_encoder();
  open_ = Open::compute;
  ++n_compute_;
  return *compute_;
}

gpu::BlitEncoder& EncoderSession::blit() {
  if (open_ == Open::blit) return *blit_;
  check_encoding();
  end();
  blit_ = &cb_->blit_encoder();
  open_ = Open::blit;
  ++n_blit_;
  return *blit_;
}

void EncoderSession::end() {
  const Open was = open_;
  open_ = Open::none;  // first: a failing end_encoding must not be retried by the destructor
  if (was == Open::compute) compute_->end_encoding();
  if (was == Open::blit) blit_->end_encoding();
}

}  // namespace mkv::kv
