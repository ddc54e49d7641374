// metalkv._core.ops.quantize: float weights -> GGUF Q8_0 / Q4_0 blocks on the
// host (cpp/ops/quantize.h), for the loader's quantize-at-load and for tests.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <string>
#include <vector>

#include "bindings.h"
#include "ops/ops.h"
#include "ops/quantize.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace mkv::bindings {
namespace {

using Floats = nb::ndarray<nb::ro, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

// float32 -> f32, float16 -> f16, uint16 -> bf16 (its bit patterns, as the loaders hold it).
ops::WeightType source_type(const Floats& data) {
  const nb::dlpack::dtype t = data.dtype();
  if (t == nb::dtype<float>()) return ops::WeightType::f32;
  if (t == nb::dtype<uint16_t>()) return ops::WeightType::bf16;
  if (t.code == uint8_t(nb::dlpack::dtype_code::Float) && t.bits == 16 && t.lanes == 1)
    return ops::WeightType::f16;
  ops::fail("quantize", "data must be float32, float16 or uint16 (bfloat16 bit patterns), got a dtype of code " +
                            std::to_string(t.code) + " and " + std::to_string(t.bits) + " bits");
}

nb::object quantize(const Floats& data, const std::string& wtype) {
  ops::QuantizeArgs a;
  a.dst_type = ops::parse_weight_type(wtype, "quantize");
  a.src_type = source_type(data);
  a.rows = data.shape(0);
  if (data.shape(1) > UINT32_MAX) ops::fail("quantize", "more than 2^32 - 1 columns");
  a.cols = uint32_t(data.shape(1));
  a.src = data.data();
  a.dst_bytes = ops::quantized_bytes(a.src_type, a.dst_type, a.rows, a.cols);
  auto* out = new std::vector<uint8_t>(a.dst_bytes);
  nb::capsule owner(out, [](void* p) noexcept { delete static_cast<std::vector<uint8_t>*>(p); });
  a.dst = out->data();
  {
    nb::gil_scoped_release release;
    ops::quantize(a);
  }
  const size_t shape[2] = {size_t(a.rows), a.dst_bytes / size_t(a.rows)};
  return nb::cast(nb::ndarray<nb::numpy, uint8_t, nb::ndim<2>>(out->data(), 2, shape, owner));
}

void bind_quantize(nb::module_&, nb::module_& ops) {
  ops.def("quantize", &quantize, "data"_a, "wtype"_a,
          "GGUF blocks (rows, bytes per row) uint8 of data (rows, cols): float32, float16, or uint16\n"
          "holding bfloat16 bit patterns; wtype 'q8_0' or 'q4_0'; cols a multiple of 32. Byte for byte\n"
          "what ggml's reference quantizers and gguf-py's gguf.quants.quantize write from the same\n"
          "float32 values. Multi-threaded over rows, with the GIL released.");
}

}  // namespace

MKV_BINDING(quantize, bind_quantize);

}  // namespace mkv::bindings
