// RoPE: the standalone Q-rope op (metal/rope.metal), the rope description the
// K store shares (RopeSpec), and host helpers computing inv_freq tables; and
// the other rotation of heads, the rotated KV cache's Hadamard transform
// (metal/hadamard.metal).
//
// A frequency table is all that distinguishes default, linear-scaled and
// Llama-3-scaled RoPE, so kernels take inv_freq as a (rotary_dim/2) float
// buffer and never see a scaling type. See metal/rope.h for the math and
// docs/KV_CACHE.md for the two styles.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/ops.h"

namespace mkv::ops {

enum class RopeStyle : uint32_t {
  neox = 1,         // pairs (i, i + rotary_dim/2): HF transformers' rotate_half
  interleaved = 2,  // pairs (2i, 2i + 1): llama.cpp LLAMA ("normal") on GGUF weights
};

// "neox" or "interleaved"; anything else raises GpuError naming both.
RopeStyle parse_rope_style(const std::string& name);
const char* rope_style_name(RopeStyle style);

// How to rotate: the first rotary_dim dims of every head are rotated, the rest
// untouched; inv_freq holds rotary_dim/2 floats.
struct RopeSpec {
  RopeStyle style = RopeStyle::neox;
  uint32_t rotary_dim = 0;  // even, 2..head_dim
  BufferView inv_freq;      // (rotary_dim / 2) float
};

// Raises GpuError "[op] ..." unless rotary_dim is even, in [2, head_dim], and
// inv_freq holds rotary_dim/2 floats.
void check_rope(const char* op, const RopeSpec& rope, uint32_t head_dim);

struct RopeDesc {
  uint32_t n_tokens = 0;
  uint32_t n_heads = 0;
  uint32_t head_dim = 0;
};

// x (n_tokens, n_heads, head_dim) float, rotated in place; positions
// (n_tokens) uint32. Kernel rope_f32_<style>.
void rope(gpu::Device& dev, gpu::ComputeEncoder& enc, const BufferView& x,
          const BufferView& positions, const RopeSpec& rope, const RopeDesc& desc);

// x (n_rows, n_heads, head_dim) float, every head rotated in place by the
// orthonormal Hadamard transform (metal/hadamard.h; its own inverse), as a
// rotated KV cache stores K, V and the queries: applied to attention's output
// it undoes V's rotation. head_dim a power of two. Kernel hadamard_f32.
void hadamard(gpu::Device& dev, gpu::ComputeEncoder& enc, const BufferView& x, uint32_t n_rows, uint32_t n_heads,
              uint32_t head_dim);
// Whether head_dim can be rotated (a power of two, 2..256 elements a threadgroup can hold).
bool hadamard_fits(uint32_t head_dim);

// inv_freq[i] = base^(-2i/rotary_dim), i < rotary_dim/2, evaluated in float32
// in the order HF transformers does (_compute_default_rope_parameters).
std::vector<float> rope_inv_freq_default(uint32_t rotary_dim, float base);

// Llama 3.1 scaling (transformers' _compute_llama3_parameters, in float32):
// wavelengths longer than original_max_position_embeddings / low_freq_factor
// are slowed by `factor`, shorter than .../high_freq_factor kept, and the band
// between interpolated smoothly.
struct Llama3RopeScaling {
  float factor = 8.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  uint32_t original_max_position_embeddings = 8192;
};
std::vector<float> rope_inv_freq_llama3(uint32_t rotary_dim, float base,
                                        const Llama3RopeScaling& scaling);

// Every kernel name rope and hadamard build (tests/gpu/test_kernel_names.py).
std::vector<std::string> rope_kernel_names();

}  // namespace mkv::ops
