// Position -> slot through a sequence's block table (metal/kv_params.h): the
// one place kernels turn a token position into a row of a layer's pool.
#pragma once

#include "mkv_kernel.h"  // metal_stdlib, using namespace metal
#include "kv_params.h"

// table: one uint per logical block of kKvBlockTokens positions, the physical
// block holding them. Only entries of positions the caller may see are read.
inline uint kv_slot(const device uint* table, uint pos) {
  constexpr uint B = mkv_params::kKvBlockTokens;
  return table[pos / B] * B + pos % B;
}
