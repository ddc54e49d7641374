// Geometry of the host executor's prefill attention shape (the _h kernels of
// attention_prefill_host.metal, built for the host only), shared with
// cpp/ops/attention.cpp. Apart from attention_params.h so that changing it
// rebuilds only the kernels that use it.
#pragma once

#include "shared_params.h"

namespace mkv_params {

// A lane is one query position holding the whole rows of up to
// attn_prefill_host_rows(D) query heads of its group (registers are free on
// the host, each collective a rendezvous of 32 fibers); a threadgroup is 32
// lanes, i.e. 32 queries.
MKV_CONSTANT uint32_t kAttnPrefillHostQueries = 32;
constexpr uint32_t attn_prefill_host_rows(uint32_t head_dim) { return head_dim <= 128 ? 4 : 2; }

}  // namespace mkv_params
