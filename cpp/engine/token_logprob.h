// The log-probability record of one emitted id (GenerateOptions::logprobs),
// computed on the host from the raw logits row it was sampled from: before
// any penalty or temperature, as vLLM's default ("raw_logprobs") and OpenAI's
// API report them.
#pragma once

#include <cstdint>

#include "engine/request.h"

namespace mkv::engine {

// log_softmax(row)[id] and the top_n (<= vocab) highest entries, highest
// first, ties by lower id. row: (vocab) float.
TokenLogprob token_logprob(const float* row, uint32_t vocab, int32_t id, uint32_t top_n);

}  // namespace mkv::engine
