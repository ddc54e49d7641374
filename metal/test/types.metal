// Scalar and vector types, swizzles, half arithmetic and atomics, for the
// executor tests; each kernel mirrors a numpy expression in tests/gpu.
#include "../mkv_kernel.h"

// Every operation rounds to half, as numpy float16 does.
kernel void test_half_arith(const device half* a [[buffer(0)]],
                            const device half* b [[buffer(1)]],
                            device half* out [[buffer(2)]],
                            uint i [[thread_position_in_grid]],
                            uint n [[threads_per_grid]]) {
  const half x = a[i], y = b[i];
  out[0 * n + i] = x + y;
  out[1 * n + i] = x * y;
  out[2 * n + i] = x * y + x;       // two roundings: no fused multiply-add
  out[3 * n + i] = x / (abs(y) + half(1.0h));
  out[4 * n + i] = half(float(x) * 3.0f);
  out[5 * n + i] = max(x, y);
}

// Swizzle reads and writes, vector-scalar mixing and conversions.
kernel void test_vectors(const device float4* in [[buffer(0)]],
                         device float4* out [[buffer(1)]],
                         uint i [[thread_position_in_grid]],
                         uint n [[threads_per_grid]]) {
  float4 v = in[i];
  out[0 * n + i] = v.wzyx;
  float4 w = v;
  w.xy += v.zw;                      // (x+z, y+w, z, w)
  out[1 * n + i] = w;
  out[2 * n + i] = float4(v.xy * 2.0f, v.zz - v.ww);
  out[3 * n + i] = float4(half4(v));  // round trip through half
  float4 s = float4(0.0f);
  s.zx = v.yy;                        // (y, 0, y, 0)
  s.w = dot(v, v);
  out[4 * n + i] = s;
  out[5 * n + i] = select(float4(-1.0f), v, v > 0.5f);
  const uint2 bits = as_type<uint2>(v.xy);
  out[6 * n + i] = float4(as_type<float>(bits.y), as_type<float>(bits.x), float(bits.x >> 31), 1.0f);
}

// Device atomics from every thread (many OS threads run threadgroups at once),
// and a threadgroup-local histogram merged into the device one.
kernel void test_atomics(const device uint* bins_in [[buffer(0)]],
                         device atomic_uint* hist [[buffer(1)]],
                         device atomic_uint* tg_hist [[buffer(2)]],
                         device atomic_int* total [[buffer(3)]],
                         uint gid [[thread_position_in_grid]],
                         uint tid [[thread_index_in_threadgroup]]) {
  threadgroup atomic_uint local[16];
  if (tid < 16) atomic_store_explicit(&local[tid], 0u, memory_order_relaxed);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  const uint bin = bins_in[gid] % 16;
  atomic_fetch_add_explicit(&hist[bin], 1u, memory_order_relaxed);
  atomic_fetch_add_explicit(&local[bin], 1u, memory_order_relaxed);
  atomic_fetch_add_explicit(total, int(bin) - 8, memory_order_relaxed);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (tid < 16)
    atomic_fetch_add_explicit(&tg_hist[tid],
                              atomic_load_explicit(&local[tid], memory_order_relaxed),
                              memory_order_relaxed);
}

// The operators that the host computes on its native vectors, beside those it
// keeps per element (integer / and %, 8-bit shifts, 3-vectors): each mirrors a
// numpy expression in tests/gpu/test_types.py (wrap-around, rounding, NaN).
kernel void test_vector_ops(const device uint4* u_in [[buffer(0)]],
                            const device float4* f_in [[buffer(1)]],
                            device uint4* u_out [[buffer(2)]],
                            device float4* f_out [[buffer(3)]],
                            uint i [[thread_position_in_grid]],
                            uint n [[threads_per_grid]]) {
  const uint4 a = u_in[2 * i], b = u_in[2 * i + 1];
  const float4 x = f_in[2 * i], y = f_in[2 * i + 1];
  u_out[0 * n + i] = a + b * 3u - (a ^ b);                  // wraps mod 2^32
  u_out[1 * n + i] = (a << (b & 31u)) | (a >> 7u);
  u_out[2 * n + i] = ~a & (b | 0xF0F0F0F0u);
  u_out[3 * n + i] = a / (b | 1u) + a % (b | 1u);          // per element
  u_out[4 * n + i] = uint4(as_type<int4>(a) / int4(-3) - as_type<int4>(b) * 2);
  const uchar4 c = as_type<uchar4>(a.x), d = as_type<uchar4>(b.x);
  u_out[5 * n + i] = uint4(as_type<uint>(uchar4(c + d)), as_type<uint>(uchar4(c << uchar4(1))),
                           as_type<uint>(uchar4(c * d)), uint(c.x) + uint(d.w));
  u_out[6 * n + i] = select(uint4(0u), uint4(1u), x < y) + select(uint4(0u), uint4(2u), a >= b) +
                     select(uint4(0u), uint4(4u), x != x) + select(uint4(0u), uint4(8u), -x == y);
  u_out[7 * n + i] = uint4(select(abs(x), float4(0.0f), isnan(x)));  // truncation, in range (negative
                                                             // or NaN to uint is undefined)
  f_out[0 * n + i] = x * y + 2.5f - y / (abs(x) + 1.0f);
  f_out[1 * n + i] = float4(a);                              // rounds large uints
  f_out[2 * n + i] = float4(half4(x * 1000.0f));             // round to nearest even
  f_out[3 * n + i] = float4(dot(x, y), dot(x.xy, y.zw), -x.z, float(uint4(c).w));
  const float3 x3 = x.xyz;
  f_out[4 * n + i] = float4(x3 * 2.0f + y.xyz, 0.0f);        // a 3-vector, per element
}
