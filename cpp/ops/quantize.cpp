// Host quantizer (quantize.h): one block of 32 floats at a time, rows split over
// threads. Compiled with -ffp-contract=off (CMakeLists.txt): Q4_0's x * id + 8.5
// must round twice, as numpy and ggml's C do, not once through an FMA.
#include "ops/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ops/ops.h"

namespace mkv::ops {
namespace {

constexpr uint32_t kBlock = 32;  // weights per Q8_0 / Q4_0 block
constexpr const char* kOp = "quantize";

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// f16 -> f32, exactly (subnormals, Inf and NaN included), branch-free so the
// block loop vectorizes: rebias the exponent; Inf/NaN get the rest of the float
// exponent; a subnormal half is renormalized by one exact float subtraction.
float f16_to_f32(uint16_t h) {
  uint32_t o = uint32_t(h & 0x7fff) << 13;
  const uint32_t exp = o & 0x0f800000u;
  o += uint32_t(127 - 15) << 23;
  o += exp == 0x0f800000u ? uint32_t(128 - 16) << 23 : 0;
  const float sub = bits_float(o + (1u << 23)) - bits_float(113u << 23);
  const uint32_t mag = exp == 0 ? float_bits(sub) : o;
  return bits_float(mag | (uint32_t(h & 0x8000) << 16));
}

// f32 -> f16, rounding to nearest even as numpy's astype(float16) and ggml's
// GGML_FP32_TO_FP16 do: overflow gives Inf, tiny values f16 subnormals or zero.
uint16_t f32_to_f16(float f) {
  uint32_t x = float_bits(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000);
  x &= 0x7fffffff;
  if (x >= 0x47800000u)  // >= 65536 (or Inf, NaN)
    return sign | (x > 0x7f800000u ? 0x7e00 : 0x7c00);
  if (x < 0x38800000u) {  // below 2^-14: the float add rounds the mantissa into place
    const uint32_t magic = uint32_t((127 - 15) + (23 - 10) + 1) << 23;
    return sign | uint16_t(float_bits(bits_float(x) + bits_float(magic)) - magic);
  }
  const uint32_t odd = (x >> 13) & 1;
  x += (uint32_t(15 - 127) << 23) + 0xfff + odd;  // rebias, round half to even (may carry to Inf)
  return sign | uint16_t(x >> 13);
}

// The low byte of numpy's float32 -> int8 / uint8 cast on x86-64, which goes
// through a 32-bit conversion (cvttss2si: truncation; NaN and out of range give
// INT32_MIN, whose low byte is 0). Only blocks whose scale is not a normal float
// reach the out-of-range cases; there ggml's C cast is undefined.
uint8_t numpy_byte(float v) {
  if (!(v >= -2147483648.0f && v < 2147483648.0f)) return 0;
  return uint8_t(uint32_t(int32_t(v)));
}

// Half away from zero, as C's roundf, written as gguf-py's np_roundf (floor(|v|) plus
// one if the fraction is >= 0.5; both steps exact) so that it inlines and vectorizes.
float round_half_away(float v) {
  const float a = std::fabs(v), f = std::floor(a);
  return std::copysign(f + (a - f >= 0.5f ? 1.0f : 0.0f), v);
}

template <WeightType S>
void load_block(const void* src, size_t index, float* x) {
  if constexpr (S == WeightType::f32) {
    std::memcpy(x, static_cast<const float*>(src) + index, kBlock * 4);
  } else {
    const uint16_t* p = static_cast<const uint16_t*>(src) + index;
    for (uint32_t j = 0; j < kBlock; ++j)
      x[j] = S == WeightType::f16 ? f16_to_f32(p[j]) : bits_float(uint32_t(p[j]) << 16);
  }
}

void store_f16(uint8_t* out, float d) {
  const uint16_t h = f32_to_f16(d);
  out[0] = uint8_t(h & 0xff);  // little-endian, as GGUF and the kernels read it
  out[1] = uint8_t(h >> 8);
}

// 34 bytes: f16 d, then 32 int8.
void q8_0_block(const float* x, uint8_t* out) {
  float amax = 0.0f;
  for (uint32_t j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_f16(out, d);
  for (uint32_t j = 0; j < kBlock; ++j) out[2 + j] = numpy_byte(round_half_away(x[j] * id));
}

// 18 bytes: f16 d, then 16 bytes of two 4-bit codes.
void q4_0_block(const float* x, uint8_t* out) {
  float amax = 0.0f, max = x[0];  // the first value of largest magnitude (numpy's argmax)
  for (uint32_t j = 0; j < kBlock; ++j)
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  const float d = max / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_f16(out, d);
  uint8_t q[kBlock];
  for (uint32_t j = 0; j < kBlock; ++j) {
    const float v = x[j] * id;
    q[j] = std::min<uint8_t>(15, numpy_byte(std::trunc(v + 8.5f)));
  }
  for (uint32_t j = 0; j < kBlock / 2; ++j) out[2 + j] = uint8_t(q[j] | (q[j + kBlock / 2] << 4));
}

using BlockFn = void (*)(const float*, uint8_t*);

template <WeightType S>
void quantize_rows(const QuantizeArgs& a, BlockFn block, size_t block_bytes, uint64_t row0, uint64_t row1) {
  const uint32_t per_row = a.cols / kBlock;
  uint8_t* dst = static_cast<uint8_t*>(a.dst);
  float x[kBlock];
  for (uint64_t r = row0; r < row1; ++r)
    for (uint32_t b = 0; b < per_row; ++b) {
      load_block<S>(a.src, size_t(r) * a.cols + size_t(b) * kBlock, x);
      block(x, dst + (size_t(r) * per_row + b) * block_bytes);
    }
}

}  // namespace

size_t quantized_bytes(WeightType src_type, WeightType dst_type, uint64_t rows, uint32_t cols) {
  if (dst_type != WeightType::q8_0 && dst_type != WeightType::q4_0)
    fail(kOp, std::string("cannot quantize to '") + weight_type_name(dst_type) + "'; expected 'q8_0' or 'q4_0'");
  if (is_quantized(src_type))
    fail(kOp, std::string("the source must be 'f32', 'f16' or 'bf16', got '") + weight_type_name(src_type) +
                  "' (already quantized)");
  if (rows == 0) fail(kOp, "rows must be positive, got 0");
  return file_weight_bytes(dst_type, rows, cols, kOp);  // raises for a row that is not whole blocks
}

void quantize(const QuantizeArgs& a) {
  const size_t want = quantized_bytes(a.src_type, a.dst_type, a.rows, a.cols);
  if (a.dst_bytes != want)
    fail(kOp, "the destination holds " + std::to_string(a.dst_bytes) + " bytes; (" + std::to_string(a.rows) +
                  ", " + std::to_string(a.cols) + ") " + weight_type_name(a.dst_type) + " takes " +
                  std::to_string(want));
  if (!a.src || !a.dst) fail(kOp, "src and dst must not be null");
  const BlockFn block = a.dst_type == WeightType::q8_0 ? q8_0_block : q4_0_block;
  const size_t block_bytes = file_weight_bytes(a.dst_type, 1, kBlock, kOp);
  auto run = a.src_type == WeightType::f32   ? quantize_rows<WeightType::f32>
             : a.src_type == WeightType::f16 ? quantize_rows<WeightType::f16>
                                             : quantize_rows<WeightType::bf16>;
  // At least ~1M values a thread: below that, starting a thread costs more than it saves.
  const unsigned hw = a.threads ? a.threads : std::max(1u, std::thread::hardware_concurrency());
  const uint64_t by_size = std::max<uint64_t>(1, a.rows * a.cols >> 20);
  const unsigned n = unsigned(std::min<uint64_t>({hw, by_size, a.rows}));
  if (n == 1) return run(a, block, block_bytes, 0, a.rows);
  std::vector<std::thread> workers;
  workers.reserve(n);
  for (unsigned i = 0; i < n; ++i)
    workers.emplace_back(run, std::cref(a), block, block_bytes, a.rows * i / n, a.rows * (i + 1) / n);
  for (std::thread& t : workers) t.join();
}

}  // namespace mkv::ops
