// Argument structs of the executor test kernels (metal/test/*.metal).
#pragma once

#include "../shared_params.h"

namespace mkv_test {

struct Reduce {
  uint32_t n;       // elements in the input
  uint32_t chunk;   // elements each threadgroup sums
};

// A struct larger than what the broken-binding test binds.
struct Wide {
  float values[8];
};

}  // namespace mkv_test
