// Where a lane's two elements sit in an 8x8 simdgroup_matrix, for kernels that
// touch thread_elements() directly (the attention's softmax on its score
// fragments). Every device gives a lane two adjacent columns of one row, the
// four lanes of a row differing in two lane bits; which lanes, the device says:
// - Apple GPUs (MLX's layout) and the host executor, which follows them:
//   row 4 b4 + 2 b2 + b1, columns 4 b3 + 2 b0 and + 1 (b_i: lane bit i); a row's
//   lanes differ in bits 0 and 3.
// - The CUDA device: mma.sync's accumulator layout, row lane / 4, columns
//   2 (lane % 4) and + 1; a row's lanes differ in bits 0 and 1 (its prelude,
//   docs/CUDA.md "simdgroup_matrix"). The device reports it as
//   DeviceProperties::matrix_layout.
#pragma once

#if defined(__METALKV_CUDA__)
inline uint fragment_row(uint lane) { return lane >> 2; }
inline uint fragment_col(uint lane) { return (lane & 3u) * 2; }
constant constexpr ushort kFragmentRowXor = 2;  // a row's lanes: xor 1 and xor this
#else
inline uint fragment_row(uint lane) { return ((lane >> 4) & 1u) * 4 + ((lane >> 2) & 1u) * 2 + ((lane >> 1) & 1u); }
inline uint fragment_col(uint lane) { return ((lane >> 3) & 1u) * 4 + (lane & 1u) * 2; }
constant constexpr ushort kFragmentRowXor = 8;
#endif
