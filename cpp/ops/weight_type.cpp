// Weight formats: one table of names and block sizes (metal/linear_params.h
// has the byte sizes the kernels static_assert against ggml's structs).
#include "ops/weight_type.h"

#include "metal/linear_params.h"
#include "ops/ops.h"

namespace mkv::ops {
namespace {

// One row per WeightType, in enum order: the name (kernel suffix, gguf's
// lower-cased type name), weights per block (1: a float type), bytes per block.
struct FormatInfo {
  WeightType type;
  const char* name;
  uint32_t block;
  uint32_t block_bytes;
};
constexpr FormatInfo kFormats[] = {
    {WeightType::f32, "f32", 1, 4},
    {WeightType::f16, "f16", 1, 2},
    {WeightType::bf16, "bf16", 1, 2},
    {WeightType::q8_0, "q8_0", mkv_params::kQuantBlock, mkv_params::kQ8_0BlockBytes},
    {WeightType::q4_0, "q4_0", mkv_params::kQuantBlock, mkv_params::kQ4_0BlockBytes},
    {WeightType::q4_1, "q4_1", mkv_params::kQuantBlock, mkv_params::kQ4_1BlockBytes},
    {WeightType::q5_0, "q5_0", mkv_params::kQuantBlock, mkv_params::kQ5_0BlockBytes},
    {WeightType::q5_1, "q5_1", mkv_params::kQuantBlock, mkv_params::kQ5_1BlockBytes},
    {WeightType::q4_k, "q4_k", mkv_params::kSuperBlock, mkv_params::kQ4_KBlockBytes},
    {WeightType::q5_k, "q5_k", mkv_params::kSuperBlock, mkv_params::kQ5_KBlockBytes},
    {WeightType::q6_k, "q6_k", mkv_params::kSuperBlock, mkv_params::kQ6_KBlockBytes},
};
constexpr size_t kNumFormats = sizeof(kFormats) / sizeof(kFormats[0]);
static_assert(kNumFormats == size_t(WeightType::q6_k) + 1, "one kFormats row per WeightType");

constexpr bool formats_in_enum_order() {
  for (size_t i = 0; i < kNumFormats; ++i)
    if (size_t(kFormats[i].type) != i) return false;
  return true;
}
static_assert(formats_in_enum_order(), "kFormats rows must follow WeightType's order");

const FormatInfo& info(WeightType t) { return kFormats[size_t(t)]; }

}  // namespace

WeightType parse_weight_type(const std::string& name, const char* op) {
  for (const FormatInfo& f : kFormats)
    if (name == f.name) return f.type;
  std::string expected;
  for (size_t i = 0; i < kNumFormats; ++i)
    expected += std::string(i == 0 ? "" : i + 1 == kNumFormats ? " or " : ", ") + "'" + kFormats[i].name + "'";
  fail(op, "unknown weight type '" + name + "'; expected " + expected);
}

const char* weight_type_name(WeightType t) { return info(t).name; }

std::vector<std::string> weight_type_names() {
  std::vector<std::string> names;
  for (const FormatInfo& f : kFormats) names.emplace_back(f.name);
  return names;
}

bool is_quantized(WeightType t) { return info(t).block > 1; }

uint32_t weight_row_multiple(WeightType t) { return is_quantized(t) ? info(t).block : 4u; }

bool is_packed(WeightType t) {
  switch (t) {
    case WeightType::q8_0:
    case WeightType::q4_0:
    case WeightType::q4_1:
    case WeightType::q5_0:
    case WeightType::q5_1:
    case WeightType::q6_k: return true;
    default: return false;
  }
}

// What the kernels' loads need of a row's start (metal/quant.h): a float4, a
// half4; every quantized format loads its quants 16 bytes at a time (Q4_K and
// Q5_K blocks are multiples of 16 bytes, the packed rows are padded to one).
size_t weight_align(WeightType t) {
  switch (t) {
    case WeightType::f16:
    case WeightType::bf16: return 8;
    default: return 16;
  }
}

namespace {

// The bytes of one row of `cols` weights in the file; raises on a bad length.
size_t file_row_bytes(WeightType t, uint32_t cols, const char* op) {
  const FormatInfo& f = info(t);
  const uint32_t multiple = weight_row_multiple(t);
  if (cols == 0 || cols % multiple != 0) {
    const std::string why = !is_quantized(t) ? "rows are read 4 at a time"
                            : f.block == mkv_params::kQuantBlock
                                ? "GGUF blocks hold 32 weights"
                                : "GGUF K-quant super-blocks hold 256 weights";
    fail(op, std::string(f.name) + " weights need a row length that is a positive multiple of " +
                 std::to_string(multiple) + ", got " + std::to_string(cols) + " (" + why + ")");
  }
  return size_t(cols / f.block) * f.block_bytes;
}

}  // namespace

size_t weight_bytes(WeightType t, uint64_t rows, uint32_t cols, const char* op) {
  const size_t row = file_row_bytes(t, cols, op);
  constexpr size_t a = mkv_params::kPackedRowAlign;
  return rows * (is_packed(t) ? (row + a - 1) / a * a : row);
}

size_t file_weight_bytes(WeightType t, uint64_t rows, uint32_t cols, const char* op) {
  return rows * file_row_bytes(t, cols, op);
}

}  // namespace mkv::ops
