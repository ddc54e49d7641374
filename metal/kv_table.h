// Position -> slot through a sequence's block table (metal/kv_params.h): the
// one place kernels turn a token position into a row of a layer's pool.
#pragma once

#include "mkv_kernel.h"  // metal_stdlib, using namespace metal
#include "kv_params.h"

// table: one uint per logical block of kKvBlockTokens positions, the physical
// block holding them. Only entries of positions the caller may see are read.
inline uint kv_block(uint pos) { return pos / mkv_params::kKvBlockTokens; }
// The slot of pos inside the physical block `entry` (= table[kv_block(pos)]).
inline uint kv_slot_in(uint entry, uint pos) {
  return entry * mkv_params::kKvBlockTokens + pos % mkv_params::kKvBlockTokens;
}
inline uint kv_slot(const device uint* table, uint pos) { return kv_slot_in(table[kv_block(pos)], pos); }
