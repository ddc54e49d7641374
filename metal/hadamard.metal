// The Hadamard rotation of hadamard.h as a kernel of its own: what a rotated
// KV cache's attention output needs to come back (o = H (H o)).
//
// Name: hadamard_f32.
#include "mkv_kernel.h"
#include "kv_params.h"
#include "hadamard.h"

// One threadgroup per row of n_heads heads; its threads take the butterflies.
MKV_MAX_THREADS(256) [[kernel]] void hadamard_f32(constant mkv_params::Hadamard& p [[buffer(0)]],
                         device float* x [[buffer(1)]],  // (n_rows, n_heads, head_dim)
                         uint t [[threadgroup_position_in_grid]],
                         uint tid [[thread_index_in_threadgroup]],
                         uint nt [[threads_per_threadgroup]]) {
  mkv_hadamard::rotate_heads(x + t * p.n_heads * p.head_dim, p.n_heads, p.head_dim, tid, nt);
}
