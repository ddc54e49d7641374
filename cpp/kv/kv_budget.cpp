#include "kv/kv_budget.h"

#include <algorithm>

namespace mkv::kv {

void KvBudget::charge(size_t bytes, const std::string& what) {
  size_t u = used_.load();
  do {
    if (bytes > total_ - std::min(u, total_))
      throw KvMemoryError("kv_cache", "kv_memory",
                          "the engine's kv_memory (" + std::to_string(total_) + " bytes) has " +
                              std::to_string(total_ - std::min(u, total_)) + " free: " + what + " needs " +
                              std::to_string(bytes) + " (the pool takes " + std::to_string(pool_) +
                              "); free caches (del cache, cache.reset()), run fewer sequences at once "
                              "(max_seqs), or load the engine with a larger kv_memory");
  } while (!used_.compare_exchange_weak(u, u + bytes));
  size_t p = peak_.load();
  while (u + bytes > p && !peak_.compare_exchange_weak(p, u + bytes)) {
  }
}

gpu::BufferPtr KvBudget::new_buffer(gpu::Device& device, size_t bytes, const std::string& what) {
  charge(bytes, what);
  gpu::BufferPtr raw;
  try {
    raw = device.new_buffer(bytes);
  } catch (...) {
    used_ -= bytes;
    throw;
  }
  // The charge goes back with the last reference (the budget outlives its buffers).
  std::shared_ptr<KvBudget> self = shared_from_this();
  gpu::Buffer* at = raw.get();
  return gpu::BufferPtr(at, [raw = std::move(raw), self, bytes](gpu::Buffer*) mutable {
    raw.reset();
    self->used_ -= bytes;
  });
}

gpu::BufferPtr KvBudget::pool_buffer(gpu::Device& device, size_t bytes) {
  gpu::BufferPtr b = new_buffer(device, bytes, "the shared pool");
  pool_ += bytes;
  return b;
}

}  // namespace mkv::kv
