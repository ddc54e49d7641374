// One bind_* function per layer, each in its own file.
#pragma once

#include <nanobind/nanobind.h>

namespace mkv::bindings {

void bind_gpu(nanobind::module_& m);

}  // namespace mkv::bindings
