// The narrow interface between kernel code (compiled from .metal through the
// prelude) and the host executor. Kernel code calls these from inside a fiber.
//
// Deliberately free of standard headers that declare math functions: kernels
// say `using namespace metal;` and unqualified exp(x) must stay unambiguous.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mkv::host {

// Where a collective or barrier was called. A default-constructed SourceLoc
// used as a default argument captures the caller's file and line (g++ and
// clang evaluate __builtin_FILE/LINE in default arguments at the call site);
// #line directives from the kernel pass make these name the .metal source.
struct SourceLoc {
  const char* file;
  int line;
  SourceLoc(const char* f = __builtin_FILE(), int l = __builtin_LINE()) : file(f), line(l) {}
};

enum class Collective : uint8_t {
  threadgroup_barrier,
  simdgroup_barrier,
  simd_sum,
  simd_product,
  simd_max,
  simd_min,
  simd_and,
  simd_or,
  simd_xor,
  simd_prefix_inclusive_sum,
  simd_prefix_exclusive_sum,
  simd_prefix_inclusive_product,
  simd_prefix_exclusive_product,
  simd_shuffle,
  simd_shuffle_xor,
  simd_shuffle_up,
  simd_shuffle_down,
  simd_broadcast,
  simd_broadcast_first,
  simd_all,
  simd_any,
  simd_ballot,
  simd_is_first,
  simdgroup_multiply_accumulate,  // <metal_simdgroup_matrix> (simdgroup_multiply too)
};
const char* collective_name(Collective op);

constexpr int kSimdWidth = 32;

// What the last lane to arrive at a SIMD collective sees: every lane's input,
// argument and output slot. `active` has a bit per lane that is live (arrived);
// exited lanes are inactive, as on a GPU after an early return.
struct LaneSlots {
  const void* in[kSimdWidth];
  void* out[kSimdWidth];
  uint32_t arg[kSimdWidth];
  uint32_t active;
  // Set by a combine function that read a lane it must not: the lane that
  // read, and the inactive lane it read from.
  int bad_reader;
  int bad_source;
};
using CombineFn = void (*)(LaneSlots& slots);

// Blocks the calling lane until all live lanes of its SIMD-group (barrier and
// simdgroup_barrier: threadgroup or simdgroup) have arrived at the same call;
// the last arrival runs `combine` once for all. Never returns on a validation
// error: the threadgroup is abandoned and the error reported by the dispatch.
void collective(Collective op, CombineFn combine, const void* in, void* out, uint32_t arg,
                SourceLoc loc);

// Storage for a `threadgroup` variable declared in a kernel body: one copy per
// threadgroup, keyed by declaration site, poisoned before first use.
void* threadgroup_variable(const void* site, size_t size, size_t align);

// The calling lane's index in its SIMD-group (thread_index_in_simdgroup), for
// prelude functions whose result depends on it (simdgroup_matrix's layout).
uint32_t current_simd_lane();

// Raised from kernel code for a misuse the prelude detects (never returns).
[[noreturn]] void kernel_error(const char* message, SourceLoc loc);

}  // namespace mkv::host
