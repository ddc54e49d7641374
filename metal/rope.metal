// Standalone RoPE for Q: rotates x (n_tokens, n_heads, head_dim) float in
// place, token t at position positions[t]; dims past rotary_dim are untouched.
// The math (and the two styles) lives in rope.h, shared with the K store.
//
// Names: rope_f32_neox, rope_f32_interleaved.
#include "mkv_kernel.h"
#include "kv_params.h"
#include "rope.h"

// One threadgroup per token; its threads stride over the token's
// n_heads * rotary_dim/2 pairs. Each pair is read and written by one thread,
// so rotating in place needs no barrier.
template <mkv_rope::Style S>
MKV_MAX_THREADS(256) [[kernel]] void rope_f32(constant mkv_params::Rope& p [[buffer(0)]],
                     device float* x [[buffer(1)]],                // (n_tokens, n_heads, head_dim)
                     const device uint* positions [[buffer(2)]],   // (n_tokens)
                     const device float* inv_freq [[buffer(3)]],   // (rotary_dim / 2)
                     uint t [[threadgroup_position_in_grid]],
                     uint tid [[thread_index_in_threadgroup]],
                     uint nt [[threads_per_threadgroup]]) {
  device float* row = x + t * p.n_heads * p.head_dim;
  mkv_rope::rotate_heads<S>(row, p.n_heads, p.head_dim, p.rotary_dim, positions[t], inv_freq, tid, nt);
}

MKV_KERNEL("rope_f32_neox", rope_f32<mkv_rope::kStyleNeox>)
MKV_KERNEL("rope_f32_interleaved", rope_f32<mkv_rope::kStyleInterleaved>)
