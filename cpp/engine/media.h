// Media: a prompt's soft tokens (docs/MULTIMODAL.md). Spans of the prompt whose
// rows enter the model as given embeddings (a vision or audio tower's output)
// in place of their ids' table rows. The spans' ids still key the prefix cache
// and the cache's record (the Python layer makes them from a hash of the
// media), so the same image at the same place reuses its blocks.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/model.h"

namespace mkv::engine {

struct MediaSpan {
  uint32_t start = 0;          // index in the prompt fed
  uint32_t length = 0;
  bool bidirectional = false;  // its tokens see each other (Gemma 3's images): one chunk holds it whole
};

struct Media {
  std::vector<MediaSpan> spans;  // sorted, disjoint
  std::vector<float> rows;       // (Σ length, hidden): the spans' rows, in order
  uint32_t hidden = 0;

  // Raises ArgumentError "[generate] media ..." unless the spans lie in a
  // prompt of n ids, in order, rows holds theirs at the model's width, and a
  // bidirectional span fits one chunk of at most max_chunk tokens.
  void check(size_t n, uint32_t model_hidden, uint32_t max_chunk) const;

  // The soft rows and bidirectional blocks of the prompt's chunk [from, from + n),
  // whose first token goes to position pos0.
  void chunk(uint32_t from, uint32_t n, uint32_t pos0, std::vector<model::SoftRows>& soft,
             std::vector<ops::AttentionBlock>& blocks) const;

  // How many tokens of a chunk that starts at prompt index `from` and would
  // take `take` (of at most `limit`: its cap and the step's budget) may be
  // taken so that no bidirectional span is cut: `take`; fewer, ending before
  // the span it would cut; or, for a span that starts at `from`, the span
  // whole when it fits `limit` (even where the chunker would leave one token
  // for later), else 0 (it waits for a step with room for it).
  uint32_t uncut(uint32_t from, uint32_t take, uint32_t limit) const;
};

// Ids outside the spans must be in [0, vocab); a span's ids are its keys, any
// int32. Raises ArgumentError naming the first bad id.
void check_prompt_ids(const std::vector<int32_t>& ids, uint32_t vocab, const Media* media);

}  // namespace mkv::engine
