// What the Metal backend assumes about an Apple GPU that Metal does not report
// (cpp/gpu/metal reports the rest from MTLDevice). Plain C++, built on every
// platform so that it is tested everywhere (tests/gpu/test_device_properties.py).
#pragma once

#include <cstdint>
#include <string>

namespace mkv::gpu {

// GPU cores of an Apple chip from MTLDevice::name() ("Apple M2 Pro"): the
// smallest configuration Apple sells under that name (an M1 Pro has 14 or 16
// cores: 14), so a launch sized from it never counts on cores that are absent.
// A name not in the table (a newer chip, an AMD/Intel GPU): 7, the fewest any
// Apple-silicon Mac has (an M1 MacBook Air).
uint32_t apple_gpu_cores(const std::string& device_name);

// Threads one Apple GPU core keeps resident when registers allow. Apple does not
// publish it; 1024 (32 SIMD-groups of 32) is the largest threadgroup Metal allows
// and what a core holds for kernels of moderate register use. A pipeline whose
// maxTotalThreadsPerThreadgroup is lower (many registers) holds that many instead.
constexpr uint32_t kAppleThreadsPerCore = 1024;
// Threadgroup memory of one core: the 32 KiB maxThreadgroupMemoryLength every
// Apple GPU reports, taken as what one core holds in all.
constexpr uint32_t kAppleThreadgroupMemoryPerCore = 32768;

}  // namespace mkv::gpu
