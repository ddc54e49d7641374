// The two errors every layer raises.
//
//   GpuError       something could not be done: a device failure, a kernel
//                  validation error, a model the engine cannot run.
//   ArgumentError  a caller's argument is outside what it may be. It names the
//                  argument (in the spelling Python callers use), so the Python
//                  layer raises ValueError and the CLI can speak of `--top-p`.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace mkv::gpu {

class GpuError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ArgumentError : public GpuError {
 public:
  // "[op] argument=value: expected <expected>"
  ArgumentError(const std::string& op, std::string argument, std::string value, std::string expected)
      : GpuError("[" + op + "] " + argument + "=" + value + ": expected " + expected),
        argument(std::move(argument)), value(std::move(value)), expected(std::move(expected)) {}
  // "[op] <problem>", for checks that are not one value against a range
  ArgumentError(const std::string& op, std::string argument, const std::string& problem)
      : GpuError("[" + op + "] " + problem), argument(std::move(argument)) {}

  std::string argument;  // e.g. "top_p"
  std::string value;     // as written in the message, "" for a free-form problem
  std::string expected;  // e.g. "a number in (0, 1] (1 = off)"
};

// The shortest text that reads back as v, as Python's repr(float) writes it:
// 0.1 -> "0.1", -1 -> "-1.0", 1e20 -> "1e+20", nan, inf.
inline std::string format_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s = buf;
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

}  // namespace mkv::gpu
