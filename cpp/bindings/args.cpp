#include "bindings/args.h"

#include "engine/engine.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <limits>

namespace nb = nanobind;

namespace mkv::bindings {
namespace {

std::string py_repr(nb::handle v) { return nb::cast<std::string>(nb::repr(v)); }

[[noreturn]] void bad_type(const char* op, const char* name, nb::handle v, const char* expected) {
  throw gpu::ArgumentError(op, name, py_repr(v), expected);
}

}  // namespace

int64_t int_arg(const char* op, const char* name, nb::handle v) {
  if (PyBool_Check(v.ptr()) || !PyIndex_Check(v.ptr())) bad_type(op, name, v, "an int");
  nb::object index = nb::steal(PyNumber_Index(v.ptr()));
  if (!index.is_valid()) throw nb::python_error();
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (overflow) bad_type(op, name, v, "an int between -2**63 and 2**63 - 1");
  return x;
}

double number_arg(const char* op, const char* name, nb::handle v) {
  if (PyBool_Check(v.ptr()) || PyUnicode_Check(v.ptr()) || PyBytes_Check(v.ptr()) ||
      !(PyFloat_Check(v.ptr()) || PyIndex_Check(v.ptr()) || PyNumber_Check(v.ptr())))
    bad_type(op, name, v, "a number");
  const double x = PyFloat_AsDouble(v.ptr());
  if (x == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    bad_type(op, name, v, "a number");
  }
  return x;
}

engine::GenerateOptions generate_options(nb::handle max_tokens, nb::handle temperature, nb::handle top_k,
                                         nb::handle top_p, nb::handle min_p, nb::handle repetition_penalty,
                                         nb::handle presence_penalty, nb::handle frequency_penalty, nb::handle seed,
                                         nb::handle logprobs, nb::handle speculate, nb::handle draft_tokens) {
  engine::GenerateOptions o;
  o.max_tokens = int_arg("generate", "max_tokens", max_tokens);
  o.sampling.temperature = number_arg("sampling", "temperature", temperature);
  o.sampling.top_k = int_arg("sampling", "top_k", top_k);
  o.sampling.top_p = number_arg("sampling", "top_p", top_p);
  o.sampling.min_p = number_arg("sampling", "min_p", min_p);
  o.sampling.repetition_penalty = number_arg("sampling", "repetition_penalty", repetition_penalty);
  o.sampling.presence_penalty = number_arg("sampling", "presence_penalty", presence_penalty);
  o.sampling.frequency_penalty = number_arg("sampling", "frequency_penalty", frequency_penalty);
  if (!logprobs.is_none()) {
    const int64_t n = int_arg("generate", "logprobs", logprobs);
    engine::check_logprobs(n);  // before narrowing: 2**40 is reported as given
    o.logprobs = int32_t(n);
  }
  if (!speculate.is_none()) {
    const std::string how = PyUnicode_Check(speculate.ptr()) ? nb::cast<std::string>(speculate) : "";
    if (how != "lookup" && how != "draft")
      bad_type("generate", "speculate", speculate, "None, 'lookup' (prompt lookup) or 'draft' (the draft model)");
    o.speculate = how == "draft" ? engine::Speculate::draft : engine::Speculate::lookup;
  }
  if (!draft_tokens.is_none()) {
    if (speculate.is_none())  // nothing a caller gives is dropped unsaid
      throw gpu::ArgumentError("generate", "draft_tokens", py_repr(draft_tokens),
                               "to come with speculate='lookup' or speculate='draft' (ids proposed per step of "
                               "speculative decoding)");
    const int64_t n = int_arg("generate", "draft_tokens", draft_tokens);
    if (n < 1 || n > engine::kMaxDraftTokens)  // before narrowing
      throw gpu::ArgumentError("generate", "draft_tokens", py_repr(draft_tokens),
                               "an int in 1.." + std::to_string(engine::kMaxDraftTokens) + " (ids proposed per step)");
    o.draft_tokens = uint32_t(n);
  }
  // the seed's range is its type's: checked here, where Python's int meets uint64
  if (PyBool_Check(seed.ptr()) || !PyIndex_Check(seed.ptr())) bad_type("generate", "seed", seed, "an int in [0, 2**64)");
  nb::object index = nb::steal(PyNumber_Index(seed.ptr()));
  const unsigned long long s = PyLong_AsUnsignedLongLong(index.ptr());
  if (PyErr_Occurred()) {
    PyErr_Clear();
    bad_type("generate", "seed", seed, "an int in [0, 2**64)");
  }
  o.seed = s;
  return o;
}

std::vector<std::pair<int32_t, float>> logit_bias_arg(nb::handle bias) {
  std::vector<std::pair<int32_t, float>> out;
  if (bias.is_none()) return out;
  if (!PyDict_Check(bias.ptr())) bad_type("generate", "logit_bias", bias, "None or a dict {token id: bias}");
  for (auto [k, v] : nb::borrow<nb::dict>(bias)) {
    const int64_t id = int_arg("generate", "logit_bias", k);
    if (id < std::numeric_limits<int32_t>::min() || id > std::numeric_limits<int32_t>::max())
      bad_type("generate", "logit_bias", k, "token ids inside the vocabulary");
    out.emplace_back(int32_t(id), float(number_arg("generate", "logit_bias", v)));
  }
  return out;
}

std::vector<int32_t> token_ids_arg(nb::handle ids, uint32_t vocab, bool check) {
  using Ids64 = nb::ndarray<nb::ro, int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
  using Ids32 = nb::ndarray<nb::ro, int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
  Ids64 a;
  Ids32 b;
  if (nb::try_cast(ids, a, /*convert=*/false)) {
    if (check) engine::check_token_ids(a.data(), a.shape(0), vocab);
    for (size_t i = 0; !check && i < a.shape(0); ++i)
      if (a.data()[i] < std::numeric_limits<int32_t>::min() || a.data()[i] > std::numeric_limits<int32_t>::max())
        throw gpu::ArgumentError("engine", "token_ids", "token id " + std::to_string(a.data()[i]) + " at index " +
                                                            std::to_string(i) + " does not fit int32");
    return std::vector<int32_t>(a.data(), a.data() + a.shape(0));
  }
  if (nb::try_cast(ids, b, /*convert=*/false)) {
    if (check) engine::check_token_ids(b.data(), b.shape(0), vocab);
    return std::vector<int32_t>(b.data(), b.data() + b.shape(0));
  }
  throw gpu::ArgumentError("engine", "token_ids", "token ids must be a contiguous 1-D int64 or int32 array");
}

std::shared_ptr<const engine::Media> media_arg(nb::handle media) {
  if (media.is_none()) return nullptr;
  using Rows = nb::ndarray<nb::ro, float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
  auto m = std::make_shared<engine::Media>();
  nb::tuple t;
  Rows rows;
  if (!nb::try_cast(media, t) || t.size() != 2 || !nb::try_cast(t[1], rows, /*convert=*/false))
    throw gpu::ArgumentError("generate", "media", "(spans, rows): rows a C-contiguous 2-D float32 array");
  for (nb::handle span : nb::iter(t[0])) {
    nb::tuple st;
    uint32_t start = 0, length = 0;
    bool bidirectional = false;
    if (!nb::try_cast(span, st) || st.size() != 3 || !nb::try_cast(st[0], start) || !nb::try_cast(st[1], length) ||
        !nb::try_cast(st[2], bidirectional))
      throw gpu::ArgumentError("generate", "media", "each span is (start, length, bidirectional): ints and a bool");
    m->spans.push_back({start, length, bidirectional});
  }
  m->hidden = uint32_t(rows.shape(1));
  m->rows.assign(rows.data(), rows.data() + rows.shape(0) * rows.shape(1));
  return m;
}

void register_argument_error(nb::module_& m) {
  static PyObject* type = PyErr_NewExceptionWithDoc(
      "metalkv.ArgumentError",
      "An argument outside what it may be. A ValueError; .argument names it (Python spelling), "
      ".value and .expected say what was given and what is allowed ('' when the message says it).",
      PyExc_ValueError, nullptr);
  m.attr("ArgumentError") = nb::handle(type);
  // Registered after GpuError's translator, so it is tried first.
  nb::register_exception_translator(
      [](const std::exception_ptr& p, void*) {
        try {
          std::rethrow_exception(p);
        } catch (const gpu::ArgumentError& e) {
          nb::object err = nb::steal(PyObject_CallFunction(type, "s", e.what()));
          if (!err.is_valid()) return;  // the call set a Python error already
          err.attr("argument") = nb::str(e.argument.c_str());
          err.attr("value") = nb::str(e.value.c_str());
          err.attr("expected") = nb::str(e.expected.c_str());
          PyErr_SetObject(type, err.ptr());
        }
      });
}

}  // namespace mkv::bindings
