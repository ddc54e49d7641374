// The attention kernel variants, as data: one list per axis. The kernel files
// (attention_decode.metal, attention_decode_host.metal, attention_prefill.metal)
// instantiate through these lists, and cpp/ops/attention.cpp reads the same
// lists to accept head_dims, to pick a fixed-format pair and to list every name
// it can build (ops::op_kernel_names; tests/gpu/test_kernel_names.py checks
// that each exists and that every kernel is reachable). Macros only, so that
// MSL, g++ and nvcc all read it.
//
// Each list is an X-macro: LIST(X, ...) calls X(entry..., ...) once per entry;
// the extra arguments travel to X unchanged.
#pragma once

// Every head_dim the attention ops accept (ops::kAttnHeadDims): f16 K and V,
// decode (single pass, split-K, reduce, _lg) and prefill.
#define MKV_ATTN_HEAD_DIMS(X, ...) \
  X(32, __VA_ARGS__) X(64, __VA_ARGS__) X(80, __VA_ARGS__) X(96, __VA_ARGS__) X(112, __VA_ARGS__) \
  X(128, __VA_ARGS__) X(160, __VA_ARGS__) X(192, __VA_ARGS__) X(256, __VA_ARGS__)

// The head_dims the quantized readers (kvq, and a residual window) take:
// mkv_params::kv_format_fits's 32, 64 and multiples of 64 among the above.
#define MKV_ATTN_KVQ_HEAD_DIMS(X, ...) \
  X(32, __VA_ARGS__) X(64, __VA_ARGS__) X(128, __VA_ARGS__) X(192, __VA_ARGS__) X(256, __VA_ARGS__)

// The head_dims where a decode SIMD-group holds 8 query rows
// (attn_decode_rows(D) == 8), which also have 4-row kernels (suffix _r4: the
// op's pick for head blocks of at most 4 query heads).
#define MKV_ATTN_R4_HEAD_DIMS(X, ...) X(32, __VA_ARGS__) X(64, __VA_ARGS__)

// Decode without prefetch (suffix _nopf, f16 K and V: a bench variant).
#define MKV_ATTN_NOPF_HEAD_DIMS(X, ...) X(128, __VA_ARGS__)

// The K/V format pairs with decode kernels of their own, formats as constants
// (the GPU shape; the op prefers them to kvq, which reads any pair):
// X(kind, K format, V format, ...), at the head_dims of MKV_ATTN_PAIR_HEAD_DIMS
// (their _r4 forms where those are in MKV_ATTN_R4_HEAD_DIMS: MKV_ATTN_PAIR_R4_HEAD_DIMS).
#define MKV_ATTN_KV_PAIRS(X, ...)                                    \
  X(q8q8, mkv_params::kKvQ8, mkv_params::kKvQ8, __VA_ARGS__)         \
  X(q4q4, mkv_params::kKvQ4, mkv_params::kKvQ4, __VA_ARGS__)         \
  X(q8q4, mkv_params::kKvQ8, mkv_params::kKvQ4, __VA_ARGS__)
// Pairs that exist with a residual window only (q2's codes are sealed from it).
#define MKV_ATTN_RES_ONLY_KV_PAIRS(X, ...) X(q2q2, mkv_params::kKvQ2K, mkv_params::kKvQ2V, __VA_ARGS__)
#define MKV_ATTN_PAIR_HEAD_DIMS(X, ...) X(64, __VA_ARGS__) X(128, __VA_ARGS__)
#define MKV_ATTN_PAIR_R4_HEAD_DIMS(X, ...) X(64, __VA_ARGS__)
