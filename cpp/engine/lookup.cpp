#include "engine/lookup.h"

#include <algorithm>

namespace mkv::engine {

std::vector<int32_t> lookup_drafts(const std::vector<int32_t>& history, uint32_t k, uint32_t min_ngram,
                                   uint32_t max_ngram) {
  const size_t n = history.size();
  if (k == 0) return {};
  for (size_t g = std::min<size_t>(max_ngram, n > 0 ? n - 1 : 0); g >= min_ngram && g > 0; --g) {
    const int32_t* tail = history.data() + n - g;
    // Latest start first; a match must leave at least one id after it.
    for (size_t s = n - g; s-- > 0;) {
      if (!std::equal(tail, tail + g, history.data() + s)) continue;
      const size_t from = s + g, take = std::min<size_t>(k, n - from);
      return {history.begin() + from, history.begin() + from + take};
    }
  }
  return {};
}

}  // namespace mkv::engine
