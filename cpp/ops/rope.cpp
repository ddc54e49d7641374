// RoPE op (rope_f32_<style>) and the inv_freq table helpers.
#include "ops/rope.h"

#include <algorithm>
#include <cmath>

#include "metal/kv_params.h"
#include "ops/launch.h"

namespace mkv::ops {
namespace {

constexpr const char* kHadamardKernel = "hadamard_f32";
std::string rope_kernel(RopeStyle style) { return std::string("rope_f32_") + rope_style_name(style); }

constexpr const char* kOp = "rope";

}  // namespace

bool hadamard_fits(uint32_t head_dim) { return head_dim >= 2 && head_dim <= 256 && (head_dim & (head_dim - 1)) == 0; }

void hadamard(gpu::Device& dev, gpu::ComputeEncoder& enc, const BufferView& x, uint32_t n_rows, uint32_t n_heads,
              uint32_t head_dim) {
  const char* op = "hadamard";
  if (n_rows == 0 || n_heads == 0) fail(op, "n_rows and n_heads must be positive");
  if (!hadamard_fits(head_dim))
    fail(op, "head_dim " + std::to_string(head_dim) + " is not a power of two up to 256");
  const uint64_t elems = uint64_t(n_rows) * n_heads * head_dim;
  if (elems >= (uint64_t(1) << 32)) fail(op, "x has more than 2^32 elements; split the call");
  check_bytes(op, "x (n_rows, n_heads, head_dim) float", x, elems * 4);
  enc.set_pipeline(dev.pipeline(kHadamardKernel));
  const mkv_params::Hadamard p{n_rows, n_heads, head_dim};
  bind_params(enc, p, 0);
  bind(enc, x, 1);
  enc.dispatch_threadgroups({n_rows, 1, 1}, {strided_threads(dev, uint64_t(n_heads) * head_dim / 2), 1, 1});
}

RopeStyle parse_rope_style(const std::string& name) {
  if (name == "neox") return RopeStyle::neox;
  if (name == "interleaved") return RopeStyle::interleaved;
  fail(kOp, "unknown style '" + name +
                "'; expected 'neox' (half-split pairs (i, i+rotary_dim/2), HF rotate_half) or "
                "'interleaved' (pairs (2i, 2i+1), llama.cpp LLAMA on GGUF weights)");
}

const char* rope_style_name(RopeStyle style) {
  return style == RopeStyle::neox ? "neox" : "interleaved";
}

void check_rope(const char* op, const RopeSpec& rope, uint32_t head_dim) {
  if (rope.style != RopeStyle::neox && rope.style != RopeStyle::interleaved)
    fail(op, "rope style " + std::to_string(uint32_t(rope.style)) + " is not neox (1) or interleaved (2)");
  if (rope.rotary_dim < 2 || rope.rotary_dim % 2 != 0 || rope.rotary_dim > head_dim)
    fail(op, "rotary_dim " + std::to_string(rope.rotary_dim) +
                 " must be even and between 2 and head_dim " + std::to_string(head_dim));
  check_bytes(op, "inv_freq (rotary_dim/2 floats)", rope.inv_freq, uint64_t(rope.rotary_dim / 2) * 4);
}

void rope(gpu::Device& dev, gpu::ComputeEncoder& enc, const BufferView& x,
          const BufferView& positions, const RopeSpec& spec, const RopeDesc& d) {
  // 1. check the arguments
  if (d.n_tokens == 0 || d.n_heads == 0 || d.head_dim == 0)
    fail(kOp, "n_tokens, n_heads and head_dim must be positive (got " + std::to_string(d.n_tokens) +
                  ", " + std::to_string(d.n_heads) + ", " + std::to_string(d.head_dim) + ")");
  check_rope(kOp, spec, d.head_dim);
  const uint64_t elems = uint64_t(d.n_tokens) * d.n_heads * d.head_dim;
  if (elems >= (uint64_t(1) << 32)) fail(kOp, "x has more than 2^32 elements; split the call");
  check_bytes(kOp, "x (n_tokens, n_heads, head_dim) float", x, elems * 4);
  check_bytes(kOp, "positions (n_tokens) uint32", positions, uint64_t(d.n_tokens) * 4);

  // 2. get the kernel and bind its arguments
  enc.set_pipeline(dev.pipeline(rope_kernel(spec.style)));
  const mkv_params::Rope p{d.n_tokens, d.n_heads, d.head_dim, spec.rotary_dim};
  bind_params(enc, p, 0);
  bind(enc, x, 1);
  bind(enc, positions, 2);
  bind(enc, spec.inv_freq, 3);

  // 3. one threadgroup per token, threads over its n_heads * rotary_dim/2 pairs
  const uint64_t pairs = uint64_t(d.n_heads) * (spec.rotary_dim / 2);
  enc.dispatch_threadgroups({d.n_tokens, 1, 1}, {strided_threads(dev, pairs), 1, 1});
}

std::vector<float> rope_inv_freq_default(uint32_t rotary_dim, float base) {
  if (rotary_dim < 2 || rotary_dim % 2 != 0)
    fail("rope_inv_freq", "rotary_dim " + std::to_string(rotary_dim) + " must be even and >= 2");
  if (!(base > 1.0f)) fail("rope_inv_freq", "base " + std::to_string(base) + " must be > 1");
  std::vector<float> inv(rotary_dim / 2);
  for (uint32_t i = 0; i < inv.size(); ++i)  // 1 / base^(2i / dim), each step rounded to float
    inv[i] = 1.0f / std::pow(base, float(2 * i) / float(rotary_dim));
  return inv;
}

std::vector<float> rope_inv_freq_llama3(uint32_t rotary_dim, float base, const Llama3RopeScaling& s) {
  const char* op = "rope_inv_freq_llama3";
  if (!(s.factor > 0.0f)) fail(op, "factor must be > 0, got " + std::to_string(s.factor));
  if (!(s.low_freq_factor > 0.0f) || !(s.high_freq_factor > s.low_freq_factor))
    fail(op, "need 0 < low_freq_factor < high_freq_factor, got " + std::to_string(s.low_freq_factor) +
                 " and " + std::to_string(s.high_freq_factor));
  if (s.original_max_position_embeddings == 0) fail(op, "original_max_position_embeddings must be > 0");
  std::vector<float> inv = rope_inv_freq_default(rotary_dim, base);
  const float old_len = float(s.original_max_position_embeddings);
  const float low_freq_wavelen = old_len / s.low_freq_factor;
  const float high_freq_wavelen = old_len / s.high_freq_factor;
  for (float& f : inv) {
    const float wavelen = float(2.0 * M_PI) / f;
    if (wavelen < high_freq_wavelen) continue;  // high frequencies: unchanged
    if (wavelen > low_freq_wavelen) {           // low frequencies: slowed by factor
      f = f / s.factor;
      continue;
    }
    // The band between: interpolate between f / factor and f.
    const float smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
    f = (1.0f - smooth) * f / s.factor + smooth * f;
  }
  return inv;
}

std::vector<std::string> rope_kernel_names() {
  return {kHadamardKernel, rope_kernel(RopeStyle::neox), rope_kernel(RopeStyle::interleaved)};
}

}  // namespace mkv::ops
