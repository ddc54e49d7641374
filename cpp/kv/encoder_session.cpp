#include "kv/encoder_session.h"

namespace mkv::kv {

EncoderSession::~EncoderSession() {
  try {
    end();
  } catch (...) {  // a destructor must not throw; the command buffer reports misuse on commit
  }
}

gpu::ComputeEncoder& EncoderSession::compute() {
  if (open_ == Open::compute) return *compute_;
  end();
  compute_ = &cb_.compute_encoder();
  open_ = Open::compute;
  ++n_compute_;
  return *compute_;
}

gpu::BlitEncoder& EncoderSession::blit() {
  if (open_ == Open::blit) return *blit_;
  end();
  blit_ = &cb_.blit_encoder();
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
