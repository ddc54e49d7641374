#include "kv/kv_layout.h"

#include "gpu/errors.h"

namespace mkv::kv {
namespace {

constexpr const char* kNames[mkv_params::kKvFormats] = {"f16", "q8", "q4", "q2", "q2"};

}  // namespace

const char* kv_format_name(uint32_t format) { return format < mkv_params::kKvFormats ? kNames[format] : "?"; }

uint32_t parse_kv_format(const std::string& name, const char* what) {
  if (name == "q2") return std::string(what) == "kv_v" ? mkv_params::kKvQ2V : mkv_params::kKvQ2K;
  for (uint32_t f = 0; f < mkv_params::kKvQ2K; ++f)
    if (name == kNames[f]) return f;
  throw gpu::ArgumentError("kv_cache", what, "'" + name + "'", "one of 'f16', 'q8', 'q4' or 'q2'");
}

void check_kv_format(uint32_t format, uint32_t head_dim, const char* what) {
  const bool v = std::string(what) == "kv_v";
  if (format >= mkv_params::kKvFormats || format == (v ? mkv_params::kKvQ2K : mkv_params::kKvQ2V))
    throw gpu::ArgumentError("kv_cache", what, std::to_string(format),
                             std::string("a KV format 0 (f16), 1 (q8), 2 (q4) or ") + (v ? "4 (q2 of V)" : "3 (q2 of K)"));
  if (!mkv_params::kv_format_fits(format, head_dim))
    throw gpu::ArgumentError(
        "kv_cache", what,
        std::string(what) + "='" + kv_format_name(format) + "' cannot store heads of head_dim " +
            std::to_string(head_dim) + ": the quantized formats take head_dim 32, 64 or a multiple of 64 (128, 192, "
            "256); keep this model's K and V at 'f16'");
}

std::vector<LayerLayout::Range> LayerLayout::unit_ranges(uint32_t format, uint32_t n_kv_heads, uint32_t head_dim,
                                                         uint32_t rows, size_t section_offset, uint32_t slot,
                                                         uint32_t n) {
  // Offsets inside one unit of `rows` slots (kv_format.h): data plane, then parameters.
  const size_t data = size_t(n_kv_heads) * mkv_params::kv_data_bytes(format, head_dim);
  const size_t params = mkv_params::kv_param_row_bytes(format, n_kv_heads, head_dim);
  std::vector<Range> out{{section_offset + slot * data, n * data}};
  if (params) out.push_back({section_offset + rows * data + slot * params, n * params});
  return out;
}

std::vector<LayerLayout::Range> LayerLayout::slot_ranges(uint32_t kv, uint32_t slot, uint32_t n) const {
  constexpr uint32_t B = mkv_params::kKvBlockTokens;
  return unit_ranges(format(kv), n_kv_heads, head_dim, B, block_offset(kv, slot / B), slot % B, n);
}

}  // namespace mkv::kv
