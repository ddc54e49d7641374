// Argument structs shared by the kernels (MSL) and the C++ ops that bind them.
// One struct per kernel family; sizes are static_asserted on the C++ side so a
// field added on one side only fails the build.
#pragma once

#ifndef __METAL_VERSION__
#include <cstdint>
#endif

namespace mkv_params {

// gemv_*: y[rows] = W[rows, cols] · x[cols]; W row-major.
struct Gemv {
  uint32_t rows;
  uint32_t cols;
};

}  // namespace mkv_params

#ifndef __METAL_VERSION__
static_assert(sizeof(mkv_params::Gemv) == 8, "Gemv params layout");
#endif
