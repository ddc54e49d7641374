// See device_timing.h.
#include "device_timing.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

namespace mkv::bench {
namespace {

// Wall time of one command buffer holding `n` calls, from encode to wait.
double command_buffer_ms(gpu::CommandQueue& queue, const EncodeCall& encode, uint32_t n, uint64_t& next_call) {
  const auto t0 = std::chrono::steady_clock::now();
  auto cb = queue.command_buffer();
  auto& enc = cb->compute_encoder();
  for (uint32_t i = 0; i < n; ++i) encode(enc, next_call++);
  enc.end_encoding();
  cb->commit();
  cb->wait();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

uint32_t calls_for(double target_ms, double per_call_ms, uint32_t max_calls) {
  const double r = std::ceil(target_ms / std::max(per_call_ms, 1e-6));
  return uint32_t(std::clamp(r, 1.0, double(max_calls)));
}

}  // namespace

CallTime time_calls(gpu::Device&, gpu::CommandQueue& queue, const TimingPlan& plan, const EncodeCall& encode) {
  uint64_t call = 0;
  command_buffer_ms(queue, encode, 1, call);  // warm-up: pipelines, first touch
  // Pick R in two steps: one call (an overestimate: the fixed cost is in it),
  // then R calls of that first guess.
  const double one = command_buffer_ms(queue, encode, 1, call);
  uint32_t r = calls_for(plan.target_ms, one, plan.max_calls);
  if (r > 1) r = calls_for(plan.target_ms, command_buffer_ms(queue, encode, r, call) / r, plan.max_calls);
  // Slow calls (single-pass attention at 128k, big gemms): fewer samples.
  const int repeat = one > 20 * plan.target_ms ? std::min(plan.repeat, 3) : plan.repeat;

  std::vector<double> t1, t2;
  for (int s = 0; s < std::max(1, repeat); ++s) {
    t1.push_back(command_buffer_ms(queue, encode, r, call));
    t2.push_back(command_buffer_ms(queue, encode, 2 * r, call));
  }
  const double m1 = median(t1), m2 = median(t2);
  CallTime t;
  t.calls = r;
  t.samples = int(t1.size());
  t.us_upper = m2 / (2 * r) * 1e3;
  t.us = (m2 - m1) / r * 1e3;
  if (!(t.us > 0)) t.us = t.us_upper;  // noise larger than R calls: keep the bound
  t.fixed_us = (2 * m1 - m2) * 1e3;
  return t;
}

uint32_t rotation_sets(uint64_t set_bytes, uint64_t max_total) {
  const uint64_t want = std::clamp<uint64_t>((kRotateBytes + set_bytes - 1) / std::max<uint64_t>(set_bytes, 1), 2, 16);
  const uint64_t fit = max_total / std::max<uint64_t>(set_bytes, 1);
  return uint32_t(std::max<uint64_t>(1, std::min(want, fit)));
}

gpu::BufferPtr pattern_buffer(gpu::Device& dev, gpu::CommandQueue& queue, uint64_t bytes,
                              const std::vector<unsigned char>& pattern) {
  if (pattern.empty() || pattern.size() % 4)
    throw gpu::GpuError("[bench] pattern_buffer: the pattern must be a positive multiple of 4 bytes");
  bytes = (bytes + 3) / 4 * 4;  // blit copies move multiples of 4 bytes
  auto buf = dev.new_buffer(bytes);
  uint64_t filled = std::min<uint64_t>(pattern.size(), bytes);
  buf->write(0, pattern.data(), filled);
  while (filled < bytes) {  // one encoder per doubling: each copy reads what the last one wrote
    auto cb = queue.command_buffer();
    for (int i = 0; i < 8 && filled < bytes; ++i) {
      const uint64_t n = std::min(filled, bytes - filled);
      auto& blit = cb->blit_encoder();
      blit.copy(buf, 0, buf, filled, n);
      blit.end_encoding();
      filled += n;
    }
    cb->commit();
    cb->wait();
  }
  return buf;
}

namespace {

template <class T>
std::vector<unsigned char> uniform_pattern(size_t n, uint32_t seed, float scale) {
  std::vector<unsigned char> out(n * sizeof(T));
  uint32_t x = seed * 2654435761u + 12345u;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    const T v = T((float(x >> 8) / float(1 << 24) * 2.0f - 1.0f) * scale);
    std::memcpy(out.data() + i * sizeof(T), &v, sizeof(T));
  }
  return out;
}

}  // namespace

std::vector<unsigned char> half_pattern(size_t n, uint32_t seed, float scale) {
  return uniform_pattern<_Float16>((n + 1) / 2 * 2, seed, scale);
}

std::vector<unsigned char> float_pattern(size_t n, uint32_t seed, float scale) {
  return uniform_pattern<float>(n, seed, scale);
}

}  // namespace mkv::bench
