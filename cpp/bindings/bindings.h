// Shared pieces of the nanobind bindings. Each layer binds itself in its own
// file and registers with MKV_BINDING, so module.cpp never lists them.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <functional>
#include <string>
#include <memory>
#include <optional>
#include <vector>

#include "gpu/device.h"
#include "kv/kv_cache.h"
#include "model/weights.h"

namespace mkv::bindings {

// A device with its default queue, as Python sees it (metalkv.Device).
struct PyDevice {
  gpu::DevicePtr device;
  gpu::CommandQueuePtr queue;
  std::string fallback;  // why "auto" fell back to the host ("" if it did not)
};

// metalkv._core.Weights: tensors on a device until an Engine or a tower takes them.
struct PyWeights {
  PyDevice dev;
  std::unique_ptr<model::Weights> weights;
};

// metalkv.KVCache: a cache on a device (which owns its token ids and chat).
struct PyKVCache {
  PyDevice dev;
  std::unique_ptr<kv::KvCache> cache;
  gpu::Counters last;  // counters of the last append's command buffer
};

// A numpy array over `shape` of `dtype` (default: uint8, the whole buffer) at
// byte offset `offset`: a zero-copy view that keeps `owner` alive where the CPU
// sees the memory, else a copy read from the device.
nanobind::ndarray<nanobind::numpy> host_array(nanobind::handle owner, gpu::Buffer& buffer, size_t offset,
                                              std::vector<size_t> shape,
                                              nanobind::dlpack::dtype dtype = nanobind::dtype<uint8_t>());

// Per-layer KV format names ('f16', 'q8', 'q4', 'q2') as kv_format.h numbers; an
// empty list for None. Raises ArgumentError(what) naming the formats.
std::vector<uint32_t> kv_formats_arg(const std::optional<std::vector<std::string>>& names, const char* what);

// An eviction policy from {"policy": name, "budget": tokens, "sinks", "recent"
// (-1: the policy's default), "window", "pool"}; none for None.
kv::KvPolicySpec kv_policy_arg(const std::optional<nanobind::dict>& policy);

// Encodes work into one compute encoder of a new command buffer, commits and
// waits with the GIL released. For op-level entry points used by tests.
void run_compute(PyDevice& dev, const std::function<void(gpu::ComputeEncoder&)>& encode);

// The prefix store's moves between an engine's shared pool (nullptr: none) and
// Python (prefix_bindings.cpp; the Engine's methods of those names).
// residual: the caches' residual window (their chains' root; records carry window rows).
uint32_t cached_prefix(const kv::KvPool* pool, const std::vector<int32_t>& ids, uint32_t residual);
// Engine.kv_pool: the pool's bytes, its kv_memory budget's use, and per group its blocks (None without a pool).
nanobind::object pool_info(const kv::KvPool* pool);
nanobind::list export_prefix(const kv::KvPool* pool, const std::vector<int32_t>& ids, uint32_t residual);
using RecordArray = nanobind::ndarray<const uint8_t, nanobind::ndim<1>, nanobind::c_contig, nanobind::device::cpu>;
uint32_t import_prefix(kv::KvPool* pool, const std::vector<int32_t>& ids, const std::vector<RecordArray>& records,
                       uint32_t residual);

// m: metalkv._core; ops: metalkv._core.ops (one function per kernel family).
using BindFn = void (*)(nanobind::module_& m, nanobind::module_& ops);
int register_binding(const char* name, BindFn fn);

}  // namespace mkv::bindings

#define MKV_BINDING(name, fn) \
  static const int mkv_binding_##name = ::mkv::bindings::register_binding(#name, fn)
