#include "engine/media.h"

#include <string>

#include "gpu/errors.h"

namespace mkv::engine {
namespace {

std::string str(uint64_t v) { return std::to_string(v); }

[[noreturn]] void bad(const std::string& what) { throw gpu::ArgumentError("generate", "media", what); }

}  // namespace

void Media::check(size_t n, uint32_t model_hidden, uint32_t max_chunk) const {
  if (hidden != model_hidden) bad("rows of width " + str(hidden) + " for a model of width " + str(model_hidden));
  uint64_t end = 0, total = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    const MediaSpan& s = spans[i];
    if (s.length == 0 || s.start < end || uint64_t(s.start) + s.length > n)
      bad("span " + str(i) + " [" + str(s.start) + ", " + str(uint64_t(s.start) + s.length) +
          ") is empty, out of order or past the prompt's " + str(n) + " ids");
    if (s.bidirectional && s.length > max_chunk)
      bad("span " + str(i) + " of " + str(s.length) + " tokens attends bidirectionally and must be read in one "
          "step of at most " + str(max_chunk) + " tokens; load the engine with a larger prefill_chunk");
    end = uint64_t(s.start) + s.length;
    total += s.length;
  }
  if (rows.size() != total * hidden)
    bad("rows hold " + str(rows.size()) + " floats; the spans' " + str(total) + " tokens need " +
        str(total * hidden));
}

void Media::chunk(uint32_t from, uint32_t n, uint32_t pos0, std::vector<model::SoftRows>& soft,
                  std::vector<ops::AttentionBlock>& blocks) const {
  size_t offset = 0;  // rows before span i
  for (const MediaSpan& s : spans) {
    const uint32_t lo = std::max(s.start, from), hi = std::min(s.start + s.length, from + n);
    if (lo < hi) {
      soft.push_back({lo - from, hi - lo, rows.data() + (offset + lo - s.start) * hidden});
      if (s.bidirectional) blocks.push_back({pos0 + (s.start - from), pos0 + (s.start + s.length - from)});
    }
    offset += s.length;
  }
}

uint32_t Media::uncut(uint32_t from, uint32_t take, uint32_t limit) const {
  const uint32_t end = from + take;
  for (const MediaSpan& s : spans) {
    if (!s.bidirectional || s.start >= end || s.start + s.length <= end) continue;
    if (s.start > from) return s.start - from;  // the chunk ends inside s: stop before it
    return s.start + s.length - from <= limit ? s.start + s.length - from : 0;  // s from `from` on, whole
  }
  return take;
}

void check_prompt_ids(const std::vector<int32_t>& ids, uint32_t vocab, const Media* media) {
  if (ids.empty()) throw gpu::ArgumentError("engine", "token_ids", "no token ids");
  size_t span = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    while (media && span < media->spans.size() && media->spans[span].start + media->spans[span].length <= i) ++span;
    if (media && span < media->spans.size() && media->spans[span].start <= i) continue;  // a media key
    if (ids[i] < 0 || uint64_t(ids[i]) >= vocab)
      throw gpu::ArgumentError("engine", "token_ids",
                               "token id " + std::to_string(ids[i]) + " at index " + str(i) +
                                   " is out of range; the vocabulary has " + str(vocab) + " ids (0.." +
                                   str(vocab - 1) + ")");
  }
}

}  // namespace mkv::engine
