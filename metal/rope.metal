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
  const uint pairs = p.rotary_dim / 2;
  const uint pos = positions[t];
  device float* row = x + t * p.n_heads * p.head_dim;
  for (uint j = tid; j < p.n_heads * pairs; j += nt) {
    const uint h = j / pairs;
    const uint i = j - h * pairs;
    device float* head = row + h * p.head_dim;
    const uint2 e = mkv_rope::pair_elements<S>(i, p.rotary_dim);
    const float2 r = mkv_rope::rotate(head[e.x], head[e.y], pos, inv_freq[i]);
    head[e.x] = r.x;
    head[e.y] = r.y;
  }
}

MKV_KERNEL("rope_f32_neox", rope_f32<mkv_rope::kStyleNeox>)
MKV_KERNEL("rope_f32_interleaved", rope_f32<mkv_rope::kStyleInterleaved>)
