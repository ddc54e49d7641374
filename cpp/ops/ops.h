// Shared helpers of the ops layer. An op is one host function per kernel
// family: it picks the kernel variant (by name), binds the argument struct and
// buffers, and chooses the dispatch geometry. Ops see only cpp/gpu/device.h.
// Every op takes (gpu::Device& dev, gpu::ComputeEncoder& enc, ...), and picks
// shapes from the device's DeviceProperties traits, never from its kind()
// (docs/ARCHITECTURE.md says why).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "gpu/device.h"

namespace mkv::ops {

inline uint32_t ceil_div(uint64_t a, uint64_t b) { return uint32_t((a + b - 1) / b); }

// Whether an op's own pick is the host executor's shape of its kernel (the _h
// kernels): lanes are fibers, where every collective is a rendezvous, and the
// library holds those shapes. The one place that decides it.
inline bool picks_host_shapes(const gpu::DeviceProperties& props) {
  return props.lanes_are_fibers && props.has_host_shapes;
}

// Whether v is in a constant list (a variant table's entries: metal/*_variants.h).
template <class T, size_t N>
constexpr bool listed(const T (&list)[N], T v) {
  for (const T& x : list)
    if (x == v) return true;
  return false;
}

// A range of a device buffer: tensors live at offsets inside larger buffers.
struct BufferView {
  gpu::BufferPtr buffer;
  size_t offset = 0;
};

// Whether [a.offset, + a_bytes) and [b.offset, + b_bytes) share bytes of one buffer.
inline bool overlaps(const BufferView& a, size_t a_bytes, const BufferView& b, size_t b_bytes) {
  return a.buffer == b.buffer && a.offset < b.offset + b_bytes && b.offset < a.offset + a_bytes;
}

inline void bind(gpu::ComputeEncoder& enc, const BufferView& v, uint32_t index) {
  enc.set_buffer(v.buffer, v.offset, index);
}

// The kernel's argument struct (from metal/*params.h), copied by value.
template <class P>
void bind_params(gpu::ComputeEncoder& enc, const P& params, uint32_t index) {
  static_assert(std::is_trivially_copyable_v<P>, "kernel params are plain structs");
  enc.set_bytes(&params, sizeof params, index);
}

// Errors raised by ops start with the op's name: "[attention_decode] ...".
[[noreturn]] inline void fail(const char* op, const std::string& message) {
  throw gpu::GpuError(std::string("[") + op + "] " + message);
}

// Raises "[op] <what> must be positive" for n == 0 (a count, a size).
inline void check_positive(const char* op, const char* what, uint64_t n) {
  if (n == 0) fail(op, std::string(what) + " must be positive");
}

// Raises "[op] <what> needs N bytes from offset O but the buffer has M" when
// the view is null or holds fewer than `bytes` bytes.
inline void check_bytes(const char* op, const std::string& what, const BufferView& v, uint64_t bytes) {
  if (!v.buffer) fail(op, what + " buffer is null");
  const size_t have = v.offset <= v.buffer->length() ? v.buffer->length() - v.offset : 0;
  if (have < bytes)
    fail(op, what + " needs " + std::to_string(bytes) + " bytes from offset " + std::to_string(v.offset) +
                 " but the buffer has " + std::to_string(have));
}

}  // namespace mkv::ops
