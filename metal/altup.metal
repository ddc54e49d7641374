// Gemma 3n's per-row kernels (bodies in altup.h). The host functions that
// build these names and geometries: cpp/ops/altup.cpp.
#include "mkv_kernel.h"
#include "altup.h"

MKV_KERNEL("altup_predict_f32", altup_predict<float>)
MKV_KERNEL("altup_correct_f32", altup_correct<float>)
MKV_KERNEL("altup_magnitude_f32", altup_magnitude<float>)
MKV_KERNEL("altup_mean_f32", altup_mean<float>)
MKV_KERNEL("gaussian_topk_f32", gaussian_topk<float>)
MKV_KERNEL("per_layer_gate_f32", per_layer_gate<float>)
