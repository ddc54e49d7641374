// Prompt lookup: draft ids for speculative decoding without a draft model
// (docs/SPECULATIVE.md). The proposal is what followed the most recent earlier
// occurrence of the history's last n ids, for the longest n from max_ngram
// down to min_ngram that occurred: text that quotes or edits its prompt
// (code, summaries, retrieved passages) repeats runs of it.
#pragma once

#include <cstdint>
#include <vector>

namespace mkv::engine {

inline constexpr uint32_t kLookupMinNgram = 2;  // a single matching id proposes too often in vain
inline constexpr uint32_t kLookupMaxNgram = 4;

// Up to k ids (none when nothing matched). history: the ids so far, the last
// one the latest.
std::vector<int32_t> lookup_drafts(const std::vector<int32_t>& history, uint32_t k,
                                   uint32_t min_ngram = kLookupMinNgram, uint32_t max_ngram = kLookupMaxNgram);

}  // namespace mkv::engine
