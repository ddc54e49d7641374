// KvBudget: an engine's kv_memory as a hard cap. Every device byte its KV side
// holds is charged here while the buffer lives: the shared pool's buffers, and
// each sequence's own (residual rings and their checkpoint copies, block-table
// mirrors, blit staging, eviction scratch). A buffer that would pass the cap is
// not made: KvMemoryError, which admission avoids by asking fits() first.
//
// Allocator: where a cache's own buffers come from: the device alone (a cache
// with a pool of its own), or the device through its shared pool's budget.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>

#include "gpu/device.h"
#include "gpu/errors.h"

namespace mkv::kv {

// A charge that would pass kv_memory (an ArgumentError naming kv_memory).
class KvMemoryError : public gpu::ArgumentError {
 public:
  using gpu::ArgumentError::ArgumentError;
};

class KvBudget : public std::enable_shared_from_this<KvBudget> {
 public:
  explicit KvBudget(size_t total) : total_(total) {}
  size_t total() const { return total_; }
  size_t used() const { return used_.load(); }
  size_t peak() const { return peak_.load(); }
  size_t available() const { const size_t u = used(); return u < total_ ? total_ - u : 0; }
  bool fits(size_t bytes) const { return bytes <= available(); }
  // Bytes held by sequences' own buffers (all of used() but the pool's).
  size_t sequences() const { return used() - pool_; }

  // A zero-filled device buffer charged here until its last reference goes.
  // `what` names it in the error when it does not fit.
  gpu::BufferPtr new_buffer(gpu::Device& device, size_t bytes, const std::string& what);
  // The pool's buffers, charged once (they live as long as the engine).
  gpu::BufferPtr pool_buffer(gpu::Device& device, size_t bytes);

 private:
  void charge(size_t bytes, const std::string& what);
  const size_t total_;
  std::atomic<size_t> used_{0}, peak_{0};
  size_t pool_ = 0;
};
using KvBudgetPtr = std::shared_ptr<KvBudget>;

struct Allocator {
  gpu::Device* device = nullptr;
  KvBudgetPtr budget;  // null: not charged
  gpu::BufferPtr operator()(size_t bytes, const std::string& what) const {
    return budget ? budget->new_buffer(*device, bytes, what) : device->new_buffer(bytes);
  }
};

}  // namespace mkv::kv
