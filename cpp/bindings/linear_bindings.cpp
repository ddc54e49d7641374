// metalkv._core.ops entry points for the linear and elementwise kernels: one
// call encodes one op into a fresh command buffer and waits. For tests and
// tools; the model encodes the same ops (cpp/ops) into its own command buffers.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <tuple>

#include "bindings.h"
#include "ops/elementwise.h"
#include "ops/linear.h"
#include "ops/weight_pack.h"
#include "ops/weight_type.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace mkv::bindings {
namespace {

using gpu::BufferPtr;
using ops::BufferView;

ops::MatmulKernel parse_kernel(const std::string& name) {
  if (name == "auto") return ops::MatmulKernel::automatic;
  if (name == "gemv") return ops::MatmulKernel::gemv;
  if (name == "gemm") return ops::MatmulKernel::gemm;
  if (name == "gemm_gpu") return ops::MatmulKernel::gemm_gpu;
  if (name == "gemm_host") return ops::MatmulKernel::gemm_host;
  if (name == "gemm_mma") return ops::MatmulKernel::gemm_mma;
  ops::fail("matmul", "unknown kernel '" + name +
                          "'; expected 'auto', 'gemv', 'gemm', 'gemm_gpu', 'gemm_host' or 'gemm_mma'");
}

ops::MatmulActivation parse_activation(const std::string& name) {
  if (name == "none") return ops::MatmulActivation::none;
  if (name == "gelu_tanh") return ops::MatmulActivation::gelu_tanh;
  ops::fail("matmul", "unknown activation '" + name + "'; expected 'none' or 'gelu_tanh'");
}

// The ids come from Python here, so unlike the kernel (which writes zeros) we
// can say which one is out of range.
void check_ids(const BufferPtr& ids, uint32_t n_tokens, uint32_t vocab) {
  if (!ids || ids->length() < size_t(n_tokens) * 4) return;  // ops::embedding reports it
  std::vector<int32_t> p(n_tokens);
  ids->read(0, p.data(), p.size() * sizeof(int32_t));
  for (uint32_t t = 0; t < n_tokens; ++t)
    if (p[t] < 0 || uint32_t(p[t]) >= vocab)
      ops::fail("embedding", "token id " + std::to_string(p[t]) + " at position " +
                                 std::to_string(t) + " is outside [0, " + std::to_string(vocab) + ")");
}

using FileRows = nb::ndarray<nb::ro, uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

// The kernels' bytes of a (rows, cols) matrix given as the file's: uint8 (rows, bytes per row).
nb::object pack_weights(const std::string& wtype, FileRows file, uint32_t cols) {
  const ops::WeightType t = ops::parse_weight_type(wtype, "pack_weights");
  const uint64_t rows = file.shape(0);
  const size_t want = ops::file_weight_bytes(t, rows, cols, "pack_weights");
  if (file.nbytes() != want)
    ops::fail("pack_weights", std::to_string(file.nbytes()) + " bytes for " + std::to_string(rows) + " rows of " +
                                  std::to_string(cols) + " " + wtype + " weights; expected " + std::to_string(want));
  auto* out = new std::vector<uint8_t>(ops::weight_bytes(t, rows, cols, "pack_weights"));
  {
    nb::gil_scoped_release release;
    ops::pack_weights(t, rows, cols, file.data(), out->data());
  }
  nb::capsule owner(out, [](void* p) noexcept { delete static_cast<std::vector<uint8_t>*>(p); });
  const size_t shape[2] = {size_t(rows), rows ? out->size() / rows : 0};
  return nb::cast(nb::ndarray<nb::numpy, uint8_t, nb::ndim<2>>(out->data(), 2, shape, owner));
}

void bind_linear(nb::module_&, nb::module_& m) {
  m.def(
      "gemv_tokens", [](PyDevice& d, uint32_t n_tokens) { return ops::gemv_tokens(*d.device, n_tokens); },
      "device"_a, "n_tokens"_a,
      "Tokens one threadgroup of the device's gemv computes per weight pass for n_tokens tokens (1 for one):\n"
      "a batched decode step reads each weight ceil(n / gemv_tokens) times.");
  m.def("weight_types", &ops::weight_type_names,
        "The weight types the kernels read (matmul's wtype; gguf's lower-cased names).");
  m.def("pack_weights", &pack_weights, "wtype"_a, "file_rows"_a, nb::kw_only(), "cols"_a,
        "The bytes the kernels read for a (rows, cols) matrix stored as in a GGUF file (file_rows:\n"
        "uint8 (rows, bytes per row)): uint8 (rows, device bytes per row). q8_0, q4_0, q4_1, q5_0,\n"
        "q5_1 and q6_k rows are packed field by field and zero-padded to 16 bytes\n"
        "(metal/linear_params.h); the other types come back unchanged. The engine does this at load;\n"
        "matmul and embedding read what it returns.");
  m.def(
      "matmul",
      [](PyDevice& d, const BufferPtr& x, const BufferPtr& w, const BufferPtr& y, uint32_t n_tokens,
         uint32_t n_in, uint32_t n_out, const std::string& wtype, const BufferPtr& bias,
         const std::string& kernel, bool accumulate, uint32_t gemv_rows, uint32_t gemv_tokens,
         std::optional<std::tuple<uint32_t, uint32_t>> split, const BufferPtr& y2, const BufferPtr& y3,
         bool activations_16bit, const std::string& activation, bool split_f16) {
        ops::MatmulArgs a;
        a.x = {x};
        a.w = {w};
        a.y = {y};
        a.bias = {bias};
        a.n_tokens = n_tokens;
        a.n_in = n_in;
        a.n_out = n_out;
        a.wtype = ops::parse_weight_type(wtype, "matmul");
        a.kernel = parse_kernel(kernel);
        a.accumulate = accumulate;
        a.gemv_rows = gemv_rows;
        a.gemv_tokens = gemv_tokens;
        a.activations_16bit = activations_16bit;
        a.activation = parse_activation(activation);
        a.split_f16 = split_f16;
        if (split) {
          std::tie(a.split_a, a.split_b) = *split;
          if (a.split_a == 0) ops::fail("matmul", "split=(split_a, split_b) needs split_a > 0");
          a.y2 = {y2};
          a.y3 = {y3};
        }
        run_compute(d, [&](gpu::ComputeEncoder& enc) { ops::matmul(*d.device, enc, a); });
      },
      "device"_a, "x"_a, "w"_a, "y"_a, nb::kw_only(), "n_tokens"_a, "n_in"_a, "n_out"_a, "wtype"_a,
      "bias"_a.none() = nb::none(), "kernel"_a = "auto", "accumulate"_a = false, "gemv_rows"_a = 0,
      "gemv_tokens"_a = 0, "split"_a = nb::none(), "y2"_a.none() = nb::none(), "y3"_a.none() = nb::none(),
      "activations_16bit"_a = false, "activation"_a = "none", "split_f16"_a = false,
      "y (n_tokens, n_out) = x (n_tokens, n_in) · wᵀ (+ bias), float32 activations;\n"
      "activation 'gelu_tanh' puts that through gelu_tanh (gelu's function) in the same pass;\n"
      "with accumulate, y += that (a residual add in the same pass).\n"
      "w is (n_out, n_in) row-major in wtype, as pack_weights returns it: 'f32', 'f16', 'bf16' (n_in a\n"
      "multiple of 4), the GGUF\n"
      "blocks 'q8_0', 'q4_0', 'q4_1', 'q5_0', 'q5_1' (n_in a multiple of 32) or the K-quants 'q4_k',\n"
      "'q5_k', 'q6_k' (n_in a multiple of 256). kernel: 'auto' (gemv for one token, else gemm),\n"
      "'gemv', 'gemm' (the device's shape), 'gemm_gpu' (the GPU's SIMD shape, on any device), 'gemm_host'\n"
      "(the host executor's; bit-identical to 'gemm_gpu') or 'gemm_mma' (simdgroup_matrix, on any device;\n"
      "bit-identical to 'gemm_gpu' on the host and the cuda device). gemv_rows: rows per SIMD-group of gemv, 0 for the device's choice\n"
      "(GPUs: 2, or 1 for f32/f16/bf16 when 2 would not fill the device; the host executor: 32,\n"
      "8 for f16), or 1 / 2 / 4 (the GPU shapes) / 8 / 32 to run that variant. gemv_tokens: tokens a\n"
      "threadgroup computes with one weight pass, 0 for the device's choice (1 for one token; else 8 on\n"
      "the host executor with rows 8 or 32, 4 on GPUs with rows 1 or 2); every token's outputs are\n"
      "bit-identical whatever it is. split=(split_a, split_b) with y2, y3 (gemm kernels): w stacks three\n"
      "matrices (q, k, v) and y takes columns [0, split_a), y2 [split_a, split_b), y3 the rest, each\n"
      "(n_tokens, its columns); split_f16: y2 and y3 take f16 rows, each value rounded once (not with\n"
      "accumulate). activations_16bit (f16, bf16 weights): where the gemm runs on matrix units\n"
      "('gemm' on a device that has them, or 'gemm_mma'), x is rounded to the weights' type in the tile.");

  m.def(
      "matmul_glu",
      [](PyDevice& d, const BufferPtr& x, const BufferPtr& w, const BufferPtr& y, uint32_t n_tokens,
         uint32_t n_in, uint32_t n_out, const std::string& wtype, const std::string& act,
         uint32_t gemv_rows, uint32_t gemv_tokens, const std::string& kernel) {
        ops::GluArgs a;
        a.x = {x};
        a.w = {w};
        a.y = {y};
        a.n_tokens = n_tokens;
        a.n_in = n_in;
        a.n_out = n_out;
        a.wtype = ops::parse_weight_type(wtype, "matmul_glu");
        if (act != "silu" && act != "gelu_tanh")
          ops::fail("matmul_glu", "unknown activation '" + act + "'; expected 'silu' or 'gelu_tanh'");
        a.act = act == "silu" ? ops::GluActivation::silu : ops::GluActivation::gelu_tanh;
        a.gemv_rows = gemv_rows;
        a.gemv_tokens = gemv_tokens;
        a.kernel = parse_kernel(kernel);
        run_compute(d, [&](gpu::ComputeEncoder& enc) { ops::matmul_glu(*d.device, enc, a); });
      },
      "device"_a, "x"_a, "w"_a, "y"_a, nb::kw_only(), "n_tokens"_a, "n_in"_a, "n_out"_a, "wtype"_a,
      "act"_a = "silu", "gemv_rows"_a = 0, "gemv_tokens"_a = 0, "kernel"_a = "auto",
      "y (n_tokens, n_out) = act(x · w[:n_out]ᵀ) * (x · w[n_out:]ᵀ): w is the (2 n_out, n_in)\n"
      "stack of the gate and up matrices in wtype; act 'silu' (SwiGLU) or 'gelu_tanh' (GeGLU).\n"
      "gemv_rows and gemv_tokens as in matmul. kernel: 'auto' or 'gemv' (the fused gemv: decode), or\n"
      "a gemm shape as in matmul (prefill: the gemm with the GLU in its epilogue).");

  m.def(
      "embedding",
      [](PyDevice& d, const BufferPtr& table, const BufferPtr& ids, const BufferPtr& out,
         uint32_t n_tokens, uint32_t dim, uint32_t vocab, const std::string& ttype, float scale) {
        const ops::WeightType t = ops::parse_weight_type(ttype, "embedding");
        check_ids(ids, n_tokens, vocab);
        run_compute(d, [&](gpu::ComputeEncoder& enc) {
          ops::embedding(*d.device, enc, {table}, t, {ids}, {out}, n_tokens, dim, vocab, scale);
        });
      },
      "device"_a, "table"_a, "ids"_a, "out"_a, nb::kw_only(), "n_tokens"_a, "dim"_a, "vocab"_a,
      "ttype"_a, "scale"_a = 1.0f,
      "out (n_tokens, dim) float32 = table[ids] * scale; table (vocab, dim) in ttype, ids int32.");

  m.def(
      "rms_norm",
      [](PyDevice& d, const BufferPtr& x, const BufferPtr& w, const BufferPtr& out, uint32_t n_rows,
         uint32_t dim, float eps, const std::string& wtype, float w_offset) {
        const ops::WeightType t = ops::parse_weight_type(wtype, "rms_norm");
        run_compute(d, [&](gpu::ComputeEncoder& enc) {
          ops::rms_norm(*d.device, enc, {x}, {w}, t, {out}, n_rows, dim, eps, w_offset);
        });
      },
      "device"_a, "x"_a, "w"_a, "out"_a, nb::kw_only(), "n_rows"_a, "dim"_a, "eps"_a,
      "wtype"_a = "f32", "w_offset"_a = 0.0f,
      "out = x / sqrt(mean(x², row) + eps) * (w_offset + w) over (n_rows, dim); out may be x.\n"
      "w_offset=1 gives Gemma's (1 + w). w is 'f32' or 'f16'.");

  m.def(
      "add",
      [](PyDevice& d, const BufferPtr& y, const BufferPtr& x, uint32_t n) {
        run_compute(d, [&](gpu::ComputeEncoder& enc) { ops::add(*d.device, enc, {y}, {x}, n); });
      },
      "device"_a, "y"_a, "x"_a, nb::kw_only(), "n"_a, "y[:n] += x[:n] (float32).");

  m.def(
      "scale",
      [](PyDevice& d, const BufferPtr& y, uint32_t n, float s) {
        run_compute(d, [&](gpu::ComputeEncoder& enc) { ops::scale(*d.device, enc, {y}, n, s); });
      },
      "device"_a, "y"_a, nb::kw_only(), "n"_a, "s"_a, "y[:n] *= s (float32).");

  m.def(
      "softcap",
      [](PyDevice& d, const BufferPtr& y, uint32_t n, float cap) {
        run_compute(d, [&](gpu::ComputeEncoder& enc) { ops::softcap(*d.device, enc, {y}, n, cap); });
      },
      "device"_a, "y"_a, nb::kw_only(), "n"_a, "cap"_a, "y[:n] = cap * tanh(y[:n] / cap) (float32).");

  m.def(
      "swiglu",
      [](PyDevice& d, const BufferPtr& gate, const BufferPtr& up, const BufferPtr& out, uint32_t n) {
        run_compute(d, [&](gpu::ComputeEncoder& enc) {
          ops::swiglu(*d.device, enc, {gate}, {up}, {out}, n);
        });
      },
      "device"_a, "gate"_a, "up"_a, "out"_a, nb::kw_only(), "n"_a,
      "out[:n] = silu(gate) * up (float32); out may be gate or up.");

  m.def(
      "geglu",
      [](PyDevice& d, const BufferPtr& gate, const BufferPtr& up, const BufferPtr& out, uint32_t n) {
        run_compute(d, [&](gpu::ComputeEncoder& enc) {
          ops::geglu(*d.device, enc, {gate}, {up}, {out}, n);
        });
      },
      "device"_a, "gate"_a, "up"_a, "out"_a, nb::kw_only(), "n"_a,
      "out[:n] = gelu_pytorch_tanh(gate) * up (float32); out may be gate or up.");

  m.def(
      "argmax",
      [](PyDevice& d, const BufferPtr& x, const BufferPtr& out, uint32_t n_rows, uint32_t n, const BufferPtr& mask) {
        run_compute(d, [&](gpu::ComputeEncoder& enc) {
          ops::argmax(*d.device, enc, {x}, {out}, n_rows, n, {mask, 0});
        });
      },
      "device"_a, "x"_a, "out"_a, nb::kw_only(), "n_rows"_a, "n"_a, "mask"_a.none() = nb::none(),
      "out[r] (int32) = lowest index of the largest value of x (n_rows, n) float32; NaNs are "
      "never chosen. mask (one row): only the ids whose bit is set (bit i % 32 of uint32 word i / 32).");

  m.def(
      "softmax",
      [](PyDevice& d, const BufferPtr& x, const BufferPtr& out, uint32_t n_rows, uint32_t n,
         float scale) {
        run_compute(d, [&](gpu::ComputeEncoder& enc) {
          ops::softmax(*d.device, enc, {x}, {out}, n_rows, n, scale);
        });
      },
      "device"_a, "x"_a, "out"_a, nb::kw_only(), "n_rows"_a, "n"_a, "scale"_a = 1.0f,
      "out = softmax(x * scale) over each row of x (n_rows, n) float32; out may be x.");
}

}  // namespace

MKV_BINDING(linear, bind_linear);

}  // namespace mkv::bindings
