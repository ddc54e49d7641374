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
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "bindings.h"
#include "bindings/args.h"
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

// References to Python constraints the engine dropped, released where the GIL is
// held (release_pending): the engine lets a call's constraint go on its own
// thread, which must not wait for the GIL (a caller may hold it while it waits
// for the engine, or the interpreter may be finalizing).
std::mutex pending_mutex;
std::vector<PyObject*> pending;

void release_later(PyObject* o) {
  std::lock_guard<std::mutex> lock(pending_mutex);
  pending.push_back(o);
}

}  // namespace

void release_pending() {
  std::vector<PyObject*> v;
  {
    std::lock_guard<std::mutex> lock(pending_mutex);
    v.swap(pending);
  }
  for (PyObject* o : v) Py_DECREF(o);
}

std::shared_ptr<engine::Constraint> constraint_arg(nb::handle h) {
  if (h.is_none()) return nullptr;
  if (!nb::isinstance<engine::Constraint>(h))
    throw gpu::ArgumentError("generate", "constraint", nb::cast<std::string>(nb::repr(h)),
                             "None or a metalkv._core.Constraint (e.g. metalkv.Grammar(...).matcher(...))");
  release_pending();
  engine::Constraint* c = nb::cast<engine::Constraint*>(h);
  PyObject* ref = h.ptr();
  Py_INCREF(ref);
  return std::shared_ptr<engine::Constraint>(c, [ref](engine::Constraint*) { release_later(ref); });
}

namespace {

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
