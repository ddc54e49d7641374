// metalkv-bench: run the registered benchmarks, print a table, and with
// --json FILE (or --json - for stdout) write the same numbers as JSON.
//
//   metalkv-bench [--filter SUBSTRING] [--repeat N] [--json FILE|-]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include "bench.h"

namespace mkv::bench {
namespace {

std::vector<std::pair<std::string, BenchFn>>& registry() {
  static std::vector<std::pair<std::string, BenchFn>> benches;
  return benches;
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

std::string to_json(const std::vector<Result>& results) {
  std::ostringstream o;
  o << "[\n";
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    o << "  {\"name\": \"" << json_escape(r.name) << "\"";
    for (const auto& [k, v] : r.metrics) o << ", \"" << json_escape(k) << "\": " << v;
    if (!r.note.empty()) o << ", \"note\": \"" << json_escape(r.note) << "\"";
    o << "}" << (i + 1 < results.size() ? "," : "") << "\n";
  }
  o << "]\n";
  return o.str();
}

void print_table(const std::vector<Result>& results) {
  for (const Result& r : results) {
    std::printf("%-34s", r.name.c_str());
    for (const auto& [k, v] : r.metrics) std::printf("  %s=%.4g", k.c_str(), v);
    if (!r.note.empty()) std::printf("  (%s)", r.note.c_str());
    std::printf("\n");
  }
}

}  // namespace

int register_bench(const std::string& group, BenchFn fn) {
  registry().emplace_back(group, std::move(fn));
  return int(registry().size());
}

double median_ms(int repeat, const std::function<void()>& fn) {
  fn();  // warm-up: first-touch of buffers, fiber stacks, thread pool start
  std::vector<double> times;
  for (int i = 0; i < std::max(1, repeat); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace mkv::bench

int main(int argc, char** argv) {
  using namespace mkv::bench;
  std::string filter, json;
  Context ctx;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "metalkv-bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--filter") filter = value();
    else if (a == "--repeat") ctx.repeat = std::max(1, std::atoi(value().c_str()));
    else if (a == "--json") json = value();
    else if (a == "-h" || a == "--help") {
      std::printf("usage: metalkv-bench [--filter SUBSTRING] [--repeat N] [--json FILE|-]\n");
      return 0;
    } else {
      std::fprintf(stderr, "metalkv-bench: unknown argument '%s' (try --help)\n", a.c_str());
      return 2;
    }
  }
  std::vector<Result> all;
  for (const auto& [group, fn] : registry()) {
    if (!filter.empty() && group.find(filter) == std::string::npos) continue;
    try {
      for (Result& r : fn(ctx)) all.push_back(std::move(r));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "metalkv-bench: %s failed: %s\n", group.c_str(), e.what());
      return 1;
    }
  }
  print_table(all);
  if (json == "-") std::cout << to_json(all);
  else if (!json.empty()) std::ofstream(json) << to_json(all);
  return 0;
}
