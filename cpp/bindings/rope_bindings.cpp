// The rotation ops for tests and tools: metalkv._core.ops.rope, hadamard,
// rope_inv_freq_default and rope_inv_freq_llama3 (cpp/ops/rope.h).
#include <nanobind/nanobind.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "ops/rope.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace mkv::bindings {
namespace {

void bind_rope(nb::module_&, nb::module_& ops_m) {
  ops_m.def(
      "rope",
      [](PyDevice& dev, const gpu::BufferPtr& x, const gpu::BufferPtr& positions, const gpu::BufferPtr& inv_freq,
         uint32_t n_tokens, uint32_t n_heads, uint32_t head_dim, uint32_t rotary_dim, const std::string& style) {
        ops::RopeSpec spec{ops::parse_rope_style(style), rotary_dim ? rotary_dim : head_dim, {inv_freq, 0}};
        run_compute(dev, [&](gpu::ComputeEncoder& enc) {
          ops::rope(*dev.device, enc, {x, 0}, {positions, 0}, spec, {n_tokens, n_heads, head_dim});
        });
      },
      "device"_a, "x"_a, "positions"_a, "inv_freq"_a, nb::kw_only(), "n_tokens"_a, "n_heads"_a, "head_dim"_a,
      "rotary_dim"_a = 0, "style"_a = "neox",
      "Rotates x (n_tokens, n_heads, head_dim) float32 in place; positions (n_tokens) uint32; "
      "inv_freq (rotary_dim/2) float32; rotary_dim 0 = head_dim.");
  ops_m.def(
      "hadamard",
      [](PyDevice& dev, const gpu::BufferPtr& x, uint32_t n_rows, uint32_t n_heads, uint32_t head_dim) {
        run_compute(dev, [&](gpu::ComputeEncoder& enc) { ops::hadamard(*dev.device, enc, {x, 0}, n_rows, n_heads, head_dim); });
      },
      "device"_a, "x"_a, nb::kw_only(), "n_rows"_a, "n_heads"_a, "head_dim"_a,
      "Rotates every head of x (n_rows, n_heads, head_dim) float32 in place by the orthonormal Hadamard transform "
      "(its own inverse): what a rotated KV cache applies to K, V, the queries and attention's output.");
  ops_m.def("rope_inv_freq_default", &ops::rope_inv_freq_default, "rotary_dim"_a, "base"_a,
            "inv_freq[i] = base^(-2i/rotary_dim) in float32, as HF transformers computes it.");
  ops_m.def(
      "rope_inv_freq_llama3",
      [](uint32_t rotary_dim, float base, float factor, float low_freq_factor, float high_freq_factor,
         uint32_t original_max_position_embeddings) {
        return ops::rope_inv_freq_llama3(
            rotary_dim, base, {factor, low_freq_factor, high_freq_factor, original_max_position_embeddings});
      },
      "rotary_dim"_a, "base"_a, nb::kw_only(), "factor"_a = 8.0f, "low_freq_factor"_a = 1.0f,
      "high_freq_factor"_a = 4.0f, "original_max_position_embeddings"_a = 8192,
      "Llama 3.1 scaled inv_freq (transformers' _compute_llama3_parameters, float32).");
}

}  // namespace

MKV_BINDING(rope, bind_rope);

}  // namespace mkv::bindings
