// Eviction policies: names, checks and the selection rule (kv_policy.h).
#include "kv/kv_policy.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "gpu/errors.h"

namespace mkv::kv {
namespace {

constexpr const char* kOp = "kv_policy";

// One row per policy (PolicyTraits): every difference between policies is here.
//   kind, name, scores_keys, scores_attention, observes, whole_prompt, budget_per_layer, recent
constexpr PolicyTraits kNone{PolicyKind::none, "none", false, false, false, false, false, RecentRule::fixed_32};
constexpr PolicyTraits kPolicies[] = {
    {PolicyKind::streaming, "streaming", false, false, false, false, false, RecentRule::all},
    {PolicyKind::keynorm, "keynorm", true, false, false, false, false, RecentRule::fixed_32},
    {PolicyKind::h2o, "h2o", false, true, false, false, false, RecentRule::half_budget},
    {PolicyKind::snapkv, "snapkv", false, true, true, true, false, RecentRule::window},
    {PolicyKind::pyramidkv, "pyramidkv", false, true, true, true, true, RecentRule::window}};

std::string str(uint64_t v) { return std::to_string(v); }

}  // namespace

const PolicyTraits& policy_traits(PolicyKind kind) {
  for (const PolicyTraits& p : kPolicies)
    if (kind == p.kind) return p;
  return kNone;
}

PolicyKind parse_policy(const std::string& name) {
  if (name.empty() || name == "none") return PolicyKind::none;
  for (const PolicyTraits& p : kPolicies)
    if (name == p.name) return p.kind;
  throw gpu::ArgumentError(kOp, "kv_policy", "'" + name + "'", "None or one of " + policy_names_text());
}

const char* policy_name(PolicyKind kind) { return policy_traits(kind).name; }

std::vector<std::string> policy_names() {
  std::vector<std::string> out;
  for (const PolicyTraits& p : kPolicies) out.push_back(p.name);
  return out;
}

std::string policy_names_text() {
  std::string out;
  for (size_t i = 0; i < std::size(kPolicies); ++i)
    out += (i == 0 ? "" : i + 1 == std::size(kPolicies) ? " or " : ", ") + std::string(kPolicies[i].name);
  return out;
}

std::vector<uint32_t> layer_budgets(const KvPolicySpec& p, const std::vector<uint32_t>& windows) {
  std::vector<uint32_t> out(windows.size(), 0);
  const uint32_t n_full = uint32_t(std::count(windows.begin(), windows.end(), 0u));
  const uint64_t fixed = std::max<uint64_t>(2 * uint64_t(p.window), uint64_t(p.sinks) + 64);
  const bool pyramid = p.traits().budget_per_layer && n_full > 1 && p.budget > fixed;
  const uint64_t free = pyramid ? p.budget - fixed : 0, lo = free / 20, hi = 2 * free - lo;
  for (uint32_t l = 0, i = 0; l < windows.size(); ++l) {
    if (windows[l] != 0) continue;
    out[l] = pyramid ? uint32_t(fixed + hi - i * (hi - lo) / (n_full - 1)) : p.budget;
    ++i;
  }
  return out;
}

BudgetRange budget_range(const KvPolicySpec& p, const std::vector<uint32_t>& windows) {
  BudgetRange r{p.budget, 0};
  for (uint32_t b : layer_budgets(p, windows))
    if (b) r.least = std::min(r.least, b), r.most = std::max(r.most, b);
  return r;
}

uint32_t policy_recent(const KvPolicySpec& p, uint32_t n_keep) {
  const uint32_t free = n_keep > p.sinks ? n_keep - p.sinks : 0;
  const RecentRule rule = p.traits().recent;
  if (rule == RecentRule::all) return free;
  const int64_t want = p.recent >= 0                        ? p.recent
                       : rule == RecentRule::half_budget ? int64_t(n_keep / 2)
                       : rule == RecentRule::window      ? int64_t(p.window)
                                                           : 32;
  return uint32_t(std::min<int64_t>(want, free));
}

void check_policy(const KvPolicySpec& p, uint32_t budget, uint32_t max_chunk) {
  if (p.kind == PolicyKind::none) return;
  // An eviction before a store keeps budget - max_chunk tokens or more (rounded
  // down to whole blocks): the sinks and at least one block besides them.
  const uint64_t least = uint64_t(p.sinks) + max_chunk + 32;
  if (budget < least)
    throw gpu::ArgumentError(kOp, "kv_budget", str(budget),
                             "at least kv_sinks + the store's most tokens (max_chunk) + 32 = " + str(least) +
                                 " tokens for kv_policy='" + policy_name(p.kind) +
                                 "' (an eviction keeps room for a whole chunk)");
  if (p.observes() && (p.window == 0 || p.window > budget / 2))
    throw gpu::ArgumentError(kOp, "kv_window", str(p.window), "1 .. kv_budget / 2 (" + str(budget / 2) + ") queries");
  if (p.observes() && (p.pool == 0 || p.pool % 2 == 0))
    throw gpu::ArgumentError(kOp, "kv_pool", str(p.pool), "an odd width >= 1 (1: no pooling)");
  if (p.recent < -1) throw gpu::ArgumentError(kOp, "kv_recent", std::to_string(p.recent), "None or >= 0 tokens");
}

std::vector<uint32_t> select_kept(const KvPolicySpec& p, const uint32_t* positions, const float* scores, uint32_t n,
                                  uint32_t n_keep) {
  std::vector<uint32_t> out;
  if (n_keep >= n) {
    out.resize(n);
    std::iota(out.begin(), out.end(), 0u);
    return out;
  }
  if (!scores && p.traits().recent != RecentRule::all)
    throw gpu::GpuError(std::string("[") + kOp + "] " + policy_name(p.kind) + " selects by score; none given");
  // Selections, not sorts: an eviction runs this for every head of every layer.
  std::vector<uint8_t> keep(n, 0);
  uint32_t kept = 0;
  std::vector<uint32_t> rest;
  rest.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {  // 1. sinks (in index order)
    if (positions[i] < p.sinks && kept < n_keep) keep[i] = 1, ++kept;
    else rest.push_back(i);
  }
  const auto later = [&](uint32_t a, uint32_t b) { return positions[a] > positions[b]; };
  auto take = [&](uint32_t count, auto&& before) {  // marks the first `count` of rest by `before`, drops them
    count = std::min<uint32_t>(count, uint32_t(rest.size()));
    if (count == 0) return;
    if (count < rest.size()) std::nth_element(rest.begin(), rest.begin() + count, rest.end(), before);
    for (uint32_t j = 0; j < count; ++j) keep[rest[j]] = 1;
    kept += count;
    rest.erase(rest.begin(), rest.begin() + count);
  };
  take(std::min(policy_recent(p, n_keep), n_keep - kept), later);  // 2. the latest
  if (kept < n_keep) {  // 3. the highest (pooled) scores, the later first on ties; streaming: the latest
    if (!scores) {
      take(n_keep - kept, later);
    } else {
      std::vector<float> s(scores, scores + n);
      if (p.observes() && p.pool > 1) {  // max over neighbouring positions
        std::vector<uint64_t> keyed(n);  // (position, index) in one word: a plain integer sort
        for (uint32_t i = 0; i < n; ++i) keyed[i] = uint64_t(positions[i]) << 32 | i;
        std::sort(keyed.begin(), keyed.end());
        std::vector<uint32_t> by_pos(n);
        for (uint32_t j = 0; j < n; ++j) by_pos[j] = uint32_t(keyed[j]);
        const uint32_t half = p.pool / 2;
        std::vector<float> in_order(n + 2 * half, -INFINITY);  // padded: every window is whole
        for (uint32_t j = 0; j < n; ++j) in_order[half + j] = scores[by_pos[j]];
        for (uint32_t j = 0; j < n; ++j) {
          float m = in_order[j];
          for (uint32_t k = 1; k < p.pool; ++k) m = std::max(m, in_order[j + k]);
          s[by_pos[j]] = m;
        }
      }
      take(n_keep - kept, [&](uint32_t a, uint32_t b) { return s[a] != s[b] ? s[a] > s[b] : positions[a] > positions[b]; });
    }
  }
  for (uint32_t i = 0; i < n; ++i)
    if (keep[i]) out.push_back(i);
  return out;
}

}  // namespace mkv::kv
