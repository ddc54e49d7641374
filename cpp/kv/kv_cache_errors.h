// KvCache's implementation files' shared helpers (kv_cache.cpp, kv_evict.cpp,
// kv_residual.cpp): its errors start "[kv_cache] ", numbers in messages, and
// the pool's lock.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "ops/ops.h"

namespace mkv::kv::detail {

[[noreturn]] inline void fail(const std::string& message) { ops::fail("kv_cache", message); }
inline std::string str(uint64_t v) { return std::to_string(v); }
using Lock = std::lock_guard<std::recursive_mutex>;

}  // namespace mkv::kv::detail
