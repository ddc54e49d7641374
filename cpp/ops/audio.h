// The audio tower's small kernels (metal/audio.metal): im2col for the
// subsampling convolutions, the cumulative group norm, the conformer's local
// attention with relative positions, the causal depthwise convolution, GLU,
// SiLU and a strided row copy. Activations are float32; every function
// validates, then encodes its dispatches, and raises GpuError "[op] ..." on bad input.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "metal/audio_params.h"
#include "ops/linear.h"

namespace mkv::ops {

// out = the patches of x (t_in, f_in, c_in) a 2-D convolution reads, as gemm
// rows (metal/audio_params.h Im2col): (t_out * f_out, cols) float32.
void im2col(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& x, const BufferView& out,
            const mkv_params::Im2col& p);

// out = ReLU(cumulative group norm of x (n_rows, dim) over time * w[j % channels]):
// three dispatches over stats (2 n_rows floats of scratch). out may be x.
void cumulative_norm(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& x, const BufferView& w,
                     const BufferView& stats, const BufferView& out, uint32_t n_rows, uint32_t dim,
                     uint32_t channels, float eps);

// Gemma 3n's conformer attention (metal/audio_params.h AudioAttention): q, k,
// v, out (n_tokens, n_heads head_dim); pos (left + right + 1, n_heads
// head_dim), row f for the key left - f tokens before the query; qscale
// (head_dim). head_dim at most 32 kAudioDimsPerLane.
void audio_attention(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& q, const BufferView& k,
                     const BufferView& v, const BufferView& pos, const BufferView& qscale, const BufferView& out,
                     const mkv_params::AudioAttention& p);

// out[t, c] = Σ_i w[i, c] x[t - (taps - 1) + i, c]: x, out (n_rows, channels), w (taps, channels).
void depthwise_conv(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& x, const BufferView& w,
                    const BufferView& out, uint32_t n_rows, uint32_t channels, uint32_t taps);

// out[r, j] = x[r, j] * sigmoid(x[r, dim + j]): x (n_rows, 2 dim), out (n_rows, dim).
void glu(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& x, const BufferView& out,
         uint32_t n_rows, uint32_t dim);

// out[i, :] = x[i * stride, :] for i < n_rows: x (> (n_rows - 1) stride rows, dim), out (n_rows, dim).
void take_rows(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& x, const BufferView& out,
               uint32_t n_rows, uint32_t dim, uint32_t stride);

// y[i] = silu(y[i]) for i < n, in place.
void silu(gpu::Device& device, gpu::ComputeEncoder& enc, const BufferView& y, uint64_t n);

std::vector<std::string> audio_kernel_names();

}  // namespace mkv::ops
