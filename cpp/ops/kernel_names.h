// Every kernel name the ops can build on a device: the union of each op
// family's list (attention_kernel_names, linear_kernel_names, ...), each made
// by that family's own name builder. tests/gpu/test_kernel_names.py holds it
// against the device's library both ways: every name exists, and every kernel
// but the test kernels (metal/test) is one of these.
#pragma once

#include <string>
#include <vector>

#include "gpu/device.h"

namespace mkv::ops {

// Sorted, each once (metalkv._core.ops.kernel_names(device)).
std::vector<std::string> op_kernel_names(gpu::Device& dev);

}  // namespace mkv::ops
