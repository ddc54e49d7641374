// The audio tower's kernels (bodies in audio.h). The host functions that
// build these names and geometries: cpp/ops/audio.cpp.
#include "mkv_kernel.h"
#include "audio.h"

MKV_KERNEL("im2col_f32", im2col<float>)
MKV_KERNEL("cumulative_norm_f32", cumulative_norm<float>)
MKV_KERNEL("audio_attention_f32", audio_attention<float>)
MKV_KERNEL("depthwise_conv_f32", depthwise_conv<float>)
MKV_KERNEL("glu_f32", glu<float>)
MKV_KERNEL("take_rows_f32", take_rows<float>)
MKV_KERNEL("silu_f32", silu<float>)
