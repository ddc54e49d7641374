// metalkv._core.KvOptions (cpp/kv/kv_options.h): the one doorway for every KV
// option. The constructor converts Python values (a type error is an
// ArgumentError naming the keyword); ranges, defaults and merging are C++'s.
// KV_OPTIONS, KV_FORMATS and KV_POLICIES give Python the names, choices,
// defaults and help its CLI and docs show.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>

#include "bindings.h"
#include "bindings/args.h"
#include "kv/kv_options.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace mkv::bindings {
namespace {

using kv::KvField;

std::string shown(nb::handle v) { return nb::cast<std::string>(nb::repr(v)); }

std::vector<std::string> format_names(const std::string& op, const char* name, nb::handle v, bool& list) {
  const char* expected = "'f16', 'q8', 'q4' or 'q2', or a list of them (one per layer)";
  list = !nb::isinstance<nb::str>(v);
  if (!list) return {nb::cast<std::string>(v)};
  if (!nb::isinstance<nb::list>(v) && !nb::isinstance<nb::tuple>(v)) throw gpu::ArgumentError(op, name, shown(v), expected);
  std::vector<std::string> out;
  for (nb::handle x : v) {
    if (!nb::isinstance<nb::str>(x)) throw gpu::ArgumentError(op, name, shown(v), expected);
    out.push_back(nb::cast<std::string>(x));
  }
  return out;
}

// One keyword into the options (None: not given, but for kv_memory, where it means no shared pool).
void set_option(kv::KvOptions& o, const std::string& op, const std::string& key, nb::handle v) {
  const char* name = key.c_str();
  auto is_int = [&] { return !PyBool_Check(v.ptr()) && PyIndex_Check(v.ptr()); };
  if (key == "kv_memory") {
    if (v.is_none()) o.memory = 0;
    else if (nb::isinstance<nb::str>(v)) o.memory = kv::parse_kv_memory(nb::cast<std::string>(v));
    else if (is_int() && int_arg(op.c_str(), name, v) >= 0) o.memory = size_t(int_arg(op.c_str(), name, v));
    else throw gpu::ArgumentError(op, name, shown(v), "'auto', None or 0 (no shared pool), a positive int (bytes) or "
                                                     "a size such as '4GB' or '512MiB'");
    o.mark(KvField::memory);
    return;
  }
  if (v.is_none()) return;
  if (key == "kv_k") o.k = format_names(op, name, v, o.k_list), o.mark(KvField::k);
  else if (key == "kv_v") o.v = format_names(op, name, v, o.v_list), o.mark(KvField::v);
  else if (key == "kv_f16_layers") {
    const char* expected = "a list of layer indices (negative: from the last)";
    if (!nb::isinstance<nb::list>(v) && !nb::isinstance<nb::tuple>(v)) throw gpu::ArgumentError(op, name, shown(v), expected);
    o.f16_layers.clear();
    for (nb::handle x : v) {
      if (PyBool_Check(x.ptr()) || !PyIndex_Check(x.ptr())) throw gpu::ArgumentError(op, name, shown(v), expected);
      o.f16_layers.push_back(int_arg(op.c_str(), name, x));
    }
    o.mark(KvField::f16_layers);
  } else if (key == "kv_rotate") {
    if (!PyBool_Check(v.ptr())) throw gpu::ArgumentError(op, name, shown(v), "None (on for q4 and q2), True or False");
    o.rotate = v.ptr() == Py_True ? 1 : 0, o.mark(KvField::rotate);
  } else if (key == "kv_residual") o.residual = int_arg(op.c_str(), name, v), o.mark(KvField::residual);
  else if (key == "kv_policy") {
    if (!nb::isinstance<nb::str>(v))
      throw gpu::ArgumentError(op, name, shown(v), "None or one of " + kv::policy_names_text());
    o.policy = nb::cast<std::string>(v), o.mark(KvField::policy);
  } else if (key == "kv_budget") {
    o.budget_in_tokens = is_int();
    if (o.budget_in_tokens) o.budget_tokens = int_arg(op.c_str(), name, v);
    else if (PyFloat_Check(v.ptr())) o.budget_fraction = number_arg(op.c_str(), name, v);
    else throw gpu::ArgumentError(op, name, shown(v), "None, a token count >= 1 or a fraction of the context in (0, 1]");
    o.mark(KvField::budget);
  } else if (key == "kv_sinks") o.sinks = int_arg(op.c_str(), name, v), o.mark(KvField::sinks);
  else if (key == "kv_recent") o.recent = int_arg(op.c_str(), name, v), o.mark(KvField::recent);
  else if (key == "kv_window") o.window = int_arg(op.c_str(), name, v), o.mark(KvField::window);
  else if (key == "kv_prompt") {
    if (!nb::isinstance<nb::str>(v)) throw gpu::ArgumentError(op, name, shown(v), "None, 'whole' or 'stream'");
    o.prompt = kv::parse_prompt_mode(nb::cast<std::string>(v)), o.mark(KvField::prompt);
  } else {
    throw nb::type_error(("KvOptions() got an unexpected keyword argument '" + key + "'").c_str());
  }
}

// The options as a user would give them back: {kv_k: ..., ...}, None where not given.
nb::dict given(const kv::KvOptions& o) {
  nb::dict d;
  for (const kv::KvOptionInfo& row : kv::kv_option_table()) d[row.name] = nb::none();
  auto names = [](const std::vector<std::string>& v, bool list) -> nb::object {
    return list ? nb::object(nb::cast(v)) : nb::object(nb::str(v.at(0).c_str()));
  };
  if (o.has(KvField::k)) d["kv_k"] = names(o.k, o.k_list);
  if (o.has(KvField::v)) d["kv_v"] = names(o.v, o.v_list);
  if (o.has(KvField::f16_layers)) d["kv_f16_layers"] = nb::tuple(nb::cast(o.f16_layers));
  if (o.has(KvField::rotate)) d["kv_rotate"] = o.rotate == 1;
  if (o.has(KvField::residual)) d["kv_residual"] = o.residual;
  if (o.has(KvField::policy)) d["kv_policy"] = o.policy;
  if (o.has(KvField::budget))
    d["kv_budget"] = o.budget_in_tokens ? nb::object(nb::int_(o.budget_tokens)) : nb::object(nb::float_(o.budget_fraction));
  if (o.has(KvField::sinks)) d["kv_sinks"] = o.sinks;
  if (o.has(KvField::recent)) d["kv_recent"] = o.recent;
  if (o.has(KvField::window)) d["kv_window"] = o.window;
  if (o.has(KvField::prompt)) d["kv_prompt"] = kv::prompt_mode_name(o.prompt);
  if (o.has(KvField::memory)) d["kv_memory"] = o.memory == kv::kKvMemoryAuto ? nb::object(nb::str("auto")) : nb::cast(o.memory);
  return d;
}

nb::dict resolved(const kv::KvResolved& r) {
  nb::list k, v;
  for (uint32_t f : r.k_formats) k.append(kv::kv_format_name(f));
  for (uint32_t f : r.v_formats) v.append(kv::kv_format_name(f));
  nb::dict d;
  d["kv_k"] = k, d["kv_v"] = v, d["kv_rotate"] = r.rotate, d["kv_residual"] = r.residual;
  d["quantized"] = r.quantized();
  d["kv_policy"] = kv::policy_name(r.policy.kind);
  d["kv_budget"] = r.policy.budget;
  return d;
}

void bind_kv_options(nb::module_& m, nb::module_&) {
  nb::class_<kv::KvOptions>(m, "KvOptions",
                            "Every KV option a user gives (KV_OPTIONS lists them), checked at construction in the "
                            "words of `op` ('engine', 'new_cache', ...). None leaves an option to its default (a "
                            "cache's: to its engine's); kv_memory=None means no shared pool.")
      .def(
          "__init__",
          [](kv::KvOptions* self, const std::string& op, const nb::kwargs& kw) {
            kv::KvOptions o;
            for (auto [key, value] : kw) set_option(o, op, nb::cast<std::string>(key), value);
            o.check(op);
            new (self) kv::KvOptions(std::move(o));
          },
          "op"_a = "engine", "kw"_a)
      .def_prop_ro("given", &given, "The options given, as keywords ({kv_k: ..., ...}; None where not given).")
      .def(
          "resolve",
          [](const kv::KvOptions& o, uint32_t n_layers, uint32_t head_dim, uint32_t context) {
            return resolved(kv::resolve(o, n_layers, head_dim, context));
          },
          "n_layers"_a, "head_dim"_a, "context"_a,
          "What a cache of a model of n_layers layers of head_dim gets: kv_k/kv_v per layer, kv_rotate, "
          "kv_residual, quantized, kv_policy and kv_budget (tokens, of `context`). Raises ArgumentError for "
          "options that do not fit the model or do nothing without another.")
      .def(
          "caution",
          [](const kv::KvOptions& o, uint32_t n_layers, uint32_t head_dim, uint32_t context) {
            return kv::caution(kv::resolve(o, n_layers, head_dim, context));
          },
          "n_layers"_a, "head_dim"_a, "context"_a,
          "One line on what the cache costs in quality when the combination is an unsafe one (a q4 or q2 "
          "layer not rotated), else ''.")
      .def(
          "check_together", [](const kv::KvOptions& o, const std::string& op) { o.check_together(op); }, "op"_a = "engine",
          "Raises ArgumentError for options that do nothing without another (kv_budget without kv_policy, ...).")
      .def(
          "describe",
          [](const kv::KvOptions& o, uint32_t n_layers, uint32_t head_dim, uint32_t context) {
            return kv::describe(kv::resolve(o, n_layers, head_dim, context));
          },
          "n_layers"_a, "head_dim"_a, "context"_a, "'K q8, V q4, rotated, residual 128; snapkv 1024 (4 sinks)', for logs.")
      .def("__repr__", [](const kv::KvOptions& o) {
        std::string out = "KvOptions(";
        bool first = true;
        for (auto [k, v] : given(o))
          if (!v.is_none()) out += (first ? "" : ", ") + nb::cast<std::string>(k) + "=" + shown(v), first = false;
        return out + ")";
      });
  nb::list table;
  for (const kv::KvOptionInfo& row : kv::kv_option_table()) {
    nb::dict d;
    d["name"] = row.name, d["type"] = row.type, d["metavar"] = row.metavar, d["default"] = row.fallback, d["help"] = row.help;
    d["choices"] = nb::tuple(nb::cast(row.choices));
    table.append(d);
  }
  m.attr("KV_OPTIONS") = table;
  nb::dict traits;  // what Python may ask of a policy without naming it (the table is kv_policy.cpp's)
  for (const std::string& name : kv::policy_names()) {
    const kv::PolicyTraits& t = kv::policy_traits(kv::parse_policy(name));
    nb::dict d;
    d["observes"] = t.observes, d["budget_per_layer"] = t.budget_per_layer;
    traits[name.c_str()] = d;
  }
  m.attr("KV_POLICY_TRAITS") = traits;
  m.attr("KV_FORMATS") = nb::tuple(nb::cast(kv::kv_option_table().front().choices));  // kv_k's
}

}  // namespace
}  // namespace mkv::bindings

MKV_BINDING(kv_options, mkv::bindings::bind_kv_options);
