// KvCache's spec checks and its own pool (kv_cache_spec.h).
#include "kv/kv_cache_spec.h"

#include <algorithm>

#include "gpu/errors.h"
#include "kv/kv_cache_errors.h"
#include "kv/kv_policy.h"

namespace mkv::kv::detail {

// The checks of a spec that do not depend on the pool; fills in windows.
void check_spec(const gpu::DevicePtr& device, KvCacheSpec& spec) {
  if (!device) fail("device is null");
  if (spec.n_layers == 0 || spec.n_kv_heads == 0 || spec.head_dim == 0 || spec.capacity == 0)
    fail("n_layers, n_kv_heads, head_dim and capacity must be positive (got " + str(spec.n_layers) +
         ", " + str(spec.n_kv_heads) + ", " + str(spec.head_dim) + ", " + str(spec.capacity) + ")");
  if (spec.max_chunk == 0) fail("max_chunk must be at least 1");
  if (spec.windows.empty()) spec.windows.assign(spec.n_layers, 0);
  if (spec.windows.size() != spec.n_layers)
    fail("windows has " + str(spec.windows.size()) + " entries; expected one per layer (" +
         str(spec.n_layers) + "), 0 for a full layer");
  // ArgumentError(kv_k / kv_v) for formats the heads cannot take
  const KvPoolSpec pool{spec.n_kv_heads, spec.head_dim, spec.windows, {}, spec.k_formats, spec.v_formats, spec.rotate};
  pool.check_formats();
  bool quantized = false, q2 = false;
  for (uint32_t l = 0; l < spec.n_layers; ++l) {
    quantized = quantized || pool.k_format(l) != mkv_params::kKvF16 || pool.v_format(l) != mkv_params::kKvF16;
    q2 = q2 || pool.k_format(l) == mkv_params::kKvQ2K || pool.v_format(l) == mkv_params::kKvQ2V;
  }
  if (spec.residual % kBlockTokens != 0)
    throw gpu::ArgumentError("kv_cache", "kv_residual", str(spec.residual),
                             "a multiple of " + str(kBlockTokens) + " tokens (whole blocks), e.g. 128");
  if (spec.residual && !quantized)
    throw gpu::ArgumentError("kv_cache", "kv_residual", str(spec.residual),
                             "0: a residual window keeps recent tokens of a quantized cache in f16, and every "
                             "layer's K and V are f16 already");
  KvPolicySpec& policy = spec.policy;
  if (policy.evicts()) {
    if (policy.budget == 0) policy.budget = spec.capacity;
    if (policy.budget > spec.capacity)
      throw gpu::ArgumentError("kv_cache", "kv_budget", str(policy.budget),
                               "at most the capacity (" + str(spec.capacity) + " tokens)");
    // every full layer's budget (a per-layer policy's differ) within the rule's limits and the capacity
    const BudgetRange b = budget_range(policy, spec.windows);
    check_policy(policy, b.least, spec.max_chunk);
    if (b.most > spec.capacity)
      throw gpu::ArgumentError("kv_cache", "capacity", str(spec.capacity),
                               "at least the largest layer's budget (" + str(b.most) + " tokens) with kv_policy='" +
                                   policy_name(policy.kind) + "'");
    for (uint32_t l = 0; l < spec.n_layers; ++l)
      if (spec.windows[l] == 0 && pool.k_format(l) == mkv_params::kKvQ2K)
        throw gpu::ArgumentError("kv_cache", "kv_k", "'q2'",
                                 std::string("f16, q8 or q4 with kv_policy='") + policy_name(policy.kind) +
                                     "': a q2 K row shares its block's per-channel parameters, so single "
                                     "tokens cannot be evicted from it");
    if (spec.residual)
      throw gpu::ArgumentError("kv_cache", "kv_residual", str(spec.residual),
                               std::string("0 with kv_policy='") + policy_name(policy.kind) +
                                   "': the residual window's ring follows positions, which an eviction reorders");
  }
  if (q2 && !spec.residual)
    throw gpu::ArgumentError("kv_cache", "kv_residual", "0",
                             "a window of at least " + str(kBlockTokens) + " tokens (e.g. 128): q2 quantizes K per "
                             "channel over whole blocks, so the recent tokens stay f16 until their block is full");
}

std::shared_ptr<KvPool> own_pool(const gpu::DevicePtr& device, const KvCacheSpec& spec) {
  KvPoolSpec pool{spec.n_kv_heads, spec.head_dim, spec.windows,
                  KvPool::sequence_blocks(spec.windows, spec.capacity, spec.max_chunk), spec.k_formats,
                  spec.v_formats, spec.rotate};
  const KvPolicySpec& p = spec.policy;
  if (p.traits().budget_per_layer) {  // each full layer its own blocks: as many as its budget needs
    pool.split_full = true;
    const std::vector<uint32_t> group = KvPool::layer_groups(spec.windows, true);
    const std::vector<uint32_t> budgets = layer_budgets(p, spec.windows);
    pool.group_blocks.assign(*std::max_element(group.begin(), group.end()) + 1, 0);
    for (uint32_t l = 0; l < spec.n_layers; ++l) {
      const uint32_t held = spec.windows[l] || p.holds_prompts() ? spec.capacity : budgets[l];
      pool.group_blocks[group[l]] = group_blocks(spec.windows[l], held, spec.max_chunk);
    }
  }
  if (p.evicts()) {  // a sliding group goes on past the capacity (the budget): its window's span, whatever that is
    const std::vector<uint32_t> group = KvPool::layer_groups(spec.windows, pool.split_full);
    for (uint32_t l = 0; l < spec.n_layers; ++l)
      if (spec.windows[l])
        pool.group_blocks[group[l]] = std::max(pool.group_blocks[group[l]],
                                               group_blocks(spec.windows[l], ~0u, spec.max_chunk));
  }
  return std::make_shared<KvPool>(device, std::move(pool));
}


}  // namespace mkv::kv::detail
