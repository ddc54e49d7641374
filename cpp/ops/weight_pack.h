// GGUF blocks to the rows the kernels read (metal/linear_params.h, "Packed
// rows"): for the types with is_packed(t), each row's blocks are rewritten
// field by field and the row padded with zeros to kPackedRowAlign bytes; the
// other types are copied as they are. Nothing is lost: pack is a permutation
// of the file's bytes plus zero padding.
#pragma once

#include <cstdint>

#include "ops/weight_type.h"

namespace mkv::ops {

// src: file_weight_bytes(t, rows, cols) bytes; dst: weight_bytes(t, rows, cols).
// Raises (through weight_bytes) on a row length the type cannot hold.
void pack_weights(WeightType t, uint64_t rows, uint32_t cols, const void* src, void* dst);

}  // namespace mkv::ops
