// CUDA command queues (streams), command buffers and encoders.
#pragma once

#include <memory>

#include "cuda_objects.h"

namespace mkv::gpu::cuda {

CommandQueuePtr make_command_queue(std::shared_ptr<CounterSink> sink);

}  // namespace mkv::gpu::cuda
