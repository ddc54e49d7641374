// How a kernel compiled from .metal is described to, and called by, the host
// executor. The kernel pass (metal_pass.py) emits, for every kernel, an invoke
// thunk that fetches each parameter from a LaneContext by its Metal attribute,
// a ParamSpec table, and a static KernelRegistrar.
//
// Included by generated kernel translation units after the prelude, so it uses
// only headers the prelude already pulled in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "lane_api.h"

namespace metal {
template <class T, int N>
struct vec;  // defined by the prelude; the executor itself never needs it
}

namespace mkv::host {

constexpr int kMaxBufferBindings = 31;  // Metal's argument table size
constexpr int kMaxThreadgroupBindings = 31;

enum class Builtin : uint8_t {
  thread_position_in_grid,
  thread_position_in_threadgroup,
  thread_index_in_threadgroup,
  threadgroup_position_in_grid,
  threads_per_threadgroup,
  threadgroups_per_grid,
  threads_per_grid,
  thread_index_in_simdgroup,
  simdgroup_index_in_threadgroup,
  threads_per_simdgroup,
  simdgroups_per_threadgroup,
  count,
};

struct ParamSpec {
  enum Kind : uint8_t { buffer, threadgroup_memory, builtin };
  Kind kind;
  uint8_t index;       // buffer / threadgroup index, or Builtin value
  uint32_t min_bytes;  // for reference parameters: sizeof the referenced type
  const char* name;    // parameter name, for error messages
};

// Everything one simulated GPU thread needs to call its kernel.
struct LaneContext {
  void* const* buffers;     // [kMaxBufferBindings], base + offset
  void* const* threadgroup; // [kMaxThreadgroupBindings]
  uint32_t builtin[size_t(Builtin::count)][3];
};

// Metal's limit on the threads of a threadgroup; a kernel may declare less.
constexpr uint32_t kMaxThreadsPerThreadgroup = 1024;

struct KernelDesc {
  const char* name;
  const char* file;  // .metal path relative to the project root
  int line;
  void (*invoke)(const LaneContext&);
  const ParamSpec* params;
  uint32_t n_params;
  uint32_t max_threads;  // [[max_total_threads_per_threadgroup(n)]], else kMaxThreadsPerThreadgroup
};

struct KernelRegistrar {
  explicit KernelRegistrar(const KernelDesc* desc);
};

// ---- parameter binding helpers used by the generated thunks ----

template <size_t I, class T, class... Rest>
struct nth_type {
  using type = typename nth_type<I - 1, Rest...>::type;
};
template <class T, class... Rest>
struct nth_type<0, T, Rest...> {
  using type = T;
};

template <class F>
struct kernel_fn;
template <class... A>
struct kernel_fn<void (*)(A...)> {
  template <size_t I>
  using arg = typename nth_type<I, A...>::type;
};
template <class F, size_t I>
using param_t = typename kernel_fn<F>::template arg<I>;

template <class P>
constexpr uint32_t reference_bytes() {
  if constexpr (std::is_reference_v<P>) return uint32_t(sizeof(std::remove_reference_t<P>));
  return 0;
}

// Storage behind `threadgroup T name;` in a kernel body (see metal_pass.py).
template <class T>
T& threadgroup_var(const void* site) {
  return *static_cast<T*>(threadgroup_variable(site, sizeof(T), alignof(T)));
}

template <class P>
P bind_buffer(const LaneContext& c, int index) {
  void* p = c.buffers[index];
  if constexpr (std::is_pointer_v<P>) {
    return reinterpret_cast<P>(p);
  } else {
    static_assert(std::is_reference_v<P>, "buffer parameters are pointers or references");
    return *reinterpret_cast<std::remove_reference_t<P>*>(p);
  }
}

template <class P>
P bind_threadgroup(const LaneContext& c, int index) {
  static_assert(std::is_pointer_v<P>, "threadgroup parameters are pointers");
  return reinterpret_cast<P>(c.threadgroup[index]);
}

template <class V>
struct builtin_maker {  // scalar builtins (uint, ushort, ...) take .x
  static V make(const uint32_t v[3]) { return V(v[0]); }
};
template <class T, int N>
struct builtin_maker<metal::vec<T, N>> {
  static metal::vec<T, N> make(const uint32_t v[3]) {
    metal::vec<T, N> r;
    for (int i = 0; i < N; ++i) r[i] = T(v[i]);
    return r;
  }
};

template <class P>
P bind_builtin(const LaneContext& c, Builtin b) {
  return builtin_maker<std::remove_cv_t<std::remove_reference_t<P>>>::make(c.builtin[size_t(b)]);
}

}  // namespace mkv::host
