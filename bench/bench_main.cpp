// metalkv-bench: run the registered benchmarks on one device, print a table,
// and with --json FILE write the same numbers as JSON (--json - prints only the
// JSON on stdout; the table then goes to stderr).
//
//   metalkv-bench [--list] [--device host|cuda|metal|auto] [--quick] [--filter SUBSTRING]
//                 [--repeat N] [--json FILE|-]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include "bench.h"

namespace mkv::bench {
namespace {

struct Entry {
  std::string group, description;
  BenchFn fn;
};

std::vector<Entry>& registry() {
  static std::vector<Entry> benches;
  return benches;
}

const char* kUsage =
    "usage: metalkv-bench [--list] [--device host|cuda|metal|auto] [--quick] [--filter SUBSTRING]\n"
    "                     [--repeat N] [--json FILE|-]\n"
    "  --device  where the kernels run (default host)\n"
    "  --quick   gpu_kernels: its smallest GPU shape set (a first look in seconds)\n";

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
  o.precision(8);
  o << "[\n";
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    o << "  {\"name\": \"" << json_escape(r.name) << "\"";
    for (const auto& [k, v] : r.labels) o << ", \"" << json_escape(k) << "\": \"" << json_escape(v) << "\"";
    for (const auto& [k, v] : r.metrics) {
      o << ", \"" << json_escape(k) << "\": ";
      if (std::isfinite(v)) o << v;
      else o << "null";  // JSON has no NaN
    }
    if (!r.note.empty()) o << ", \"note\": \"" << json_escape(r.note) << "\"";
    o << "}" << (i + 1 < results.size() ? "," : "") << "\n";
  }
  o << "]\n";
  return o.str();
}

void print_table(std::FILE* out, const std::vector<Result>& results) {
  for (const Result& r : results) {
    std::fprintf(out, "%-34s", r.name.c_str());
    for (const auto& [k, v] : r.metrics) std::fprintf(out, "  %s=%.4g", k.c_str(), v);
    if (!r.note.empty()) std::fprintf(out, "  (%s)", r.note.c_str());
    std::fprintf(out, "\n");
  }
}

void print_list(std::FILE* out) {
  for (const Entry& e : registry()) std::fprintf(out, "%-20s  %s\n", e.group.c_str(), e.description.c_str());
}

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "metalkv-bench: %s\n%s", message.c_str(), kUsage);
  std::exit(2);
}

int parse_repeat(const std::string& s) {
  char* end = nullptr;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || v < 1 || v > 1000000)
    usage_error("--repeat '" + s + "': expected a whole number of runs, 1 or more");
  return int(v);
}

}  // namespace

int register_bench(const std::string& group, const std::string& description, BenchFn fn) {
  registry().push_back({group, description, std::move(fn)});
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
  std::string filter, json, device = "host";
  bool list = false;
  Context ctx;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--filter") filter = value();
    else if (a == "--repeat") ctx.repeat = parse_repeat(value());
    else if (a == "--json") json = value();
    else if (a == "--device") device = value();
    else if (a == "--quick") ctx.quick = true;
    else if (a == "--list") list = true;
    else if (a == "-h" || a == "--help") {
      std::printf("%s\nbenchmarks (--filter matches a substring of the name):\n", kUsage);
      print_list(stdout);
      return 0;
    } else {
      usage_error("unknown argument '" + a + "'");
    }
  }
  if (list) {
    print_list(stdout);
    return 0;
  }
  std::vector<const Entry*> chosen;
  for (const Entry& e : registry())
    if (filter.empty() || e.group.find(filter) != std::string::npos) chosen.push_back(&e);
  if (chosen.empty()) {
    std::fprintf(stderr, "metalkv-bench: --filter '%s' matches no benchmark; there are:\n", filter.c_str());
    print_list(stderr);
    return 2;
  }
  try {
    ctx.device = mkv::gpu::create_device(device);
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "metalkv-bench: --device %s: %s\n", device.c_str(), ex.what());
    return 1;
  }
  std::fprintf(json == "-" ? stderr : stdout, "# device: %s (%s)%s\n", ctx.device->kind().c_str(),
               ctx.device->name().c_str(), ctx.quick ? ", --quick" : "");
  std::vector<Result> all;
  int status = 0;
  for (const Entry* e : chosen) {
    try {
      for (Result& r : e->fn(ctx)) all.push_back(std::move(r));
    } catch (const std::exception& ex) {  // the other groups still run and print
      std::fprintf(stderr, "metalkv-bench: %s failed: %s\n", e->group.c_str(), ex.what());
      all.push_back({e->group, {}, std::string("failed: ") + ex.what()});
      status = 1;
    }
  }
  print_table(json == "-" ? stderr : stdout, all);
  if (json == "-") {
    std::cout << to_json(all);
  } else if (!json.empty()) {
    std::ofstream out(json);
    out << to_json(all);
    if (!out) {
      std::fprintf(stderr, "metalkv-bench: cannot write --json '%s'\n", json.c_str());
      return 1;
    }
  }
  return status;
}
