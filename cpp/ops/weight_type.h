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
// Offset alignment the kernels' loads need: 16 (f32: float4; Q4_K, Q5_K: 16-byte
// quant loads), 8 (f16/bf16: 4 x 16 bits; Q5_1), 4 (Q4_1), 2 (the other blocks).
size_t weight_align(WeightType t);

// Bytes of a (rows, cols) matrix; raises if cols is not a positive multiple of
// weight_row_multiple(t).
size_t weight_bytes(WeightType t, uint64_t rows, uint32_t cols, const char* op);

}  // namespace mkv::ops
