// metalkv-bench: benchmarks that measure and print (table, optionally JSON).
// Each bench_*.cpp registers its cases with MKV_BENCH.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gpu/device.h"
#include "metal/kv_params.h"

namespace mkv::bench {

struct Result {
  std::string name;
  std::vector<std::pair<std::string, double>> metrics;  // printed in this order
  std::string note;
  // Fields for scripts that read the JSON (kernel, dtype, ...); the table shows the name only.
  std::vector<std::pair<std::string, std::string>> labels = {};
};

struct Context {
  int repeat = 5;          // timed repetitions; the median is reported
  gpu::DevicePtr device;   // --device (default "host"): every benchmark runs on it
  bool quick = false;      // --quick: a benchmark's smallest shape set (gpu_kernels on a GPU)
  bool is_host() const { return device->kind() == "host"; }
};

using BenchFn = std::function<std::vector<Result>(const Context&)>;
// group: the name --filter matches and --list shows, with its one-line description.
int register_bench(const std::string& group, const std::string& description, BenchFn fn);

// Median wall time in milliseconds of `repeat` runs of fn, after one warm-up.
double median_ms(int repeat, const std::function<void()>& fn);

// A block table (uint32 per kKvBlockTokens positions) for n_tokens positions
// over a pool of n_blocks blocks: logical block i in pool block i % n_blocks
// (a contiguous cache, or a ring for a sliding layer), or with shuffled, in a
// fixed random permutation of the pool's blocks (a paged cache).
inline gpu::BufferPtr block_table(gpu::Device& dev, uint32_t n_tokens, uint32_t n_blocks, bool shuffled = false) {
  constexpr uint32_t B = mkv_params::kKvBlockTokens;
  std::vector<uint32_t> perm(n_blocks);
  std::iota(perm.begin(), perm.end(), 0u);
  if (shuffled) std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
  std::vector<uint32_t> ids((n_tokens + B - 1) / B + 1);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = perm[i % n_blocks];
  auto buf = dev.new_buffer(ids.size() * 4);
  buf->write(0, ids.data(), ids.size() * 4);
  return buf;
}

}  // namespace mkv::bench

#define MKV_BENCH_CAT2(a, b) a##b
#define MKV_BENCH_CAT(a, b) MKV_BENCH_CAT2(a, b)
#define MKV_BENCH(group, description, fn) \
  static const int MKV_BENCH_CAT(mkv_bench_, __LINE__) = ::mkv::bench::register_bench(group, description, fn)
