// metalkv._core: the only doorway from Python into the C++ core.
// Nothing here touches a device at import time (stubgen imports this module);
// devices are created when Python asks for one.
#include <nanobind/nanobind.h>

#include "bindings.h"

NB_MODULE(_core, m) {
  m.doc() = "metalkv C++ core: device layer, host executor (and, later, KV cache and engine)";
  mkv::bindings::bind_gpu(m);
}
