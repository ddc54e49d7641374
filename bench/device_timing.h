// Timing kernels on any device through the Device API alone (no GPU timers):
// the wall time of command buffers of R and 2R calls, differenced, and input
// buffers filled on the device. Used by bench_gpu_kernels.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench.h"

namespace mkv::bench {

// Encodes call number `call` (0, 1, 2, ... across command buffers, so that
// callers rotate their input sets by call % sets). One call may be several
// dispatches (split-K attention is two).
using EncodeCall = std::function<void(gpu::ComputeEncoder& enc, uint64_t call)>;

struct CallTime {
  double us = 0;        // per call: (median t(2R) - median t(R)) / R
  double us_upper = 0;  // per call with one command buffer's cost included: median t(2R) / 2R
  double fixed_us = 0;  // one command buffer's own cost: 2 t(R) - t(2R) (encode, commit, launch, wait)
  uint32_t calls = 0;   // R
  int samples = 0;      // command buffers of each size timed
};

struct TimingPlan {
  double target_ms = 3.0;   // R is chosen so that R calls take about this long
  int repeat = 5;           // command buffers of R and of 2R calls, interleaved; medians
  uint32_t max_calls = 512; // R at most (a cap on what one command buffer records)
};

// Per-call time of `encode`. The difference of t(2R) and t(R) removes the
// fixed cost of a command buffer, provided the device runs R calls back to
// back: true on the host executor, and on CUDA while a call takes longer than
// the CPU needs to launch it (compare with the dispatch floor row).
CallTime time_calls(gpu::Device& dev, gpu::CommandQueue& queue, const TimingPlan& plan, const EncodeCall& encode);

// Bytes that a rotation of input sets should span so that consecutive calls
// find none of their data in the last-level cache: 4x a 60 MB L2 (H200).
inline constexpr uint64_t kRotateBytes = uint64_t(256) << 20;
// Input sets to rotate over for one set of `set_bytes`: enough to span
// kRotateBytes, 2 to 16, fewer when the total would pass `max_total` (then at least 1).
uint32_t rotation_sets(uint64_t set_bytes, uint64_t max_total);

// A device buffer of `bytes` (rounded up to 4) holding `pattern` repeated:
// written once from the CPU, then doubled by blit copies on the device, so
// gigabytes cost milliseconds. pattern.size() must be a positive multiple of 4.
gpu::BufferPtr pattern_buffer(gpu::Device& dev, gpu::CommandQueue& queue, uint64_t bytes,
                              const std::vector<unsigned char>& pattern);

// Patterns (a few MB at most): values uniform in [-scale, scale).
std::vector<unsigned char> half_pattern(size_t n, uint32_t seed, float scale = 1.0f);
std::vector<unsigned char> float_pattern(size_t n, uint32_t seed, float scale = 1.0f);

}  // namespace mkv::bench
