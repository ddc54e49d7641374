// The transformer's small per-element and per-row kernels: embedding lookup,
// RMSNorm, residual add, scale, SwiGLU / GeGLU, argmax, softmax. Activations
// are float.
// The host functions that build these names and geometries:
// cpp/ops/elementwise.cpp.
#include "mkv_kernel.h"
#include "elementwise.h"

// Every weight format of quant.h: embedding_f16, embedding_q4_1, ...
#define MKV_EMBEDDING_FORMAT(fmt, F) MKV_KERNEL(MKV_STR(embedding_##fmt), embedding<F>)
MKV_FOR_EACH_FORMAT(MKV_EMBEDDING_FORMAT)
MKV_KERNEL("rms_norm_f32", rms_norm<float>)
MKV_KERNEL("rms_norm_f16", rms_norm<half>)
MKV_KERNEL("add_f32", add<float>)
MKV_KERNEL("scale_f32", scale<float>)
MKV_KERNEL("softcap_f32", softcap<float>)
MKV_KERNEL("swiglu_f32", gated<ActSilu>)
MKV_KERNEL("geglu_f32", gated<ActGeluTanh>)
MKV_KERNEL("argmax_f32", argmax<float>)
MKV_KERNEL("softmax_f32", softmax<float>)
