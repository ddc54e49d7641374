// KvCache's construction helpers (kv_cache_spec.cpp): the checks of a spec
// that need no pool, and the pool a cache of its own allocates.
#pragma once

#include <memory>

#include "kv/kv_cache.h"

namespace mkv::kv::detail {

// Raises (ArgumentError for options, GpuError "[kv_cache] ..." otherwise);
// fills in windows and a policy's budget.
void check_spec(const gpu::DevicePtr& device, KvCacheSpec& spec);
// The pool one sequence of a checked spec's capacity needs (a per-layer
// budget policy: each full layer its own group, its budget's blocks).
std::shared_ptr<KvPool> own_pool(const gpu::DevicePtr& device, const KvCacheSpec& spec);

}  // namespace mkv::kv::detail
