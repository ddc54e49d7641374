// CUDA prelude, part 5: what the thunks cuda_pass.py writes use (the ABI is
// cpp/gpu/cuda/kernel_abi.h). A thunk deduces every kernel parameter's type
// from the kernel's function pointer, so template instantiations need no
// spelled-out types:
//   using F = decltype(&attn_decode<128, 8>);
//   extern "C" __global__ void attn_decode_f16_d128(
//       ::mkv::cuda::bytes_t<::mkv::cuda::param_t<F, 0>> p,      // constant T& -> T
//       ::mkv::cuda::buffer_t<::mkv::cuda::param_t<F, 1>> q, ...) // device T* -> T*
//   { ::attn_decode<128, 8>(p, q, ..., ::mkv::cuda::builtin<::mkv::cuda::param_t<F, 5>>(...)); }
#pragma once

namespace mkv::cuda {

template <size_t I, class T, class... Rest> struct nth_type { using type = typename nth_type<I - 1, Rest...>::type; };
template <class T, class... Rest> struct nth_type<0, T, Rest...> { using type = T; };
template <class F> struct kernel_fn;
template <class... A> struct kernel_fn<void (*)(A...)> {
  template <size_t I> using arg = typename nth_type<I, A...>::type;
};
template <class F, size_t I> using param_t = typename kernel_fn<F>::template arg<I>;

// `constant T& p [[buffer(n)]]`: the bytes themselves, in the kernel's
// parameter space (Metal's setBytes; the device copies the bound bytes).
template <class P> struct bytes_param {
  static_assert(std::is_reference<P>::value, "a constant buffer passed by value is a `constant T&` parameter");
  using type = std::remove_cv_t<std::remove_reference_t<P>>;
  static_assert(std::is_trivially_copyable<type>::value, "constant T& parameters must be trivially copyable");
};
template <class P> using bytes_t = typename bytes_param<P>::type;

// `device T* p` stays a pointer; `device T& r` is passed as a pointer and dereferenced.
template <class P> struct buffer_param {
  static_assert(std::is_pointer<P>::value || std::is_reference<P>::value,
                "buffer parameters are pointers or references");
  using type = std::conditional_t<std::is_pointer<P>::value, P, std::remove_reference_t<P>*>;
};
template <class P> using buffer_t = typename buffer_param<P>::type;
template <class P> MKV_D P bind_buffer(buffer_t<P> p) {
  if constexpr (std::is_pointer<P>::value) {
    return p;
  } else {
    return *p;
  }
}

// `threadgroup T* t [[threadgroup(n)]]`: a byte offset into the one dynamic
// __shared__ buffer that holds every [[threadgroup(n)]] area (16-aligned).
MKV_D unsigned char* threadgroup_memory() {
  extern __shared__ __align__(16) unsigned char mkv_cuda_threadgroup_memory[];
  return mkv_cuda_threadgroup_memory;
}
template <class P> MKV_D P bind_threadgroup(uint32_t offset) {
  static_assert(std::is_pointer<P>::value, "threadgroup parameters are pointers");
  return reinterpret_cast<P>(threadgroup_memory() + offset);
}

// Builtins. Threads of a block are numbered x fastest, then y, then z, and
// warps are formed from that linear index, as Metal numbers SIMD-groups.
MKV_D uint linear_tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
MKV_D uint block_threads() { return blockDim.x * blockDim.y * blockDim.z; }
// A builtin of type uint / ushort / uint2 / uint3 ... from its three components.
template <class P> MKV_D std::remove_cv_t<std::remove_reference_t<P>> builtin(uint x, uint y, uint z) {
  using V = std::remove_cv_t<std::remove_reference_t<P>>;
  if constexpr (metal::mkv_detail::is_vec_like_v<V>) {
    using E = typename metal::mkv_detail::vec_traits<V>::elem;
    const E c[3] = {E(x), E(y), E(z)};
    V v;
    for (int i = 0; i < metal::mkv_detail::vec_traits<V>::size; ++i) v[i] = c[i];
    return v;
  } else {
    (void)y;
    (void)z;
    return V(x);
  }
}

}  // namespace mkv::cuda
