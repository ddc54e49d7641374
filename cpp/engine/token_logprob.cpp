#include "engine/token_logprob.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace mkv::engine {

TokenLogprob token_logprob(const float* row, uint32_t vocab, int32_t id, uint32_t top_n) {
  // log-sum-exp in double, shifted by the maximum: no overflow, and the sum of
  // ~10^5 terms loses nothing a float logprob would show
  const float m = *std::max_element(row, row + vocab);
  double z = 0.0;
  for (uint32_t i = 0; i < vocab; ++i) z += std::exp(double(row[i]) - double(m));
  const double log_z = double(m) + std::log(z);
  auto logprob = [&](uint32_t i) { return float(double(row[i]) - log_z); };

  TokenLogprob out;
  out.logprob = logprob(uint32_t(id));
  top_n = std::min(top_n, vocab);
  if (top_n == 0) return out;
  std::vector<uint32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0u);
  std::partial_sort(order.begin(), order.begin() + top_n, order.end(),
                    [&](uint32_t a, uint32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
  out.top.reserve(top_n);
  for (uint32_t k = 0; k < top_n; ++k) out.top.emplace_back(int32_t(order[k]), logprob(order[k]));
  return out;
}

}  // namespace mkv::engine
