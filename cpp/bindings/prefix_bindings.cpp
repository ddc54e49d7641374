// The prefix cache's keys and its blocks to and from host memory, for the
// prefix store (python/metalkv/prefix_store.py; kv/prefix_cache.h).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/vector.h>

#include <string>

#include "bindings.h"
#include "kv/prefix_cache.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace mkv::bindings {

uint32_t cached_prefix(const kv::KvPool* pool, const std::vector<int32_t>& ids, uint32_t residual) {
  if (!pool || ids.size() < kv::kBlockTokens) return 0;
  std::lock_guard<std::recursive_mutex> lock(pool->mutex());
  return kv::prefix::find(*pool, ids.data(), uint32_t(ids.size()), uint32_t(ids.size()), residual).tokens;
}

nb::object pool_info(const kv::KvPool* p) {
  if (!p) return nb::none();
  nb::list groups;
  std::lock_guard<std::recursive_mutex> lock(p->mutex());
  for (uint32_t g = 0; g < p->n_groups(); ++g) {
    nb::dict d;
    d["window"] = p->group_window(g);
    d["layers"] = p->group_layers(g);
    d["blocks"] = p->blocks(g).capacity();
    d["free_blocks"] = p->blocks(g).free_count();
    d["cached_blocks"] = p->blocks(g).cached_count();
    d["evictable_blocks"] = p->blocks(g).evictable_count();
    d["reserved_blocks"] = p->blocks(g).reserved_count();
    d["block_bytes"] = p->block_bytes(g);
    groups.append(d);
  }
  nb::dict r;
  r["nbytes"] = p->nbytes();
  r["block_tokens"] = kv::kBlockTokens;
  r["groups"] = groups;
  r["window_rows_bytes"] = p->prefix_rows().nbytes();  // host memory (kv/prefix_rows.h)
  r["window_rows_max_bytes"] = p->prefix_rows().max_bytes();
  if (const kv::KvBudgetPtr& b = p->budget()) {
    r["kv_memory"] = b->total();
    r["used_bytes"] = b->used();
    r["sequence_bytes"] = b->sequences();
    r["peak_bytes"] = b->peak();
  }
  return r;
}

nb::list export_prefix(const kv::KvPool* pool, const std::vector<int32_t>& ids, uint32_t residual) {
  std::vector<std::vector<uint8_t>> records;
  if (pool) {
    nb::gil_scoped_release release;
    records = kv::prefix::export_blocks(*pool, ids.data(), uint32_t(ids.size()), uint32_t(ids.size()), residual);
  }
  nb::list out;
  for (const auto& r : records) out.append(nb::bytes(reinterpret_cast<const char*>(r.data()), r.size()));
  return out;
}

uint32_t import_prefix(kv::KvPool* pool, const std::vector<int32_t>& ids, const std::vector<RecordArray>& records,
                       uint32_t residual) {
  if (!pool) throw nb::value_error("[engine] import_prefix: the engine has no shared KV pool");
  const size_t want = kv::prefix::record_bytes(*pool, residual);
  if (records.size() * kv::kBlockTokens > ids.size())
    throw nb::value_error("[engine] import_prefix: more records than ids' whole blocks");
  std::vector<const uint8_t*> at;
  for (const RecordArray& r : records) {
    if (r.shape(0) != want)
      throw nb::value_error(("[engine] import_prefix: a record of " + std::to_string(r.shape(0)) +
                             " bytes; this pool's are " + std::to_string(want)).c_str());
    at.push_back(r.data());
  }
  nb::gil_scoped_release release;
  return kv::prefix::import_blocks(*pool, ids.data(), at, residual);
}

namespace {

void bind_prefix(nb::module_& m, nb::module_&) {
  m.def(
      "prefix_hashes",
      [](const std::vector<int32_t>& ids, uint32_t residual) {
        std::vector<uint64_t> out;
        for (size_t i = 0; i + kv::kBlockTokens <= ids.size(); i += kv::kBlockTokens)
          out.push_back(kv::prefix::chain_hash(out.empty() ? kv::prefix::root(residual) : out.back(), ids.data() + i));
        return out;
      },
      "ids"_a, "residual"_a = 0,
      "The prefix cache's key of each full block of ids: block i's chain hash covers its BLOCK_TOKENS ids and "
      "block i - 1's hash (the first block's: the root of caches with that residual window), so it names the "
      "whole prefix up to its end (kv/prefix_cache.h).");
}

}  // namespace

MKV_BINDING(prefix, bind_prefix);

}  // namespace mkv::bindings
