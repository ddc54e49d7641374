// Kernels compiled for the host executor register themselves here at static
// initialization (see kernel_abi.h, KernelRegistrar).
#pragma once

#include <string>
#include <vector>

#include "kernel_abi.h"

namespace mkv::host {

// nullptr if no kernel has that name.
const KernelDesc* find_kernel(const std::string& name);
std::vector<std::string> kernel_names();

}  // namespace mkv::host
