// Host quantizer: float weights (f32, f16, bf16) into the GGUF blocks the
// kernels read, at load time. Bit for bit what ggml's reference quantizers
// write (ggml-quants.c quantize_row_q8_0_ref / quantize_row_q4_0_ref) and what
// gguf-py's gguf.quants.quantize writes from the same float32 values:
//
//   Q8_0 block (34 bytes): d = amax / 127 (f16), q[j] = roundf(x[j] / d) (int8)
//   Q4_0 block (18 bytes): max = the value of largest magnitude (signed, the first
//                          such), d = max / -8 (f16), q[j] = min(15, trunc(x[j] / d + 8.5));
//                          byte j holds q[j] (low nibble) and q[j + 16] (high)
//
// where x / d is x * (1 / d) in float32, as both references compute it. Rows are
// split over std::thread workers (hardware_concurrency); runs on the CPU only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ops/weight_type.h"

namespace mkv::ops {

struct QuantizeArgs {
  const void* src = nullptr;   // (rows, cols) row-major, in src_type
  WeightType src_type = WeightType::f32;  // f32 | f16 | bf16 (bf16: its 16-bit patterns)
  uint64_t rows = 0;
  uint32_t cols = 0;           // a positive multiple of 32 (one block)
  WeightType dst_type = WeightType::q8_0;  // q8_0 | q4_0
  void* dst = nullptr;         // (rows, file_weight_bytes(dst_type, 1, cols)) bytes: GGUF blocks
  size_t dst_bytes = 0;        // must be file_weight_bytes(dst_type, rows, cols)
  unsigned threads = 0;        // 0: std::thread::hardware_concurrency()
};

// The bytes quantize writes for (rows, cols) of src_type as dst_type. Raises
// "[quantize] ..." (ops::fail) for a source or destination type it does not
// convert between, no rows, or a row length that is not a whole number of blocks.
size_t quantized_bytes(WeightType src_type, WeightType dst_type, uint64_t rows, uint32_t cols);

// Checks as quantized_bytes, and that dst_bytes is that size; then fills dst.
void quantize(const QuantizeArgs& a);

}  // namespace mkv::ops
