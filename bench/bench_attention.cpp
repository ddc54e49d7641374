// Decode attention on the bench's device (the host executor unless --device):
// one pass, split-K, one pass through a shuffled block table (a paged cache:
// the same bytes read, in blocks scattered over the pool) and a sliding
// layer, over contexts 256 .. 32k (on the host also one pass in the GPU shape,
// beside its own: ops::AttentionDesc::decode_variant), for
// SmolLM2's shape (D=64, 9 query heads, 3 KV heads) and a Llama-3-8B layer
// (D=128, 32/8). ms is the wall time of one command buffer holding one call,
// commit and wait included (for GPU kernel times: the gpu_kernels group).
//
//   metalkv-bench --filter attention [--repeat N] [--device KIND]
//
// kv_read_per_visible: K/V bytes the kernels load per step / K/V bytes of the
// positions the query sees (target 1.0); kv_read_per_resident: the same over
// the bytes resident in the layer's slots (< 1 for sliding layers, whose
// stale slots are never read). Reads are counted analytically from the
// kernel's access pattern (AttentionDecodePlan::kv_bytes_read: each
// (KV head, head block, chunk) threadgroup loads the K and V rows of its chunk
// once; chunks partition the visible positions). The tests back the "only
// visible slots" half by poisoning every other slot with NaN.
#include <algorithm>
#include <cmath>
#include <iterator>
#include <string>
#include <vector>

#include "bench.h"
#include "gpu/device.h"
#include "ops/attention.h"

namespace mkv::bench {
namespace {

struct Shape {
  const char* name;
  uint32_t n_q_heads, n_kv_heads, head_dim;
};

struct Mode {
  const char* name;
  ops::AttentionSplit split;
  uint32_t window;  // 0: full layer
  bool shuffled = false;  // the table scatters the blocks over the pool
  const char* variant = "";  // AttentionDesc::decode_variant ("gpu": the GPU shape on the host)
};

// Halfs in [-1, 1) from a cheap generator: filling 128 MB must not dominate.
void fill_half(gpu::Buffer& b) {
  std::vector<_Float16> p(b.length() / 2);
  uint32_t x = 12345;
  for (size_t i = 0; i < p.size(); ++i) {
    x = x * 1664525u + 1013904223u;
    p[i] = _Float16(float(x >> 8) / float(1 << 24) * 2.0f - 1.0f);
  }
  b.write(0, p.data(), p.size() * 2);
}

std::vector<Result> decode_attention(const Context& ctx) {
  const Shape shapes[] = {{"smollm2_d64", 9, 3, 64}, {"llama8b_d128", 32, 8, 128}};
  const Mode modes[] = {{"single", ops::AttentionSplit::never, 0},
                        {"split", ops::AttentionSplit::always, 0},
                        {"paged", ops::AttentionSplit::automatic, 0, true},
                        {"sliding1k", ops::AttentionSplit::automatic, 1024},
                        // on the host: its own shape (the rows above) against the GPU shape
                        {"single_gpu_shape", ops::AttentionSplit::never, 0, false, "gpu"}};
  const uint32_t contexts[] = {256, 1024, 4096, 8192, 32768};
  constexpr uint32_t B = mkv_params::kKvBlockTokens;
  const uint32_t prefill_chunk = 512;  // a sliding pool: kv::group_blocks

  const gpu::DevicePtr& dev = ctx.device;
  auto queue = dev->new_command_queue();
  std::vector<Result> results;
  for (const Shape& s : shapes) {
    const uint32_t max_ctx = contexts[std::size(contexts) - 1];
    auto kv = dev->new_buffer(size_t(2) * max_ctx * s.n_kv_heads * s.head_dim * 2);
    fill_half(*kv);
    auto q = dev->new_buffer(size_t(s.n_q_heads) * s.head_dim * 4);
    std::vector<float> qp(size_t(s.n_q_heads) * s.head_dim);
    for (size_t i = 0; i < qp.size(); ++i) qp[i] = float(i % 7) * 0.1f - 0.3f;
    q->write(0, qp.data(), qp.size() * 4);
    auto out = dev->new_buffer(size_t(s.n_q_heads) * s.head_dim * 4);

    for (const Mode& m : modes) {
      if (*m.variant && !dev->properties().lanes_are_fibers) continue;  // elsewhere the rows above are the GPU shape
      for (uint32_t n : contexts) {
        ops::AttentionDesc d;
        d.n_q_heads = s.n_q_heads;
        d.n_kv_heads = s.n_kv_heads;
        d.head_dim = s.head_dim;
        d.n_tokens = n;
        d.window = m.window;
        const uint32_t blocks = m.window ? std::min((n + B - 1) / B, (m.window + 2 * prefill_chunk - 1 + B - 1) / B + 1)
                                         : (n + B - 1) / B;
        d.slots = blocks * B;
        const gpu::BufferPtr table = block_table(*dev, n, blocks, m.shuffled);
        d.scale = 1.0f / std::sqrt(float(s.head_dim));
        d.split = m.split;
        d.decode_variant = m.variant;
        const ops::AttentionDecodePlan plan = ops::attention_decode_plan(*dev, d);
        auto scratch = plan.scratch_bytes ? dev->new_buffer(plan.scratch_bytes) : nullptr;
        const double ms = median_ms(n >= 32768 ? 1 : ctx.repeat, [&] {
          auto cb = queue->command_buffer();
          auto& enc = cb->compute_encoder();
          ops::attention_decode(*dev, enc, d, {q}, {kv}, {table}, {out}, {}, {scratch});
          enc.end_encoding();
          cb->commit();
          cb->wait();
        });
        const double resident = double(d.slots) * s.n_kv_heads * s.head_dim * 2 * 2;
        results.push_back(
            {std::string("attn_decode_") + s.name + "_" + m.name + "_" + std::to_string(n),
             {{"ms", ms},
              {"kv_read_per_visible", double(plan.kv_bytes_read) / double(plan.kv_bytes_visible)},
              {"kv_read_per_resident", double(plan.kv_bytes_read) / resident},
              {"kv_read_MB", double(plan.kv_bytes_read) / 1e6},
              {"chunks", double(plan.n_chunks)},
              {"threadgroups", double(plan.threadgroups)}},
             ctx.is_host() ? "host executor" : dev->name()});
      }
    }
  }
  return results;
}

MKV_BENCH("attention", "decode attention (single pass, split-K, sliding) for SmolLM2 and Llama-3-8B layers, 256..32k context",
          decode_attention);

}  // namespace
}  // namespace mkv::bench
