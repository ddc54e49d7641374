// Decode attention over quantized KV caches (issue 14; docs/KV_QUANT.md):
// per (K, V) format (and q4, q2 with a residual window of 128 tokens, its
// f16 rows read from a ring), the time of one decode call, the K/V bytes it reads
// (AttentionDecodePlan::kv_bytes_read: codes and group parameters), the
// effective bandwidth and the speedup over the f16 cache at the same context,
// for SmolLM2's layer (D=64, 9 query heads, 3 KV heads) and a Llama-3-8B layer
// (D=128, 32/8) at 4k, 32k and 128k positions (--quick, and the host executor: 4k and 32k).
//
//   metalkv-bench --filter kv_quant [--device cuda] [--quick]
//
// Times are per call, from command buffers of R and 2R calls differenced
// (bench/device_timing.h), the inputs rotated over enough copies that a call
// finds none of them in the last-level cache.
#include <cmath>
#include <string>
#include <vector>

#include "bench.h"
#include "device_timing.h"
#include "metal/kv_format.h"
#include "ops/attention.h"

namespace mkv::bench {
namespace {

struct Format {
  const char* name;
  uint32_t k, v;
  uint32_t residual = 0;  // a residual window (its ring's f16 rows read for the last ~residual keys)
};

std::vector<Result> kv_quant(const Context& ctx) {
  struct Shape {
    const char* name;
    uint32_t n_q, n_kv, head_dim;
  };
  const Shape shapes[] = {{"smollm2_d64", 9, 3, 64}, {"llama8b_d128", 32, 8, 128}};
  const Format formats[] = {{"f16", mkv_params::kKvF16, mkv_params::kKvF16},
                            {"q8", mkv_params::kKvQ8, mkv_params::kKvQ8},
                            {"q8k_q4v", mkv_params::kKvQ8, mkv_params::kKvQ4},
                            {"q4", mkv_params::kKvQ4, mkv_params::kKvQ4},
                            {"q4_r128", mkv_params::kKvQ4, mkv_params::kKvQ4, 128},
                            {"q2_r128", mkv_params::kKvQ2K, mkv_params::kKvQ2V, 128}};
  // 128k on GPUs only: on the host executor one call there takes seconds (the group would
  // take minutes of CI's `metalkv-bench`).
  std::vector<uint32_t> contexts = {4096, 32768};
  if (!ctx.quick && !ctx.is_host()) contexts.push_back(131072);

  gpu::Device& dev = *ctx.device;
  auto queue = dev.new_command_queue();
  TimingPlan plan;
  plan.repeat = ctx.repeat;
  std::vector<Result> out;
  for (const Shape& s : shapes) {
    for (uint32_t n : contexts) {
      double f16_us = 0;
      for (const Format& f : formats) {
        const std::string name = std::string("kv_quant_decode_") + s.name + "_" + f.name + "_" + std::to_string(n);
        try {
          ops::AttentionDesc d;
          d.n_q_heads = s.n_q;
          d.n_kv_heads = s.n_kv;
          d.head_dim = s.head_dim;
          d.n_tokens = n;
          d.slots = n;  // whole blocks
          d.scale = 1.0f / std::sqrt(float(s.head_dim));
          d.k_format = f.k;
          d.v_format = f.v;
          // the ring of an engine cache with 128-token prefill chunks: 128 + residual + 31, whole blocks
          const uint32_t ring_slots = f.residual ? (128 + f.residual + 31 + 31) / 32 * 32 : 0;
          d.residual = f.residual;
          d.ring_slots = ring_slots;
          d.ring_lo = f.residual ? n - ring_slots : 0;
          if (f.residual)
            d.ring = {pattern_buffer(dev, *queue, uint64_t(ring_slots) * 2 * s.n_kv * s.head_dim * 2,
                                     half_pattern(1 << 16, 7))};
          const uint64_t pool = uint64_t(n) * (mkv_params::kv_slot_bytes(f.k, s.n_kv, s.head_dim) +
                                               mkv_params::kv_slot_bytes(f.v, s.n_kv, s.head_dim));
          const uint64_t head_bytes = uint64_t(s.n_q) * s.head_dim * 4;
          // Every byte pair a half in [-1, 1): sane codes and sane group parameters.
          const uint32_t sets = rotation_sets(pool, uint64_t(3) << 30);
          std::vector<ops::BufferView> kv, q, o;
          for (uint32_t i = 0; i < sets; ++i) {
            kv.push_back({pattern_buffer(dev, *queue, pool, half_pattern(1 << 20, 30 + i))});
            q.push_back({pattern_buffer(dev, *queue, head_bytes, float_pattern(head_bytes / 4, 40 + i))});
            o.push_back({dev.new_buffer(head_bytes)});
          }
          const ops::BufferView table{block_table(dev, n, n / mkv_params::kKvBlockTokens)};
          const ops::AttentionDecodePlan p = ops::attention_decode_plan(dev, d);
          ops::BufferView scratch{p.scratch_bytes ? dev.new_buffer(p.scratch_bytes) : nullptr};
          const CallTime t = time_calls(dev, *queue, plan, [&](gpu::ComputeEncoder& enc, uint64_t call) {
            const uint32_t i = uint32_t(call % sets);
            ops::attention_decode(dev, enc, d, q[i], kv[i], table, o[i], {}, scratch);
          });
          if (f.k == mkv_params::kKvF16 && f.v == mkv_params::kKvF16) f16_us = t.us;
          const double read = double(p.kv_bytes_read);
          out.push_back({name,
                         {{"us", t.us},
                          {"kv_read_MB", read / 1e6},
                          {"GB_per_s", read / (t.us * 1e-6) / 1e9},
                          {"speedup_vs_f16", f16_us > 0 ? f16_us / t.us : 0.0},
                          {"bytes_per_token", double(pool) / n},
                          {"chunks", double(p.n_chunks)}},
                         ctx.is_host() ? "host executor" : dev.name(),
                         {{"kernel", p.kernel}, {"format", f.name}, {"shape", s.name}}});
          std::fprintf(stderr, "[kv_quant] %-44s %10.1f us\n", name.c_str(), t.us);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "[kv_quant] %s failed: %s\n", name.c_str(), e.what());
          out.push_back({name, {}, std::string("failed: ") + e.what()});
        }
      }
    }
  }
  return out;
}

MKV_BENCH("kv_quant",
          "decode attention per KV format (f16, q8, q8 K + q4 V, q4; q4 and q2 with a 128-token residual window): "
          "time, K/V bytes read, GB/s, speedup over f16 "
          "at 4k/32k/128k (--quick and the host: 4k, 32k)",
          kv_quant);

}  // namespace
}  // namespace mkv::bench
