#include "registry.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

namespace mkv::host {
namespace {

// Function-local so registration from other translation units' static
// initializers never runs before the map exists.
std::map<std::string, const KernelDesc*>& registry() {
  static std::map<std::string, const KernelDesc*> kernels;
  return kernels;
}

}  // namespace

KernelRegistrar::KernelRegistrar(const KernelDesc* desc) {
  auto [it, inserted] = registry().emplace(desc->name, desc);
  if (!inserted) {
    // Two kernels with one name would make pipeline lookup ambiguous; this is
    // a build mistake, caught the first time the library loads.
    std::fprintf(stderr, "metalkv: kernel '%s' is defined twice (%s:%d and %s:%d)\n", desc->name,
                 it->second->file, it->second->line, desc->file, desc->line);
    std::abort();
  }
}

const KernelDesc* find_kernel(const std::string& name) {
  auto it = registry().find(name);
  return it == registry().end() ? nullptr : it->second;
}

std::vector<std::string> kernel_names() {
  std::vector<std::string> names;
  for (const auto& [name, desc] : registry()) names.push_back(name);
  return names;
}

}  // namespace mkv::host
