// Included first by every kernel file (metal/*.metal, metal/test/*.metal):
// the Metal standard library with its namespace opened before any of our
// headers use an MSL type or function, the one macro that instantiates a
// kernel template under the name the ops build, and the unroll hint.
#pragma once

#include <metal_stdlib>
using namespace metal;

// MKV_KERNEL("gemv_q4_1", gemv<FmtQ4_1, 8>): one explicit instantiation of a
// kernel template, named by a single string literal (the host build pass
// reads it; MKV_STR builds one from pasted tokens).
#define MKV_KERNEL(name, ...) template [[host_name(name)]] [[kernel]] decltype(__VA_ARGS__) __VA_ARGS__;
#define MKV_STR_(x) #x
#define MKV_STR(x) MKV_STR_(x)

// MKV_UNROLL before a loop with a compile-time trip count: Metal's and CUDA's
// compilers take `#pragma unroll`, g++ (the host executor) `#pragma GCC unroll`.
#if defined(__METALKV_HOST__)
#define MKV_UNROLL _Pragma("GCC unroll 16")
#else
#define MKV_UNROLL _Pragma("unroll")
#endif

// MKV_HOST_SHAPES: the host executor's own shapes are instantiated
// (gemv_tokens.metal's 8-token gemvs, attention_decode_host.metal): in the host
// build, and in tools/check_msl.py's check (-DMKV_CHECK_HOST_SHAPES), which holds
// them to what Apple's compiler accepts like every other kernel.
#if defined(__METALKV_HOST__) || defined(MKV_CHECK_HOST_SHAPES)
#define MKV_HOST_SHAPES 1
#endif

// MKV_MAX_THREADS(n) before a kernel dispatched with a fixed threadgroup size:
// Apple's compiler may then use more registers per thread; every device reports
// n as the pipeline's max_total_threads_per_threadgroup and refuses a larger
// dispatch (the host executor reads it through its build pass).
#define MKV_MAX_THREADS(n) [[max_total_threads_per_threadgroup(n)]]
