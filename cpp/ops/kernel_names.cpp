#include "ops/kernel_names.h"

#include <set>

#include "ops/altup.h"
#include "ops/audio.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/kv_evict.h"
#include "ops/kv_store.h"
#include "ops/linear.h"
#include "ops/rope.h"
#include "ops/sample.h"
#include "ops/vision.h"

namespace mkv::ops {

std::vector<std::string> op_kernel_names(gpu::Device& dev) {
  std::set<std::string> names;
  for (const auto& family : {attention_kernel_names(dev), linear_kernel_names(dev), elementwise_kernel_names(dev),
                             rope_kernel_names(), kv_store_kernel_names(), kv_evict_kernel_names(),
                             sample_kernel_names(), altup_kernel_names(), vision_kernel_names(),
                             audio_kernel_names()})
    names.insert(family.begin(), family.end());
  return {names.begin(), names.end()};
}

}  // namespace mkv::ops
