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

// simdgroup_matrix.metal's simdgroup_load4 (metal/simdgroup_tile.h): the tile's
// elements a row, the 2 x 2 group's steps, whether fragments are read
// transposed, and where in the tile the group starts (elements).
struct SgLoad4 {
  uint32_t elements_per_row, step1, step2, transpose, start;
};

// A struct larger than what the broken-binding test binds.
struct Wide {
  float values[8];
};

}  // namespace mkv_test
