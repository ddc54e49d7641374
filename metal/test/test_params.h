// Argument structs of the executor test kernels (metal/test/*.metal).
#pragma once

#include "../shared_params.h"

namespace mkv_test {

struct Reduce {
  uint32_t n;       // elements in the input
  uint32_t chunk;   // elements each threadgroup sums
};

// simdgroup_matrix.metal's product: leading dimensions (elements a row),
// block origins (column, row), transposes (0/1), 8-wide k tiles, and whether the
// first tile adds C (simdgroup_multiply_accumulate) or starts from zero with C
// loaded and dropped (simdgroup_multiply).
struct SgMatrix {
  uint32_t lda, ldb, ldc, ldd;
  uint32_t a_x, a_y, b_x, b_y, d_x, d_y;
  uint32_t ta, tb, td;
  uint32_t k_tiles;
  uint32_t accumulate;
};

// A struct larger than what the broken-binding test binds.
struct Wide {
  float values[8];
};

}  // namespace mkv_test
