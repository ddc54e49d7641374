// What the three prefill gemm shapes (gemm.h, gemm_host.h, gemm_mma.h) share:
// which weight row each of a tile's kGemmRows rows reads, where an output goes
// (one buffer, or three with kMatmulSplit), and the GLU epilogue.
//
// A plain tile covers kGemmRows outputs, its row r reading weight row n0 + r.
// A GLU tile (p.flags has kMatmulSwiglu or kMatmulGeglu; the weight is the
// stacked [W_gate; W_up], 2 n_out rows) covers kGemmRows / 2 outputs: rows
// r < 32 read gate row n0 + r, rows r >= 32 the matching up row n_out + n0 + r - 32,
// and output n0 + j is act(sum of row j) * (sum of row 32 + j): the same floats
// as two gemms and swiglu_f32 / geglu_f32. Rows past the outputs re-read the
// last row of their half; their sums are never stored.
#pragma once

#include "mkv_kernel.h"
#include "activation.h"
#include "linear_params.h"
#include "matmul_out.h"

inline bool gemm_glu(constant mkv_params::Matmul& p) {
  return (p.flags & (mkv_params::kMatmulSwiglu | mkv_params::kMatmulGeglu)) != 0;
}

// Outputs one tile covers: kGemmRows, or half as many for a GLU.
inline uint gemm_tile_outputs(constant mkv_params::Matmul& p) {
  return gemm_glu(p) ? mkv_params::kGemmRows / 2 : mkv_params::kGemmRows;
}

// The weight row that row r (< kGemmRows) of column tile tx reads.
inline ulong gemm_weight_row(constant mkv_params::Matmul& p, uint tx, uint r) {
  constexpr uint H = mkv_params::kGemmRows / 2;
  if (!gemm_glu(p)) return min(tx * mkv_params::kGemmRows + r, p.n_out - 1);
  const uint n = min(tx * H + r % H, p.n_out - 1);
  return r < H ? ulong(n) : ulong(p.n_out) + n;
}

// act(gate) * up, act as the flags say.
inline float gemm_glu_value(constant mkv_params::Matmul& p, float gate, float up) {
  return ((p.flags & mkv_params::kMatmulSwiglu) ? ActSilu::apply(gate) : ActGeluTanh::apply(gate)) * up;
}

// Where output (t, n) goes: y (n_tokens, n_out), or with kMatmulSplit the
// column's own buffer, each token-major with its own width.
inline device float& gemm_out(constant mkv_params::Matmul& p, device float* y, device float* y2, device float* y3,
                              uint t, uint n) {
  if ((p.flags & mkv_params::kMatmulSplit) == 0) return y[ulong(t) * p.n_out + n];
  if (n < p.split_a) return y[ulong(t) * p.split_a + n];
  if (n < p.split_b) return y2[ulong(t) * (p.split_b - p.split_a) + (n - p.split_a)];
  return y3[ulong(t) * (p.n_out - p.split_b) + (n - p.split_b)];
}

// Output (t, n) of a gemm from its sum: matmul_out.h's epilogue into gemm_out's
// place, or with kMatmulSplitF16 rounded to half into y2's or y3's f16 row.
inline void gemm_put(constant mkv_params::Matmul& p, const device float* bias, device float* y, device float* y2,
                     device float* y3, uint t, uint n, float sum) {
  if ((p.flags & mkv_params::kMatmulSplitF16) != 0 && n >= p.split_a) {
    const bool third = n >= p.split_b;
    const uint first = third ? p.split_b : p.split_a, width = (third ? p.n_out : p.split_b) - first;
    ((device half*)(third ? y3 : y2))[ulong(t) * width + (n - first)] = half(matmul_value(p, bias, n, sum));
    return;
  }
  matmul_put(p, bias, n, sum, gemm_out(p, y, y2, y3, t, n));
}
