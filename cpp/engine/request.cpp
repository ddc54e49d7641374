#include "engine/request.h"

namespace mkv::engine {

void Channel::notify() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    signalled_ = true;
  }
  cv_.notify_all();
}

bool Channel::wait(double seconds) {
  std::unique_lock<std::mutex> lock(mutex_);
  const bool got = cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return signalled_; });
  signalled_ = false;
  return got;
}

bool Request::take(std::vector<int32_t>& out) {
  bool done;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    out.insert(out.end(), ids_.begin() + taken_, ids_.end());
    taken_ = ids_.size();
    done = done_;
  }
  if (!done) scheduler_->notify();  // a paced call may be waiting for its caller to read
  return done;
}

bool Request::done() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

void Request::stop_after(uint64_t k) {
  int64_t expected = -1;
  stop_after_.compare_exchange_strong(expected, int64_t(k));  // the first stop wins
  scheduler_->notify();
}

void Request::cancel() {
  cancel_ = true;
  scheduler_->notify();
}

void Request::unpace() {
  unpaced_ = true;
  scheduler_->notify();
}

void Request::resume() {
  resumed_ = true;
  scheduler_->notify();
}

void Request::abort() {
  abort_ = true;
  scheduler_->notify();
}

void Request::rethrow() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (error_) std::rethrow_exception(error_);
}

Stats Request::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

std::vector<int32_t> Request::ids() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return ids_;
}

std::vector<float> Request::take_logits() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::move(logits_);
}

std::vector<TokenLogprob> Request::logprobs(size_t start) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (start >= logprobs_.size()) return {};
  return std::vector<TokenLogprob>(logprobs_.begin() + ptrdiff_t(start), logprobs_.end());
}

void Request::push(int32_t id, std::optional<TokenLogprob> logprob) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ids_.push_back(id);
    if (logprob) logprobs_.push_back(std::move(*logprob));
  }
  channel_->notify();
}

void Request::drop_after(uint64_t n_keep) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (ids_.size() > n_keep) ids_.resize(n_keep);
  if (logprobs_.size() > n_keep) logprobs_.resize(n_keep);
  if (taken_ > ids_.size()) taken_ = ids_.size();
}

void Request::finish(Stats stats, std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_ = std::move(stats);
    error_ = error;
    done_ = true;
  }
  channel_->notify();
}

}  // namespace mkv::engine
