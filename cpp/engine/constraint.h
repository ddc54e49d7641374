// Constraint: what a call may generate next, for constrained decoding
// (docs/CONSTRAINED.md): a grammar matcher (JSON schema, regex, Lark) that the
// scheduler asks for the allowed next ids, as a token bitmask the sampler
// applies on the device, and tells of every id the call takes. The engine
// holds none of its own: metalkv.constrain wraps llguidance's LLMatcher in one
// (a Python subclass through the bindings' trampoline); tests write others.
//
// Calls come from the scheduler's thread, in this order per step: valid_prefix
// (trims a speculating call's proposals, plan time), allowed (after the step's
// forward pass is committed, while the device runs it: the mask costs no step
// time when it is ready first), then advance for each id taken. A verified
// segment's row i is masked after advancing its proposals 1..i, which rollback
// takes back before the ids taken are advanced.
#pragma once

#include <cstdint>
#include <string>

namespace mkv::engine {

class Constraint {
 public:
  virtual ~Constraint() = default;
  // The ids allowed next: bit id % 32 of words[id / 32], n_words = ceil(vocab / 32).
  virtual void allowed(uint32_t* words, uint32_t n_words) = 0;
  // Takes id (one the last mask allowed); false: the constraint cannot go on (error()).
  virtual bool advance(int32_t id) = 0;
  // Takes back the last n ids advanced.
  virtual void rollback(uint32_t n) = 0;
  // How many of ids, in order, it would take from here (changes nothing).
  virtual uint32_t valid_prefix(const int32_t* ids, uint32_t n) = 0;
  // Complete, and nothing more may come: the call ends ("stop").
  virtual bool done() = 0;
  // What went wrong, once advance failed or a mask allowed nothing.
  virtual std::string error() = 0;
};

}  // namespace mkv::engine
