// Argument structs of the audio tower's kernels (audio.metal), shared by the
// kernels (MSL) and the C++ ops that bind them (cpp/ops/audio.cpp).
#pragma once

#include "shared_params.h"

namespace mkv_params {

// The audio attention's head_dim at most: 32 lanes x kAudioDimsPerLane.
MKV_CONSTANT uint32_t kAudioDimsPerLane = 8;

// im2col_f32: a 2-D convolution's input patches as gemm rows. x (t_in, f_in,
// c_in) channels last; out (t_out * f_out, cols), row t * f_out + f, column
// (c * kt + i) * kf + j = x[t * st + i - pad_t, f * sf + j - pad_f, c], zero
// outside x and in columns from c_in * kt * kf to cols (the gemm's width).
// One thread per output element.
struct Im2col {
  uint32_t t_in, f_in, c_in;
  uint32_t kt, kf;       // the kernel's extent in time and frequency
  uint32_t st, sf;       // its strides
  uint32_t pad_t, pad_f; // zeros before the first row / column
  uint32_t t_out, f_out;
  uint32_t cols;
};

// cumulative_norm_f32: rows (time) of dim values, normalized by the mean and
// variance of every value of the rows up to and including it (Gemma 3n's
// cumulative group norm), times w[j % channels], then ReLU. Three passes over
// one scratch of 2 n_rows floats: 0 sums each row; 1 the squared differences
// of each row from its cumulative mean; 2 normalizes. One threadgroup a row.
struct CumulativeNorm {
  uint32_t n_rows;
  uint32_t dim;
  uint32_t channels;  // w's length; dim is a multiple
  uint32_t pass;      // 0, 1, 2
  float eps;
};

// audio_attention_f32: each query t sees the keys t - left .. t + right below
// n_valid, with the relative-position term of Transformer-XL and a soft cap:
//   s = (q_t * qscale) · (k_u + pos[left - (t - u)]),  s = cap tanh(s / cap),
//   out_t = Σ softmax(s)_u v_u  (zeros when no key is valid).
// One SIMD-group per (token, head).
struct AudioAttention {
  uint32_t n_tokens;
  uint32_t n_valid;  // keys at or past it are padding
  uint32_t n_heads;
  uint32_t head_dim;
  uint32_t left, right;
  float softcap;
};

// depthwise_conv_f32: out[t, c] = Σ_i w[i, c] x[t - (taps - 1) + i, c], x
// zero before row 0 (a causal depthwise convolution over time). One thread
// per output element.
struct DepthwiseConv {
  uint32_t n_rows;
  uint32_t channels;
  uint32_t taps;     // the kernel's length
};

// glu_f32: out[r, j] = x[r, j] * sigmoid(x[r, dim + j]) (torch's glu over the
// last axis); take_rows_f32: out[i, :] = x[i * stride, :]. One thread per
// output element.
struct Rows {
  uint32_t n_rows;  // output rows
  uint32_t dim;     // output row width
  uint32_t stride;  // take_rows: input rows per output row
};

}  // namespace mkv_params
