// The vision towers' kernels (bodies in vision.h). The host functions that
// build these names and geometries: cpp/ops/vision.cpp.
#include "mkv_kernel.h"
#include "vision.h"

MKV_KERNEL("layer_norm_f32", layer_norm<float>)
MKV_KERNEL("gelu_f32", gelu<float>)
MKV_KERNEL("image_patches_f32", image_patches<float>)
MKV_KERNEL("avg_pool_f32", avg_pool<float>)
MKV_KERNEL("depthwise_conv2d_f32", depthwise_conv2d<float>)
MKV_KERNEL("layer_scale_f32", layer_scale<float>)
