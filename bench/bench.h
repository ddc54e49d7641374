// metalkv-bench: benchmarks that measure and print (table, optionally JSON).
// Each bench_*.cpp registers its cases with MKV_BENCH.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "gpu/device.h"

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

}  // namespace mkv::bench

#define MKV_BENCH_CAT2(a, b) a##b
#define MKV_BENCH_CAT(a, b) MKV_BENCH_CAT2(a, b)
#define MKV_BENCH(group, description, fn) \
  static const int MKV_BENCH_CAT(mkv_bench_, __LINE__) = ::mkv::bench::register_bench(group, description, fn)
