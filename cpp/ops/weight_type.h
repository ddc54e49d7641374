// The weight formats the kernels read (metal/quant.h): names, block sizes and
// the byte size of a matrix, from one table (weight_type.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mkv::ops {

// How a weight matrix is stored: row-major (rows, cols), quantized along rows.
enum class WeightType { f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k };

// "f32" | "f16" | "bf16" | "q8_0" | ... | "q6_k" (weight_type_name's spelling, which is
// gguf's lower-cased type name); anything else raises "[op] unknown ...".
WeightType parse_weight_type(const std::string& name, const char* op);
const char* weight_type_name(WeightType t);  // the kernel-name suffix, e.g. "q4_1"
// Every name parse_weight_type takes, in enum order (metalkv._core.ops.weight_types()).
std::vector<std::string> weight_type_names();
bool is_quantized(WeightType t);             // a GGUF block format (not f32/f16/bf16)
// What a row length must be a multiple of: the block (32; 256 for the K-quants)
// for quantized types, 4 (one vector load) for f32/f16/bf16.
uint32_t weight_row_multiple(WeightType t);
// Whether the device layout differs from the file's: Q8_0, Q4_0, Q4_1, Q5_0,
// Q5_1 and Q6_K rows are packed into planes at load (ops/weight_pack.h).
bool is_packed(WeightType t);
// Offset alignment the kernels' loads need: 16 (f32: float4; the quantized
// types: 16-byte quant loads), 8 (f16/bf16: 4 x 16 bits).
size_t weight_align(WeightType t);

// Bytes of a (rows, cols) matrix as the kernels read it (packed rows padded to
// mkv_params::kPackedRowAlign) and as a GGUF file stores it (blocks back to
// back); the same for the types that are not packed. Both raise if cols is not
// a positive multiple of weight_row_multiple(t).
size_t weight_bytes(WeightType t, uint64_t rows, uint32_t cols, const char* op);
size_t file_weight_bytes(WeightType t, uint64_t rows, uint32_t cols, const char* op);

}  // namespace mkv::ops
