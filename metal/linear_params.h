// Argument structs of the transformer's non-attention kernels (matmul.metal,
// elementwise.metal), shared by the kernels (MSL) and the C++ ops that bind
// them (cpp/ops/linear.cpp, cpp/ops/elementwise.cpp). Sizes are
// static_asserted on the C++ side so a field added on one side fails the build.
#pragma once

#include "shared_params.h"

namespace mkv_params {

// GGUF block formats (see metal/quant.h), quantized along a row (in_features);
// a row holds a whole number of blocks.
MKV_CONSTANT uint32_t kQuantBlock = 32;       // weights per block of Q8_0, Q4_0, Q4_1, Q5_0, Q5_1
MKV_CONSTANT uint32_t kQ8_0BlockBytes = 34;   // half d; int8 qs[32]
MKV_CONSTANT uint32_t kQ4_0BlockBytes = 18;   // half d; uint8 qs[16]
MKV_CONSTANT uint32_t kQ4_1BlockBytes = 20;   // half d; half m; uint8 qs[16]
MKV_CONSTANT uint32_t kQ5_0BlockBytes = 22;   // half d; uint8 qh[4]; uint8 qs[16]
MKV_CONSTANT uint32_t kQ5_1BlockBytes = 24;   // half d; half m; uint8 qh[4]; uint8 qs[16]
MKV_CONSTANT uint32_t kSuperBlock = 256;      // weights per super-block of Q4_K, Q5_K, Q6_K (ggml's QK_K)
MKV_CONSTANT uint32_t kQ4_KBlockBytes = 144;  // half d, dmin; uint8 scales[12]; uint8 qs[128]
MKV_CONSTANT uint32_t kQ5_KBlockBytes = 176;  // half d, dmin; uint8 scales[12]; uint8 qh[32]; uint8 qs[128]
MKV_CONSTANT uint32_t kQ6_KBlockBytes = 210;  // uint8 ql[128]; uint8 qh[64]; int8 scales[16]; half d

// Packed rows (written by cpp/ops/weight_pack.cpp at load, read by metal/quant.h).
// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and Q6_K blocks are 34, 18, 20, 22, 24 and 210
// bytes, so in a GGUF file their quants are only 2-, 4- or 8-byte aligned and
// load in pieces. On the device each row of nb blocks is stored field by field
// ("planes"): field f of block b at nb·plane(f) + b·size(f), the quants first;
// rows are zero-padded to a multiple of kPackedRowAlign bytes, so every quant
// (and Q5 high-bit) plane is 16-byte aligned and loads 16 bytes at a time.
// Q4_K and Q5_K (144 and 176 bytes, quants 16-byte aligned) stay as in the file.
MKV_CONSTANT uint32_t kPackedRowAlign = 16;
MKV_CONSTANT uint32_t kQ8_0PlaneD = 32;        // qs[32] at 0; d at 32·nb
MKV_CONSTANT uint32_t kQ4_0PlaneD = 16;        // qs[16] at 0; d at 16·nb
MKV_CONSTANT uint32_t kQ4_1PlaneDm = 16;       // qs[16] at 0; (d, m) at 16·nb
MKV_CONSTANT uint32_t kQ5_0PlaneQh = 16;       // qs[16] at 0; qh[4] at 16·nb; ...
MKV_CONSTANT uint32_t kQ5_0PlaneD = 20;        // ... d at 20·nb
MKV_CONSTANT uint32_t kQ5_1PlaneQh = 16;       // qs[16] at 0; qh[4] at 16·nb; ...
MKV_CONSTANT uint32_t kQ5_1PlaneDm = 20;       // ... (d, m) at 20·nb
MKV_CONSTANT uint32_t kQ6_KPlaneQh = 128;      // ql[128] at 0; qh[64] at 128·nb; ...
MKV_CONSTANT uint32_t kQ6_KPlaneScales = 192;  // ... scales[16] at 192·nb; ...
MKV_CONSTANT uint32_t kQ6_KPlaneD = 208;       // ... d at 208·nb

// Kernel geometry the ops must dispatch with (matmul.metal, elementwise.metal).
// gemv: R output rows per SIMD-group, kGemvSimds SIMD-groups per threadgroup.
// GPUs run R = 1, 2 or 4 (cpp/ops/linear.cpp: gemv_rows picks it from the
// device's wave); the host executor, where every lane is a fiber that costs its
// setup and switches whatever it does, runs fewer lanes with more rows:
MKV_CONSTANT uint32_t kGemvRows = 8;           // gemv_<fmt>: 8 rows, simd_sum (a host variant, no longer its pick)
MKV_CONSTANT uint32_t kGemvRowsWide = 32;      // gemv_<fmt>_r32: 32 rows, 1 SIMD-group, a row a lane (gemv.h
                                               // gemv_lanes: no simd_sum; the host's shape for every format)
MKV_CONSTANT uint32_t kGemvRowsMaxGpu = 4;     // gemv_<fmt>_r1, _r2, _r4: the GPU shapes ...
MKV_CONSTANT uint32_t kGemvRowsDefaultGpu = 2; // ... of which gemv_rows() picks 1 or 2 (r4: a bench variant)
MKV_CONSTANT uint32_t kGemvSimds = 2;          // SIMD-groups per threadgroup (all shapes but _r32)
MKV_CONSTANT uint32_t kGemvSimdsWide = 1;      // _r32
MKV_CONSTANT uint32_t kGemvUnroll = 4;         // GPU shapes: chunks per lane per loop step (f32/f16/bf16) ...
MKV_CONSTANT uint32_t kGemvUnrollQuant = 2;    // ... and of 16-weight quantized chunks (register budget)
MKV_CONSTANT uint32_t kGemvTokensHost = 8;    // several-token gemv (a batched decode step): tokens per
MKV_CONSTANT uint32_t kGemvTokensGpu = 4;     // threadgroup row on the host / on GPUs (registers: 4 x R x chunk)
MKV_CONSTANT uint32_t kGemmDecodeRowsHost = 4;   // DeviceProperties::gemm_decode_rows: measured (docs/BATCHING.md)
MKV_CONSTANT uint32_t kGemmDecodeRowsApple = 8;  // matrix units; llama.cpp's mul_mm threshold, unmeasured here
MKV_CONSTANT uint32_t kGemmTokens = 32;        // gemm: a threadgroup's tile of Y is kGemmTokens ...
MKV_CONSTANT uint32_t kGemmRows = 64;          // ... x kGemmRows
MKV_CONSTANT uint32_t kGemmK = 64;             // gemm: inputs per step (two 32-blocks, a quarter super-block)
MKV_CONSTANT uint32_t kGemmThreads = 64;       // gemm: threads per threadgroup (8 tokens x 4 rows each)
MKV_CONSTANT uint32_t kGemmHostRows = 8;       // gemm_<fmt>_h (the host's shape): rows a lane, all 32 tokens ...
MKV_CONSTANT uint32_t kGemmHostThreads = kGemmRows / kGemmHostRows;  // ... so 8 lanes a tile (gemm_host.h)
MKV_CONSTANT uint32_t kGemmMmaK = 32;          // gemm_mma_<fmt> (simdgroup_matrix): inputs per step, one 32-block ...
MKV_CONSTANT uint32_t kGemmMmaThreads = 64;    // ... 2 SIMD-groups a tile, each 32 tokens x 32 rows (gemm_mma.h)
MKV_CONSTANT uint32_t kGemm16Tokens = 128;     // gemm_mma_<fmt>_x16 (16-bit operands): a tile of kGemm16Tokens ...
MKV_CONSTANT uint32_t kGemm16Rows = 128;       // ... x kGemm16Rows outputs, kGemmMmaK inputs a step, ...
MKV_CONSTANT uint32_t kGemm16Threads = 512;    // ... 16 SIMD-groups of 32 x 32 (gemm_mma16.h), ...
MKV_CONSTANT uint32_t kGemm16Depth = 4;        // ... with the fetches of 4 steps in flight (H100: 7 % over 2)
MKV_CONSTANT uint32_t kElementThreads = 256;   // add/scale/swiglu/geglu: threads per threadgroup ...
MKV_CONSTANT uint32_t kElementsPerThread = 8;  // ... each handling 8 elements
MKV_CONSTANT uint32_t kRmsNormSimds = 8;       // rms_norm: at most this many SIMD-groups on a row
MKV_CONSTANT uint32_t kRmsNormLaneElems = 16;  // ... GPUs: one more per 32·16 elements of the row
MKV_CONSTANT uint32_t kRmsNormVec = 8;         // rms_norm_*'s register path: float4s a thread holds
MKV_CONSTANT uint32_t kEmbeddingThreads = 64;  // embedding: threads per token
MKV_CONSTANT uint32_t kRowSimds = 8;           // argmax (host), softmax: SIMD-groups per row
MKV_CONSTANT uint32_t kArgmaxSimds = 32;       // argmax on GPUs: at most this many (1024 threads)

// gemv_* / gemm_*: y = X · Wᵀ (+ bias), or y += X · Wᵀ (+ bias) (accumulate).
//   W (n_out, n_in) row-major in the kernel's weight format
//   X (n_tokens, n_in) float, y (n_tokens, n_out) float, bias (n_out) float.
// gemv_swiglu_* / gemv_geglu_*: y = act(X · W_gateᵀ) * (X · W_upᵀ), W the
//   (2 n_out, n_in) stack [W_gate; W_up]; flags 0.
MKV_CONSTANT uint32_t kMatmulBias = 1;        // add bias; without it the bias buffer is a placeholder, not read
MKV_CONSTANT uint32_t kMatmulAccumulate = 2;  // add to y's contents (a fused residual add)
// gemm_* over a stacked [W_gate; W_up] (2 n_out rows): y = act(X · W_gateᵀ) * (X · W_upᵀ)
// with act silu or gelu_tanh (activation.h); a tile's 64 rows are 32 gate rows and the
// same 32 up rows (gemm_common.h). Neither bias nor accumulate with these.
MKV_CONSTANT uint32_t kMatmulSwiglu = 4;
MKV_CONSTANT uint32_t kMatmulGeglu = 8;
// gemm_* over stacked matrices whose outputs go to three token-major buffers
// (q, k and v from one [W_q; W_k; W_v]): columns [0, split_a) to y (buffer 3),
// [split_a, split_b) to y2 (buffer 5), [split_b, n_out) to y3 (buffer 6).
MKV_CONSTANT uint32_t kMatmulSplit = 16;
// y = gelu_tanh(X · Wᵀ + bias) (activation.h), then the accumulate if set: the
// towers' MLP up projection and its activation in one pass (every gemv and gemm).
MKV_CONSTANT uint32_t kMatmulGelu = 32;
// With kMatmulSplit: y2 and y3 are f16 (each value rounded once), the rows of a
// K/V pool's two sections (a tower's q/k/v gemm writes its K and V there).
MKV_CONSTANT uint32_t kMatmulSplitF16 = 64;
struct Matmul {
  uint32_t n_tokens;
  uint32_t n_in;   // f32/f16/bf16: multiple of 4; quantized: multiple of the block (32, K-quants 256)
  uint32_t n_out;
  uint32_t flags;  // kMatmulBias | kMatmulAccumulate | kMatmulSplit [| kMatmulSplitF16] | kMatmulGelu, or
                   // kMatmulSwiglu / kMatmulGeglu (gemm only)
  uint32_t split_a;  // kMatmulSplit: where y2's and y3's columns start
  uint32_t split_b;
};

// embedding_*: out[t, :] = table[ids[t], :] * scale.
//   table (vocab, dim) in the kernel's weight format; ids (n_tokens) int32;
//   out (n_tokens, dim) float. An id outside [0, vocab) gives a row of zeros.
struct Embedding {
  uint32_t n_tokens;
  uint32_t dim;
  uint32_t vocab;
  float scale;  // 1, or sqrt(hidden) for Gemma
};

// rms_norm_*: out[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) * (w_offset + w).
//   x, out (n_rows, dim) float (may alias); w (dim) in the kernel's type.
MKV_CONSTANT uint32_t kRmsNormVec4 = 1;  // rows are read as float4s held in registers
struct RmsNorm {
  uint32_t n_rows;
  uint32_t dim;
  float eps;
  float w_offset;  // 0 (Llama: w), 1 (Gemma: 1 + w)
  uint32_t flags;  // kRmsNormVec4 when dim % 4 == 0, rows 16-byte aligned, dim <= 4·kRmsNormVec·threads
};

// add_f32 (y += x), scale_f32 (y *= s), swiglu_f32 / geglu_f32
// (out = act(gate) * up; out may alias gate or up): n elements each.
struct Elementwise {
  uint32_t n;
  float scale;  // scale_f32 only
};

// argmax_f32: out[r] = lowest index of the largest value of x[r, :].
//   x (n_rows, n) float; out (n_rows) int32. NaNs are never chosen.
struct Argmax {
  uint32_t n_rows;
  uint32_t n;
  uint32_t masked;  // 1: only the ids whose bit is set in buffer 3 (constrained decoding's mask, one row)
};

// softmax_f32: out[r, :] = softmax(x[r, :] * scale), x and out (n_rows, n)
//   float (out may be x).
struct Softmax {
  uint32_t n_rows;
  uint32_t n;
  float scale;  // 1, or 1 / temperature
};

}  // namespace mkv_params

#ifndef __METAL_VERSION__
static_assert(sizeof(mkv_params::Matmul) == 24, "Matmul params layout");
static_assert(sizeof(mkv_params::Embedding) == 16, "Embedding params layout");
static_assert(sizeof(mkv_params::RmsNorm) == 20, "RmsNorm params layout");
static_assert(sizeof(mkv_params::Elementwise) == 8, "Elementwise params layout");
static_assert(sizeof(mkv_params::Argmax) == 12, "Argmax params layout");
static_assert(sizeof(mkv_params::Softmax) == 12, "Softmax params layout");
#endif
