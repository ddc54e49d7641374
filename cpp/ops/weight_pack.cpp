#include "ops/weight_pack.h"

#include <cstring>
#include <thread>
#include <vector>

#include "metal/linear_params.h"

namespace mkv::ops {
namespace {

using namespace mkv_params;

// One field of a GGUF block: where it is in the block, its size, and where
// its plane starts in a packed row (times the row's block count).
struct Field {
  uint32_t block_offset, size, plane;
};
struct Packing {
  WeightType type;
  uint32_t block_bytes;
  Field fields[4];
  int n_fields;
};
// Field offsets from ggml's block_* structs (metal/quant.h restates them);
// planes from linear_params.h, which metal/quant.h reads too.
constexpr Packing kPackings[] = {
    {WeightType::q8_0, kQ8_0BlockBytes, {{2, 32, 0}, {0, 2, kQ8_0PlaneD}}, 2},
    {WeightType::q4_0, kQ4_0BlockBytes, {{2, 16, 0}, {0, 2, kQ4_0PlaneD}}, 2},
    {WeightType::q4_1, kQ4_1BlockBytes, {{4, 16, 0}, {0, 4, kQ4_1PlaneDm}}, 2},
    {WeightType::q5_0, kQ5_0BlockBytes, {{6, 16, 0}, {2, 4, kQ5_0PlaneQh}, {0, 2, kQ5_0PlaneD}}, 3},
    {WeightType::q5_1, kQ5_1BlockBytes, {{8, 16, 0}, {4, 4, kQ5_1PlaneQh}, {0, 4, kQ5_1PlaneDm}}, 3},
    {WeightType::q6_k, kQ6_KBlockBytes,
     {{0, 128, 0}, {128, 64, kQ6_KPlaneQh}, {192, 16, kQ6_KPlaneScales}, {208, 2, kQ6_KPlaneD}}, 4},
};

// Each packing's fields tile its block, and its planes tile a row in order.
constexpr bool packing_is_a_permutation(const Packing& p) {
  uint32_t plane = 0, covered = 0;
  for (int f = 0; f < p.n_fields; ++f) {
    if (p.fields[f].plane != plane) return false;
    plane += p.fields[f].size;
    for (int g = 0; g < p.n_fields; ++g)
      if (g != f && p.fields[g].block_offset < p.fields[f].block_offset + p.fields[f].size &&
          p.fields[f].block_offset < p.fields[g].block_offset + p.fields[g].size)
        return false;
    covered += p.fields[f].size;
  }
  return plane == p.block_bytes && covered == p.block_bytes;
}
constexpr bool all_packings_are_permutations() {
  for (const Packing& p : kPackings)
    if (!packing_is_a_permutation(p)) return false;
  return true;
}
static_assert(all_packings_are_permutations(), "a packed row holds each byte of its blocks exactly once");

const Packing* find_packing(WeightType t) {
  for (const Packing& p : kPackings)
    if (p.type == t) return &p;
  return nullptr;
}

void pack_rows(const Packing& p, uint64_t r0, uint64_t r1, size_t nb, size_t src_row, size_t dst_row,
               const unsigned char* src, unsigned char* dst) {
  for (uint64_t r = r0; r < r1; ++r) {
    const unsigned char* s = src + r * src_row;
    unsigned char* d = dst + r * dst_row;
    for (int f = 0; f < p.n_fields; ++f) {
      const Field& fd = p.fields[f];
      unsigned char* plane = d + nb * fd.plane;
      for (size_t b = 0; b < nb; ++b) std::memcpy(plane + b * fd.size, s + b * p.block_bytes + fd.block_offset, fd.size);
    }
    std::memset(d + nb * p.block_bytes, 0, dst_row - nb * p.block_bytes);
  }
}

}  // namespace

void pack_weights(WeightType t, uint64_t rows, uint32_t cols, const void* src, void* dst) {
  const size_t dst_bytes = weight_bytes(t, rows, cols, "weights"), src_bytes = file_weight_bytes(t, rows, cols, "weights");
  const Packing* p = find_packing(t);
  if (!p || rows == 0) {
    std::memcpy(dst, src, src_bytes);
    return;
  }
  const size_t nb = cols / weight_row_multiple(t), src_row = src_bytes / rows, dst_row = dst_bytes / rows;
  const auto* s = static_cast<const unsigned char*>(src);
  auto* d = static_cast<unsigned char*>(dst);
  // Large matrices (an 8B model's are 10-600 MB) on every core.
  const uint64_t workers = std::min<uint64_t>(std::max(1u, std::thread::hardware_concurrency()),
                                              std::max<uint64_t>(1, src_bytes >> 24));
  if (workers <= 1) return pack_rows(*p, 0, rows, nb, src_row, dst_row, s, d);
  std::vector<std::thread> pool;
  for (uint64_t w = 0; w < workers; ++w)
    pool.emplace_back(pack_rows, std::cref(*p), rows * w / workers, rows * (w + 1) / workers, nb, src_row, dst_row, s, d);
  for (std::thread& th : pool) th.join();
}

}  // namespace mkv::ops
