// KV store benchmarks (group "kv_store"): the compute store vs the blit store
// for a SmolLM2-135M-like cache (30 layers, 3 KV heads, head_dim 64, neox RoPE
// on K, base 100000), one decode step (1 token per layer) and one prefill
// chunk (256 tokens per layer), on the bench's device (the host executor unless
// --device). Each step is one command
// buffer that stores into every layer through one EncoderSession, as the model
// will; it reports the encoders, dispatches and blit bytes of that step.
//
//   metalkv-bench --filter kv_store [--device KIND]
#include <random>

#include "bench.h"
#include "gpu/device.h"
#include "kv/kv_cache.h"
#include "ops/rope.h"

namespace mkv::bench {
namespace {

constexpr uint32_t kLayers = 30, kKvHeads = 3, kHeadDim = 64, kCapacity = 4096;

gpu::BufferPtr random_rows(gpu::Device& dev, uint32_t n) {
  auto b = dev.new_buffer(size_t(n) * kKvHeads * kHeadDim * 4);
  std::mt19937 rng(n);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> p(size_t(n) * kKvHeads * kHeadDim);
  for (float& x : p) x = dist(rng);
  b->write(0, p.data(), p.size() * 4);
  return b;
}

Result store_step(const Context& ctx, kv::StorePath path, uint32_t n_new, const char* label) {
  const gpu::DevicePtr& dev = ctx.device;
  auto queue = dev->new_command_queue();
  kv::KvCache cache(dev, {kLayers, kKvHeads, kHeadDim, kCapacity, {}, n_new, path});
  auto k = random_rows(*dev, n_new), v = random_rows(*dev, n_new);
  const std::vector<float> table = ops::rope_inv_freq_default(kHeadDim, 100000.0f);
  auto inv = dev->new_buffer(table.size() * 4);
  inv->write(0, table.data(), table.size() * 4);
  const ops::RopeSpec rope{ops::RopeStyle::neox, kHeadDim, {inv, 0}};

  gpu::Counters step;
  const double ms = median_ms(ctx.repeat, [&] {
    if (cache.length(0) + n_new > kCapacity) cache.reset();
    auto cb = queue->command_buffer();
    {
      kv::EncoderSession session(*cb);
      for (uint32_t l = 0; l < kLayers; ++l) cache.store(session, l, {k, 0}, {v, 0}, n_new, &rope);
      session.end();
    }
    cb->commit();
    cb->wait();
    step = cb->counters();
  });
  const double kv_bytes = 2.0 * n_new * kKvHeads * kHeadDim * 2 * kLayers;  // half K + V written
  return {std::string("kv_store_") + kv::store_path_name(path) + "_" + label,
          {{"ms", ms},
           {"compute_encoders", double(step.compute_encoders)},
           {"blit_encoders", double(step.blit_encoders)},
           {"dispatches", double(step.dispatches)},
           {"blit_MB", double(step.blit_bytes_copied) / 1e6},
           {"kv_MB_written", kv_bytes / 1e6}},
          "30 layers x 3 kv heads x D64, rope on K, " + (ctx.is_host() ? std::string("host executor") : dev->name())};
}

std::vector<Result> kv_store(const Context& ctx) {
  std::vector<Result> out;
  for (auto [n_new, label] : {std::pair<uint32_t, const char*>{1, "decode"}, {256, "prefill256"}})
    for (kv::StorePath path : {kv::StorePath::compute, kv::StorePath::blit})
      out.push_back(store_step(ctx, path, n_new, label));
  return out;
}

MKV_BENCH("kv_store", "compute vs blit KV store, 30 layers: a decode step and a 256-token chunk", kv_store);

}  // namespace
}  // namespace mkv::bench
