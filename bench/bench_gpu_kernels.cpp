// GPU kernel times (groups gpu_kernels_decode, _prefill, _linear): decode
// attention (single pass, split-K, the automatic choice, a sweep of chunk
// counts), prefill attention (a 512-query chunk), gemv and gemm for every
// weight format, at Llama-3-8B's shapes on a GPU; a small set on the host
// executor (a smoke test, seconds).
//
//   metalkv-bench --device cuda --filter gpu_kernels [--quick] [--json FILE]
//   metalkv-bench --filter gpu_kernels            # host: small shapes
//
// us: time per call, (t(2R) - t(R)) / R over command buffers of R and 2R calls
// (device_timing.h), with the inputs rotated over sets that together span
// 256 MB so consecutive calls miss the L2. bytes: what a call must move at
// least: K/V (or weights) read once, plus the activations in and out.
// bench/gpu/kernels.py adds torch peers and a copy ceiling on the same shapes.
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench.h"
#include "device_timing.h"
#include "metal/linear_params.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/linear.h"
#include "ops/weight_pack.h"

namespace mkv::bench {
namespace {

using ops::WeightType;

std::string num(uint64_t v) { return std::to_string(v); }

struct Bench {
  gpu::Device& dev;
  gpu::CommandQueuePtr queue;
  TimingPlan plan;
  uint64_t max_total;  // bytes one case may allocate for its rotation
  std::vector<Result> out;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();

  CallTime time(const EncodeCall& encode) { return time_calls(dev, *queue, plan, encode); }
  gpu::BufferPtr filled(uint64_t bytes, const std::vector<unsigned char>& pattern) {
    return pattern_buffer(dev, *queue, bytes, pattern);
  }
  // A case that raised (a launch the device refused, out of memory): a row
  // saying so, and the group goes on.
  void failed(const std::string& name, const std::exception& e) {
    std::fprintf(stderr, "[bench] %s failed: %s\n", name.c_str(), e.what());
    out.push_back({name, {}, std::string("failed: ") + e.what(), {{"op", "failed"}}});
  }
  void add(Result r, const CallTime& t, double bytes, uint32_t sets) {
    r.metrics.insert(r.metrics.begin(), {{"us", t.us},
                                         {"GB_per_s", bytes / (t.us * 1e-6) / 1e9},
                                         {"bytes_MB", bytes / 1e6}});
    r.metrics.insert(r.metrics.end(), {{"us_upper", t.us_upper},
                                       {"fixed_us", t.fixed_us},
                                       {"calls_per_cb", double(t.calls)},
                                       {"sets", double(sets)}});
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "[%6.1f s] %-50s %10.2f us\n", s, r.name.c_str(), t.us);
    out.push_back(std::move(r));
  }
};

// ---- the dispatch floor: what a call costs when its kernel does almost nothing
void dispatch_floor(Bench& b) {
  ops::BufferView y{b.filled(4096, float_pattern(1024, 1))}, x{b.filled(4096, float_pattern(1024, 2))};
  const CallTime t = b.time([&](gpu::ComputeEncoder& enc, uint64_t) { ops::add(b.dev, enc, y, x, 1024); });
  b.add({"dispatch_floor", {}, "ops::add of 1024 floats: the per-call floor of every row", {{"op", "floor"}}},
        t, 3 * 4096.0, 1);
}

// The decode step's norm over one row (f32 weight): 65 of them per Llama-3-8B token.
void rms_norm_row(Bench& b, uint32_t dim) {
  ops::BufferView x{b.filled(dim * 4, float_pattern(dim, 3))}, w{b.filled(dim * 4, float_pattern(dim, 4))},
      y{b.filled(dim * 4, float_pattern(dim, 5))};
  const CallTime t = b.time([&](gpu::ComputeEncoder& enc, uint64_t) {
    ops::rms_norm(b.dev, enc, x, w, WeightType::f32, y, 1, dim, 1e-5f, 0.0f);
  });
  b.add({"rms_norm_f32_" + num(dim), {{"dim", double(dim)}}, "", {{"op", "rms_norm"}, {"kernel", "rms_norm_f32"}}}, t,
        3.0 * dim * 4, 1);
}

// ---- decode attention ------------------------------------------------------------
struct AttnShape {
  uint32_t head_dim, n_q, n_kv, n_tokens;
};

std::string attn_shape_name(const AttnShape& s) {
  return "d" + num(s.head_dim) + "_h" + num(s.n_q) + "_kv" + num(s.n_kv) + "_ctx" + num(s.n_tokens);
}

std::vector<std::pair<std::string, std::string>> attn_labels(const char* op, const AttnShape& s,
                                                             const std::string& kernel, const std::string& mode) {
  return {{"op", op}, {"kernel", kernel}, {"mode", mode}, {"shape", attn_shape_name(s)}};
}

void decode_attention(Bench& b, const AttnShape& s, const std::vector<uint32_t>& chunk_sweep) {
  const uint64_t kv_bytes = uint64_t(2) * s.n_tokens * s.n_kv * s.head_dim * 2;
  const uint64_t head_bytes = uint64_t(s.n_q) * s.head_dim * 4;
  const uint32_t sets = rotation_sets(kv_bytes + 2 * head_bytes, b.max_total);
  std::vector<ops::BufferView> kv, q, out;
  for (uint32_t i = 0; i < sets; ++i) {
    kv.push_back({b.filled(kv_bytes, half_pattern(std::min<uint64_t>(kv_bytes / 2, 1 << 21), 10 + i))});
    q.push_back({b.filled(head_bytes, float_pattern(head_bytes / 4, 20 + i))});
    out.push_back({b.dev.new_buffer(head_bytes)});
  }
  ops::AttentionDesc d;
  d.n_q_heads = s.n_q;
  d.n_kv_heads = s.n_kv;
  d.head_dim = s.head_dim;
  d.n_tokens = s.n_tokens;
  d.slots = s.n_tokens;  // the contexts are whole blocks
  d.scale = 1.0f / std::sqrt(float(s.head_dim));
  // A contiguous cache (the identity table) and a paged one (its blocks in a
  // fixed random order over the same pool: the same bytes, scattered).
  const uint32_t n_blocks = s.n_tokens / mkv_params::kKvBlockTokens;
  const ops::BufferView identity{block_table(b.dev, s.n_tokens, n_blocks)};
  const ops::BufferView shuffled{block_table(b.dev, s.n_tokens, n_blocks, true)};

  struct Mode {
    std::string name;
    ops::AttentionSplit split;
    uint32_t chunks;
    std::string variant = "";  // AttentionDesc::decode_variant
    bool paged = false;        // the shuffled table
  };
  std::vector<Mode> modes = {{"single", ops::AttentionSplit::never, 0},
                             {"split", ops::AttentionSplit::always, 0},
                             {"auto", ops::AttentionSplit::automatic, 0},
                             {"auto_paged", ops::AttentionSplit::automatic, 0, "", true}};
  // The swept shapes also time the kernels without prefetch (D = 128 only):
  // the automatic plan, one pass, and the chunk sweep.
  const bool variants = !chunk_sweep.empty() && s.head_dim == 128;
  if (variants) {
    modes.push_back({"auto_nopf", ops::AttentionSplit::automatic, 0, "nopf"});
    modes.push_back({"single_nopf", ops::AttentionSplit::never, 0, "nopf"});
  }
  for (uint32_t c : chunk_sweep)
    if (c * 32 <= s.n_tokens) {
      modes.push_back({"split_c" + num(c), ops::AttentionSplit::always, c});
      if (variants) modes.push_back({"split_c" + num(c) + "_nopf", ops::AttentionSplit::always, c, "nopf"});
    }
  for (const Mode& m : modes) try {
    d.split = m.split;
    d.split_chunks = m.chunks;
    d.decode_variant = m.variant;
    const ops::AttentionDecodePlan p = ops::attention_decode_plan(b.dev, d);
    ops::BufferView scratch{p.scratch_bytes ? b.dev.new_buffer(p.scratch_bytes) : nullptr};
    const CallTime t = b.time([&](gpu::ComputeEncoder& enc, uint64_t call) {
      const uint32_t i = uint32_t(call % sets);
      ops::attention_decode(b.dev, enc, d, q[i], kv[i], m.paged ? shuffled : identity, out[i], {}, scratch);
    });
    const std::string kernel = p.kernel + (p.split ? "+" + ops::attention_kernel_name("attn_decode_reduce", s.head_dim) : "");
    b.add({"attn_decode_" + attn_shape_name(s) + "_" + m.name,
           {{"head_dim", double(s.head_dim)},
            {"n_q_heads", double(s.n_q)},
            {"n_kv_heads", double(s.n_kv)},
            {"context", double(s.n_tokens)},
            {"chunks", double(p.n_chunks)},
            {"threadgroups", double(p.threadgroups)},
            {"wave", double(p.wave)},
            {"kv_read_per_visible", double(p.kv_bytes_read) / double(p.kv_bytes_visible)},
            {"scratch_MB", double(p.scratch_bytes) / 1e6}},
           "",
           attn_labels("attn_decode", s, kernel, m.name)},
          t, double(p.kv_bytes_visible + 2 * head_bytes), sets);
  } catch (const std::exception& e) {
    b.failed("attn_decode_" + attn_shape_name(s) + "_" + m.name, e);
  }
}

// ---- prefill attention: n_queries at the end of a context of n_tokens --------------
void prefill_attention(Bench& b, const AttnShape& s, uint32_t n_queries) {
  const uint64_t kv_bytes = uint64_t(2) * s.n_tokens * s.n_kv * s.head_dim * 2;
  const uint64_t q_bytes = uint64_t(n_queries) * s.n_q * s.head_dim * 4;
  const uint32_t sets = rotation_sets(kv_bytes + 2 * q_bytes, b.max_total);
  std::vector<ops::BufferView> kv, q, out;
  for (uint32_t i = 0; i < sets; ++i) {
    kv.push_back({b.filled(kv_bytes, half_pattern(std::min<uint64_t>(kv_bytes / 2, 1 << 21), 30 + i))});
    q.push_back({b.filled(q_bytes, float_pattern(std::min<uint64_t>(q_bytes / 4, 1 << 20), 40 + i))});
    out.push_back({b.dev.new_buffer(q_bytes)});
  }
  ops::AttentionDesc d;
  d.n_q_heads = s.n_q;
  d.n_kv_heads = s.n_kv;
  d.head_dim = s.head_dim;
  d.n_tokens = s.n_tokens;
  d.n_queries = n_queries;
  d.slots = s.n_tokens;  // the contexts are whole blocks
  d.scale = 1.0f / std::sqrt(float(s.head_dim));
  const ops::BufferView table{block_table(b.dev, s.n_tokens, s.n_tokens / mkv_params::kKvBlockTokens)};
  const CallTime t = b.time([&](gpu::ComputeEncoder& enc, uint64_t call) {
    const uint32_t i = uint32_t(call % sets);
    ops::attention_prefill(b.dev, enc, d, q[i], kv[i], table, out[i], {});
  });
  // Causal: query j (of n_queries) sees n_tokens - n_queries + j + 1 keys; q.k and p.v are 2 flops a MAC each.
  const double key_visits = double(n_queries) * (s.n_tokens - n_queries) + 0.5 * n_queries * (n_queries + 1.0);
  const double flops = 4.0 * s.n_q * s.head_dim * key_visits;
  b.add({"attn_prefill_" + attn_shape_name(s) + "_q" + num(n_queries),
         {{"head_dim", double(s.head_dim)},
          {"n_q_heads", double(s.n_q)},
          {"n_kv_heads", double(s.n_kv)},
          {"context", double(s.n_tokens)},
          {"n_queries", double(n_queries)},
          {"TFLOP_per_s", flops / (t.us * 1e-6) / 1e12}},
         "",
         attn_labels("attn_prefill", s, ops::attention_kernel_name("attn_prefill_f16", s.head_dim), "prefill")},
        t, double(kv_bytes + 2 * q_bytes), sets);
}

// ---- gemv / gemm -----------------------------------------------------------------
// A few MB of weights in format t, whole rows of n_in as the kernels read them:
// values in [-1, 1) (f32, f16, bf16); random quants with every block's scale
// (and min) a small finite half, packed (ops/weight_pack.h).
std::vector<unsigned char> weight_pattern(WeightType t, uint32_t n_in, uint32_t seed) {
  if (t == WeightType::f32) return float_pattern(1 << 20, seed);
  if (t == WeightType::f16 || t == WeightType::bf16) return half_pattern(1 << 21, seed);  // bf16: finite values too
  const uint32_t per_block = ops::weight_row_multiple(t);
  const size_t block = ops::file_weight_bytes(t, 1, per_block, "bench");
  const uint64_t rows = std::max<uint64_t>(1, (uint64_t(4) << 20) / ops::file_weight_bytes(t, 1, n_in, "bench"));
  std::vector<unsigned char> p(ops::file_weight_bytes(t, rows, n_in, "bench"));  // ~4 MB
  uint32_t x = seed * 2654435761u + 7u;
  for (unsigned char& c : p) c = (x = x * 1664525u + 1013904223u) >> 24;
  // Where the halves sit: d (and m / dmin) first, except Q6_K's d at byte 208.
  const bool two = t == WeightType::q4_1 || t == WeightType::q5_1 || t == WeightType::q4_k || t == WeightType::q5_k;
  const size_t at = t == WeightType::q6_k ? 208 : 0;
  for (size_t i = 0; i < p.size(); i += block)
    for (int h = 0; h < (two ? 2 : 1); ++h) {
      const _Float16 v = _Float16((h ? -0.05f : 0.01f) * float(1 + (i / block) % 7) / 7.0f);
      std::memcpy(&p[i + at + 2 * h], &v, 2);
    }
  std::vector<unsigned char> packed(ops::weight_bytes(t, rows, n_in, "bench"));
  ops::pack_weights(t, rows, n_in, p.data(), packed.data());
  return packed;
}

// How a linear case runs: the op's default, or a forced gemv width (bench
// names end in _r1, _r2, _r4), the residual-add or bias epilogue (_acc, _bias),
// or the fused GLU gemv over a stacked [W_gate; W_up] (gemv_swiglu_*).
struct LinearVariant {
  uint32_t gemv_rows = 0;
  bool accumulate = false;
  bool bias = false;
  bool glu = false;
};

std::string variant_suffix(const LinearVariant& v) {
  return (v.gemv_rows ? "_r" + num(v.gemv_rows) : std::string()) + (v.accumulate ? "_acc" : "") +
         (v.bias ? "_bias" : "");
}

// n_out: rows of W, or for glu rows of each half (W is 2 n_out x n_in).
void linear(Bench& b, WeightType t, uint32_t n_out, uint32_t n_in, uint32_t n_tokens, const LinearVariant& v = {}) {
  const uint64_t w_rows = v.glu ? 2 * uint64_t(n_out) : n_out;
  const uint64_t w_bytes = ops::weight_bytes(t, w_rows, n_in, "bench");
  const uint64_t x_bytes = uint64_t(n_tokens) * n_in * 4, y_bytes = uint64_t(n_tokens) * n_out * 4;
  const uint64_t bias_bytes = v.bias ? uint64_t(n_out) * 4 : 0;
  const uint32_t sets = rotation_sets(w_bytes + x_bytes + y_bytes + bias_bytes, b.max_total);
  std::vector<ops::MatmulArgs> args(sets);
  const std::vector<unsigned char> pattern = weight_pattern(t, n_in, n_out + n_in);
  for (uint32_t i = 0; i < sets; ++i) {
    ops::MatmulArgs& a = args[i];
    a.w = {b.filled(w_bytes, pattern)};
    a.x = {b.filled(x_bytes, float_pattern(std::min<uint64_t>(x_bytes / 4, 1 << 20), 50 + i))};
    a.y = {b.filled(y_bytes, float_pattern(std::min<uint64_t>(y_bytes / 4, 1 << 20), 60 + i))};
    if (v.bias) a.bias = {b.filled(bias_bytes, float_pattern(std::min<uint64_t>(n_out, 1 << 20), 70 + i))};
    a.n_tokens = n_tokens;
    a.n_in = n_in;
    a.n_out = n_out;
    a.wtype = t;
    a.kernel = n_tokens == 1 ? ops::MatmulKernel::gemv : ops::MatmulKernel::gemm;
    a.accumulate = v.accumulate;
    a.gemv_rows = v.gemv_rows;
  }
  const CallTime time = b.time([&](gpu::ComputeEncoder& enc, uint64_t call) {
    const ops::MatmulArgs& a = args[call % sets];
    if (!v.glu) return ops::matmul(b.dev, enc, a);
    ops::GluArgs g;
    g.x = a.x;
    g.w = a.w;
    g.y = a.y;
    g.n_tokens = a.n_tokens;
    g.n_in = a.n_in;
    g.n_out = a.n_out;
    g.wtype = a.wtype;
    g.gemv_rows = a.gemv_rows;
    ops::matmul_glu(b.dev, enc, g);
  });
  const bool gemv = n_tokens == 1;
  const std::string shape = num(n_out) + "x" + num(n_in);
  const std::string kernel =
      std::string(v.glu ? "gemv_swiglu_" : gemv ? "gemv_" : "gemm_") + ops::weight_type_name(t);
  const double flops = 2.0 * n_tokens * w_rows * n_in;
  const uint64_t read = gemv ? n_tokens * w_bytes : ops::matmul_weight_bytes_read(b.dev, args[0]);
  b.add({kernel + "_" + shape + (gemv ? "" : "_t" + num(n_tokens)) + variant_suffix(v),
         {{"n_out", double(n_out)},
          {"n_in", double(n_in)},
          {"n_tokens", double(n_tokens)},
          {"gemv_rows", double(v.gemv_rows)},
          {"weight_read_MB", double(read) / 1e6},
          {"TFLOP_per_s", flops / (time.us * 1e-6) / 1e12}},
         "",
         {{"op", v.glu ? "gemv_glu" : gemv ? "gemv" : "gemm"}, {"kernel", kernel}, {"dtype", ops::weight_type_name(t)},
          {"shape", shape + "_t" + num(n_tokens)}, {"variant", variant_suffix(v)}}},
        time, double(w_bytes + x_bytes + y_bytes * (v.accumulate ? 2 : 1) + bias_bytes), sets);
}

// ---- the grids -------------------------------------------------------------------
struct Grid {
  std::vector<AttnShape> decode;
  std::vector<uint32_t> chunk_sweep;   // split_chunks tried on the sweep shapes
  std::vector<AttnShape> sweep;        // decode shapes that also get the chunk sweep
  std::vector<AttnShape> prefill;
  uint32_t prefill_queries = 512;
  std::vector<std::array<uint32_t, 2>> gemv;                  // (n_out, n_in)
  std::vector<std::array<uint32_t, 3>> gemm;                  // (n_out, n_in, n_tokens)
  std::vector<std::array<uint32_t, 2>> glu;                   // gemv_swiglu: (n_out of each half, n_in)
};

// Llama-3-8B: 32 query heads, 8 KV heads, D = 128; q/o 4096x4096, gate/up
// 14336x4096, down 4096x14336, lm_head 128256x4096.
Grid gpu_grid(bool quick) {
  Grid g;
  for (uint32_t n : {4096u, 32768u, 131072u}) g.sweep.push_back({128, 32, 8, n});
  g.chunk_sweep = {16, 33, 49, 66, 99, 132, 264};  // 33/66: 132 SMs x 2 or 4 threadgroups over 8 KV heads, 49/99: x 3 or 6
  if (quick) {
    g.decode = g.sweep;
    g.prefill = {{128, 32, 8, 4096}};
    g.gemv = {{4096, 4096}, {14336, 4096}};
    g.glu = {{14336, 4096}};
    g.gemm = {{4096, 4096, 64}};
    return g;
  }
  // The whole grid: ~150 rows, well under a minute on an H200 (the long single passes dominate).
  for (uint32_t d : {64u, 128u, 256u})
    for (uint32_t group : {1u, 4u, 8u})
      for (uint32_t n : {1024u, 4096u, 16384u, 32768u, 131072u}) g.decode.push_back({d, 32, 32 / group, n});
  for (uint32_t n : {512u, 4096u, 32768u}) g.prefill.push_back({128, 32, 8, n});
  g.prefill.push_back({64, 32, 8, 4096});
  g.prefill.push_back({256, 32, 8, 4096});
  g.gemv = {{4096, 4096}, {14336, 4096}, {4096, 14336}, {128256, 4096}};
  g.glu = {{14336, 4096}};
  for (uint32_t t : {64u, 512u, 4096u})
    for (const auto& s : g.gemv)  // prefill runs lm_head on 1 token; 4096 tokens on the issue 32 shapes
      if ((t == 64 || s[0] != 128256) && (t != 4096 || s[1] == 4096)) g.gemm.push_back({s[0], s[1], t});
  return g;
}

// The host executor runs each GPU thread as a fiber: small shapes only.
Grid host_grid() {
  Grid g;
  g.decode = {{64, 8, 2, 256}, {128, 8, 8, 1024}};
  g.sweep = {{128, 8, 2, 1024}};
  g.chunk_sweep = {4};
  g.prefill = {{64, 8, 2, 128}};
  g.prefill_queries = 32;
  g.gemv = {{256, 256}};
  g.glu = {{128, 256}};
  g.gemm = {{128, 256, 32}};
  return g;
}

// One benchmark of the group: its Bench on ctx's device, the case list of the
// device's grid, each case guarded so that one failure costs one row.
std::vector<Result> run_group(const Context& ctx, const std::function<void(Bench&, const Grid&)>& cases) {
  const bool host = ctx.is_host();
  if (!host) {
    // Kernel times want plain launches: a captured graph's cost grows with R and
    // biases (t(2R) - t(R)) / R. Off unless asked for (read when the queue is made).
    const char* graphs = std::getenv("METALKV_CUDA_GRAPHS");
    if (!graphs || !*graphs) setenv("METALKV_CUDA_GRAPHS", "0", 1);
    else if (std::strcmp(graphs, "0") != 0)
      std::fprintf(stderr, "metalkv-bench: METALKV_CUDA_GRAPHS=%s: every command buffer is captured as a graph, "
                           "whose cost grows with R and biases (t(2R) - t(R)) / R; unset it for kernel times\n",
                   graphs);
  }
  Bench b{*ctx.device, ctx.device->new_command_queue(), {}, host ? uint64_t(64) << 20 : uint64_t(8) << 30, {}};
  b.plan.repeat = ctx.repeat;
  b.plan.target_ms = host ? 5.0 : 3.0;
  b.plan.max_calls = host ? 8 : 512;
  cases(b, host ? host_grid() : gpu_grid(ctx.quick));
  const std::string note = host ? "host executor: small shapes (a smoke test)" : ctx.device->name();
  for (Result& r : b.out)
    if (r.note.empty()) r.note = note;
  return std::move(b.out);
}

template <class F>
void guarded(Bench& b, const std::string& name, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    b.failed(name, e);
  }
}

bool same_shape(const AttnShape& a, const AttnShape& b) {
  return a.head_dim == b.head_dim && a.n_q == b.n_q && a.n_kv == b.n_kv && a.n_tokens == b.n_tokens;
}

std::vector<Result> decode_group(const Context& ctx) {
  return run_group(ctx, [](Bench& b, const Grid& g) {
    guarded(b, "dispatch_floor", [&] { dispatch_floor(b); });
    std::vector<AttnShape> shapes = g.decode;
    for (const AttnShape& w : g.sweep) {
      bool listed = false;
      for (const AttnShape& s : shapes) listed |= same_shape(s, w);
      if (!listed) shapes.push_back(w);
    }
    for (const AttnShape& s : shapes) {
      bool swept = false;
      for (const AttnShape& w : g.sweep) swept |= same_shape(s, w);
      guarded(b, "attn_decode_" + attn_shape_name(s),
              [&] { decode_attention(b, s, swept ? g.chunk_sweep : std::vector<uint32_t>{}); });
    }
  });
}

std::vector<Result> prefill_group(const Context& ctx) {
  return run_group(ctx, [](Bench& b, const Grid& g) {
    for (const AttnShape& s : g.prefill) {
      const uint32_t n = std::min(g.prefill_queries, s.n_tokens);
      guarded(b, "attn_prefill_" + attn_shape_name(s) + "_q" + num(n), [&] { prefill_attention(b, s, n); });
    }
  });
}

std::vector<Result> linear_group(const Context& ctx) {
  return run_group(ctx, [](Bench& b, const Grid& g) {
    const std::vector<WeightType> types = {WeightType::f32,  WeightType::f16,  WeightType::bf16, WeightType::q8_0,
                                           WeightType::q4_0, WeightType::q4_1, WeightType::q5_0, WeightType::q5_1,
                                           WeightType::q4_k, WeightType::q5_k, WeightType::q6_k};
    for (WeightType t : types) {
      const std::string type = ops::weight_type_name(t);
      auto run = [&](uint32_t n_out, uint32_t n_in, uint32_t n_tokens, const LinearVariant& v) {
        guarded(b, type + "_" + num(n_out) + "x" + num(n_in) + "_t" + num(n_tokens) + variant_suffix(v) +
                       (v.glu ? "_glu" : ""),
                [&] { linear(b, t, n_out, n_in, n_tokens, v); });
      };
      for (const auto& s : g.gemv) {
        run(s[0], s[1], 1, {});
        // The GPU widths side by side (a device with one best width, the host, runs it: no sweep there).
        if (!b.dev.properties().gemv_rows)
          for (uint32_t rows : {1u, 2u, 4u}) run(s[0], s[1], 1, {rows});
      }
      // The fused epilogues and the GLU gemv on the first shape (Llama's o_proj + residual,
      // Qwen's biased q/k/v, gate+up of 14336 each).
      if (!g.gemv.empty()) {
        run(g.gemv[0][0], g.gemv[0][1], 1, {0, true, false, false});
        run(g.gemv[0][0], g.gemv[0][1], 1, {0, false, true, false});
      }
      for (const auto& s : g.glu) run(s[0], s[1], 1, {0, false, false, true});
      for (const auto& s : g.gemm) run(s[0], s[1], s[2], {});
    }
    if (!g.gemv.empty()) guarded(b, "rms_norm_f32", [&] { rms_norm_row(b, g.gemv[0][1]); });
  });
}

// Three groups so that a script can run (and time out) them apart; --filter
// gpu_kernels runs all three, in this order.
MKV_BENCH("gpu_kernels_decode",
          "per-call GPU time, bytes, GB/s: decode attention (single, split-K, automatic, a chunk sweep) and the "
          "dispatch floor",
          decode_group);
MKV_BENCH("gpu_kernels_prefill", "per-call GPU time, bytes, GB/s, TFLOP/s: prefill attention (a 512-query chunk)",
          prefill_group);
MKV_BENCH("gpu_kernels_linear",
          "per-call GPU time, bytes, GB/s: gemv and gemm for every weight format (Llama-3-8B shapes on a GPU)",
          linear_group);

}  // namespace
}  // namespace mkv::bench
