// Apple GPU core counts by chip name (Apple's published specifications).
#include "apple_gpu.h"

namespace mkv::gpu {
namespace {

struct Chip {
  const char* suffix;  // after "Apple "
  uint32_t cores;      // the smallest configuration sold under that name
};
// Longest names first within a family: "M1 Pro" must not match as "M1".
constexpr Chip kChips[] = {
    {"M1 Ultra", 48}, {"M1 Max", 24}, {"M1 Pro", 14}, {"M1", 7},
    {"M2 Ultra", 60}, {"M2 Max", 30}, {"M2 Pro", 16}, {"M2", 8},
    {"M3 Ultra", 60}, {"M3 Max", 30}, {"M3 Pro", 14}, {"M3", 8},
    {"M4 Max", 32},   {"M4 Pro", 16}, {"M4", 8},
};
constexpr uint32_t kUnknownCores = 7;

}  // namespace

uint32_t apple_gpu_cores(const std::string& device_name) {
  const std::string prefix = "Apple ";
  if (device_name.compare(0, prefix.size(), prefix) != 0) return kUnknownCores;
  const std::string chip = device_name.substr(prefix.size());
  for (const Chip& c : kChips)
    if (chip == c.suffix) return c.cores;
  return kUnknownCores;
}

}  // namespace mkv::gpu
