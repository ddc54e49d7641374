// Constraint (cpp/engine/constraint.h) as a Python base class: metalkv.constrain
// subclasses it around llguidance's matcher, tests around their own rules. The
// scheduler calls it from its thread; each override takes the GIL (nanobind's
// trampoline), and the mask is written through its address, so no copy of a
// 128k-id row passes through Python objects.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <nanobind/trampoline.h>

#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "bindings.h"
#include "engine/constraint.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace mkv::bindings {
namespace {

// The Python override named `name`, called with args (the GIL taken by the
// ticket); nanobind's NB_OVERRIDE macros need the C++ signature's arguments,
// and two of these pass Python-shaped ones (an address, a list).
template <class R, class... Args>
R call_python(nb::detail::trampoline& t, const char* name, Args&&... args) {
  nb::detail::ticket ticket(t, name, nb::detail::str_hash(name), /*pure=*/true);
  nb::object out = t.base().attr(ticket.key)(std::forward<Args>(args)...);
  if constexpr (!std::is_void_v<R>) return nb::cast<R>(out);
}

class PyConstraint : public engine::Constraint {
 public:
  NB_TRAMPOLINE(engine::Constraint);
  void allowed(uint32_t* words, uint32_t n_words) override {
    call_python<void>(nb_trampoline, "fill_mask", uintptr_t(words), n_words);
  }
  bool advance(int32_t id) override { return call_python<bool>(nb_trampoline, "advance", id); }
  void rollback(uint32_t n) override { call_python<void>(nb_trampoline, "rollback", n); }
  uint32_t valid_prefix(const int32_t* ids, uint32_t n) override {
    return call_python<uint32_t>(nb_trampoline, "valid_prefix", std::vector<int32_t>(ids, ids + n));
  }
  bool done() override { return call_python<bool>(nb_trampoline, "done"); }
  std::string error() override { return call_python<std::string>(nb_trampoline, "error"); }
};

void bind_constraint(nb::module_& m, nb::module_&) {
  nb::class_<engine::Constraint, PyConstraint>(
      m, "Constraint",
      "What a call may generate next (constrained decoding, docs/CONSTRAINED.md). Subclass it and give it to\n"
      "Engine._core.submit(constraint=...): the engine calls, from its own thread,\n"
      "  fill_mask(address, n_words): write the allowed next ids as a bitmask of n_words uint32 words at that\n"
      "    address (bit id % 32 of word id // 32; llguidance's layout);\n"
      "  advance(id) -> bool: the call took id (False: it cannot go on; error() says why);\n"
      "  rollback(n): take back the last n ids advanced (speculative decoding's rejected proposals);\n"
      "  valid_prefix(ids) -> int: how many of ids, in order, it would take (changes nothing);\n"
      "  done() -> bool: complete, nothing more may come (the call ends, finish_reason 'stop');\n"
      "  error() -> str.")
      .def(nb::init<>());
}

}  // namespace

MKV_BINDING(constraint, bind_constraint);

}  // namespace mkv::bindings
