// Launch sizes from what the device reports (gpu::DeviceProperties and a
// pipeline's occupancy): the one place where ops turn device properties into
// grid choices. docs/KERNELS.md lists what each op derives from them.
#pragma once

#include <cstddef>
#include <string>
#include <cstdint>

#include "gpu/device.h"
#include "ops/ops.h"

namespace mkv::ops {

// Threadgroups of `pipeline` (threads, threadgroup memory each) that the whole
// device runs at once: compute units x resident threadgroups per unit (>= 1).
// A grid of fewer leaves units idle; a grid of a few times more hides the tail.
uint32_t device_wave(const gpu::Device& device, const gpu::Pipeline& pipeline, uint32_t threads,
                     size_t threadgroup_memory = 0);

// Threads for a threadgroup whose threads stride over `items` independent work
// items (tid, tid + nt, ...; no collective between items: the KV store, RoPE,
// the Hadamard rotation). GPUs: a thread an item up to `cap`, in whole
// SIMD-groups. Fiber lanes (the host executor): one, since every lane is a
// fiber to start and each barrier a switch through all of them; a token's few
// hundred items are a few microseconds of one lane's work.
uint32_t strided_threads(const gpu::Device& device, uint64_t items, uint32_t cap = 256);

// Threads of a kernel that gives each row one threadgroup and sums over it
// (metal/group_sum.h): kRowSimds SIMD-groups on a GPU; on fiber lanes, where
// each collective is a rendezvous, one.
uint32_t row_threads(const gpu::Device& device);

// The grid of an elementwise kernel over n elements (MKV_FOR_EACH_ELEMENT):
// kElementThreads threads x kElementsPerThread elements a threadgroup.
void dispatch_elements(gpu::ComputeEncoder& enc, uint64_t n);

// The grid of a one-thread-an-element kernel over n elements, in threadgroups
// of kElementThreads.
void dispatch_threads(gpu::ComputeEncoder& enc, uint64_t n);

// Raises "[op] <what> must be below 2^32 floats" unless n < 2^32 (kernels index with uint).
void below_2_32(const char* op, const char* what, uint64_t n);

// A float32 gather's checks (each of out's n_out floats read from x's n_in):
// both below 2^32 floats, the views big enough (`x_what`, `out_what` name
// them), out apart from x.
void check_gather(const char* op, const BufferView& x, const char* x_what, uint64_t n_in, const BufferView& out,
                  const char* out_what, uint64_t n_out);

// A float32 gather (im2col, image_patches) checked and dispatched: `kernel`
// with params at 0, x at 1, out at 2, one thread an output.
template <class P>
void gather_floats(gpu::Device& device, gpu::ComputeEncoder& enc, const char* op, const char* kernel,
                   const P& params, const BufferView& x, const char* x_what, uint64_t n_in, const BufferView& out,
                   const char* out_what, uint64_t n_out) {
  check_gather(op, x, x_what, n_in, out, out_what, n_out);
  enc.set_pipeline(device.pipeline(kernel));
  bind_params(enc, params, 0);
  bind(enc, x, 1);
  bind(enc, out, 2);
  dispatch_threads(enc, n_out);
}

}  // namespace mkv::ops
