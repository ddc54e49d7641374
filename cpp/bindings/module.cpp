// metalkv._core: the only doorway from Python into the C++ core.
// Nothing here touches a device at import time (stubgen imports this module);
// devices are created when Python asks for one.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "args.h"
#include "bindings.h"
#include "kv/kv_options.h"

namespace mkv::bindings {
namespace {

std::vector<std::pair<std::string, BindFn>>& registry() {
  static std::vector<std::pair<std::string, BindFn>> fns;
  return fns;
}

}  // namespace

int register_binding(const char* name, BindFn fn) {
  registry().emplace_back(name, fn);
  return 0;
}

nanobind::ndarray<nanobind::numpy> host_array(nanobind::handle owner, gpu::Buffer& buffer, size_t offset,
                                              std::vector<size_t> shape, nanobind::dlpack::dtype dtype) {
  if (shape.empty()) shape = {buffer.length() - offset};
  size_t bytes = dtype.bits / 8;
  for (size_t d : shape) bytes *= d;
  if (void* base = buffer.contents())
    return {static_cast<char*>(base) + offset, shape.size(), shape.data(), owner, nullptr, dtype};
  auto* copy = new std::vector<unsigned char>(bytes);
  buffer.read(offset, copy->data(), bytes);
  nanobind::capsule keep(copy, [](void* p) noexcept { delete static_cast<std::vector<unsigned char>*>(p); });
  return {copy->data(), shape.size(), shape.data(), keep, nullptr, dtype};
}

std::vector<uint32_t> kv_formats_arg(const std::optional<std::vector<std::string>>& names, const char* what) {
  std::vector<uint32_t> out;
  if (names)
    for (const std::string& n : *names) out.push_back(kv::parse_kv_format(n, what));
  return out;
}

namespace {
// kv_policy's "prompt": "whole" (hold each prompt, compress after it),
// "stream" (evict as it is stored) or None (the policy's default).
int prompt_arg(nanobind::handle value) {
  if (value.is_none()) return -1;
  if (!nanobind::isinstance<nanobind::str>(value))
    throw gpu::ArgumentError("kv_cache", "kv_prompt", nanobind::cast<std::string>(nanobind::repr(value)),
                             "None, 'whole' or 'stream'");
  return int(kv::parse_prompt_mode(nanobind::cast<std::string>(value)));
}
}  // namespace

kv::KvPolicySpec kv_policy_arg(const std::optional<nanobind::dict>& policy) {
  kv::KvPolicySpec p;
  if (!policy) return p;
  for (auto [key, value] : *policy) {
    const std::string k = nanobind::cast<std::string>(key);
    if (k == "policy") p.kind = kv::parse_policy(nanobind::cast<std::string>(value));
    else if (k == "budget") p.budget = uint32_t(int_arg("kv_cache", "kv_budget", value));
    else if (k == "sinks") p.sinks = uint32_t(int_arg("kv_cache", "kv_sinks", value));
    else if (k == "recent") p.recent = int_arg("kv_cache", "kv_recent", value);
    else if (k == "window") p.window = uint32_t(int_arg("kv_cache", "kv_window", value));
    else if (k == "pool") p.pool = uint32_t(int_arg("kv_cache", "kv_pool", value));
    else if (k == "prompt") p.whole_prompt = prompt_arg(value);
    else throw gpu::ArgumentError("kv_cache", "kv_policy", "a key '" + k + "'",
                                  "policy, budget, sinks, recent, window, pool and prompt");
  }
  return p;
}

void run_compute(PyDevice& dev, const std::function<void(gpu::ComputeEncoder&)>& encode) {
  nanobind::gil_scoped_release release;
  auto cb = dev.queue->command_buffer();
  auto& enc = cb->compute_encoder();
  encode(enc);
  enc.end_encoding();
  cb->commit();
  cb->wait();
}

}  // namespace mkv::bindings

NB_MODULE(_core, m) {
  m.doc() = "metalkv C++ core: device layer, host executor, KV cache, kernels and engine";
  auto ops = m.def_submodule("ops", "One entry point per kernel family, for tests and tools.");
  auto& fns = mkv::bindings::registry();
  // "gpu" first: the other layers' signatures use its classes.
  std::stable_sort(fns.begin(), fns.end(),
                   [](const auto& a, const auto& b) { return a.first == "gpu" && b.first != "gpu"; });
  for (const auto& [name, fn] : fns) fn(m, ops);
}
