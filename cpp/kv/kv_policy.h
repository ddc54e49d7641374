// Eviction policies (issue 15; docs/KV_POLICIES.md): which tokens a full
// layer keeps when its budget is reached. A policy is a rule over one
// (layer, KV head)'s held tokens: their positions and, for the scoring
// policies, a score per token; KvCache (kv_evict.cpp) applies it to every
// head of every full layer and compacts what it keeps.
//
// Every rule keeps, in this order:
//   1. the sinks: tokens at positions < sinks (StreamingLLM's attention sinks);
//   2. the `recent` tokens of highest position;
//   3. of the rest, the highest scores (ties: the later position; streaming,
//      which has none: the latest).
// The policies differ in recent and the score:
//   streaming  recent = everything after the sinks: the sinks and the latest tokens
//   keynorm    score = -|k| (kv_key_scores at store: keys of low norm draw the
//              most attention); recent by default 32; needs no attention scores
//   h2o        score = the attention each token received, summed over every
//              query since it was stored and over the query heads of its KV
//              head; recent by default half the budget (H2O's split)
//   snapkv     score = the attention of the last `window` queries, summed over
//              them and the group's query heads, max-pooled over `pool`
//              neighbouring positions; recent by default `window`
//   pyramidkv  snapkv's score and rule with a budget per full layer (layer_budgets)
//              that falls from the first to the last, averaging the budget
//
// When a policy evicts (KvCache, kv_evict.cpp): a cache holds at most its
// budget, except while a prompt is open (KvCache::open_prompt, which the
// engine calls for each call's prompt) with whole_prompt set: then it holds
// the whole prompt (up to its capacity) and the first store after it compresses
// to the budget. That is SnapKV as published: the prompt's last `window`
// queries (typically the question) choose what of it stays, at the price of
// a prompt-sized peak. Without whole_prompt a prompt is evicted as it is
// stored (fixed memory from the first token; the choice cannot know the
// prompt's end). snapkv defaults to whole, the others to streamed.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace mkv::kv {

enum class PolicyKind : uint32_t { none, streaming, keynorm, h2o, snapkv, pyramidkv };

// The protected recent tokens a policy keeps by default (KvPolicySpec::recent = -1).
enum class RecentRule : uint8_t { all, half_budget, window, fixed_32 };

// What sets one policy apart: a row each in kv_policy.cpp's table. Code outside
// that table asks these traits, never for a policy by name; a new policy is a
// new row (docs/KV_CACHE.md "Adding an eviction policy").
struct PolicyTraits {
  PolicyKind kind;
  const char* name;
  bool scores_keys;       // the store writes a score per token (keynorm: -|k|)
  bool scores_attention;  // the attention kernels add to a score per token
  bool observes;          // only the last `window` queries score, max-pooled over `pool` (snapkv's window)
  bool whole_prompt;      // holds each prompt whole by default (KvPolicySpec::whole_prompt = -1)
  bool budget_per_layer;  // a budget per full layer (layer_budgets), each layer in blocks of its own: its
                          // caches keep their own pools, never an engine's shared one
  RecentRule recent;
};
const PolicyTraits& policy_traits(PolicyKind kind);

struct KvPolicySpec {
  PolicyKind kind = PolicyKind::none;
  uint32_t sinks = 4;
  int64_t recent = -1;   // -1: the policy's default (above)
  uint32_t window = 32;  // snapkv, pyramidkv: the observation window (queries)
  uint32_t pool = 7;     // snapkv, pyramidkv: max-pooling width over positions (odd; 1: none)
  uint32_t budget = 0;   // the tokens a cache keeps; 0: its capacity
  int whole_prompt = -1;  // hold each prompt whole, compress after it (above); -1: the policy's default

  const PolicyTraits& traits() const { return policy_traits(kind); }
  bool evicts() const { return kind != PolicyKind::none; }
  bool observes() const { return traits().observes; }  // a window's scores
  bool holds_prompts() const { return whole_prompt < 0 ? traits().whole_prompt : whole_prompt != 0; }
};

PolicyKind parse_policy(const std::string& name);  // "" | "none" | "streaming" | ...; ArgumentError otherwise
const char* policy_name(PolicyKind kind);
std::vector<std::string> policy_names();  // every policy but none, in the table's order
std::string policy_names_text();         // "streaming, keynorm, h2o, snapkv or pyramidkv"
// Whether the policy reads a score per token (keynorm: the store writes it;
// h2o, snapkv: the attention kernels).
inline bool policy_scores_keys(PolicyKind kind) { return policy_traits(kind).scores_keys; }
inline bool policy_scores_attention(PolicyKind kind) { return policy_traits(kind).scores_attention; }
// The budget of each layer (windows: per layer, 0 = full; a sliding layer's:
// 0, it keeps its window). pyramidkv (PyramidKV's arithmetic split): with
// fixed = max(2 * window, sinks + 64) and free = budget - fixed, the i-th of F
// full layers gets fixed + hi - i * (hi - lo) / (F - 1), lo = free / 20 and
// hi = 2 * free - lo: the first twice the free part less a twentieth of it,
// the last a twentieth, about `budget` on average. The others: budget.
std::vector<uint32_t> layer_budgets(const KvPolicySpec& p, const std::vector<uint32_t>& windows);
// The smallest and largest full layer's budget (least = p.budget, most = 0 without a full layer).
struct BudgetRange {
  uint32_t least, most;
};
BudgetRange budget_range(const KvPolicySpec& p, const std::vector<uint32_t>& windows);
// The protected recent tokens for a budget of n_keep.
uint32_t policy_recent(const KvPolicySpec& p, uint32_t n_keep);
// ArgumentError for options the policy cannot take with this budget (tokens
// kept per layer) and max_chunk (most tokens one store adds).
void check_policy(const KvPolicySpec& p, uint32_t budget, uint32_t max_chunk);

// Tokens an eviction before a store of n_new keeps of a budget: room for the
// store in whole blocks, and no more than the budget less a step (in whole
// blocks), step = the budget / 16 in whole blocks, at least one: a budget of
// 2,048 evicts 128 tokens at a time, one of 512 (or below 1,024) 32, one of
// 167 (pyramidkv's top layers) 39, not the 7 to its last whole block. At
// least a block where the room allows (check_policy makes that more than the sinks).
inline uint32_t evict_step(uint32_t budget) { return std::max<uint32_t>(32, budget / 16 / 32 * 32); }
inline uint32_t evict_keep(uint32_t budget, uint32_t n_new) {
  const uint32_t room = (budget - n_new) / 32 * 32, step = evict_step(budget);
  const uint32_t below = budget > step ? (budget - step) / 32 * 32 : 0;
  return std::max(std::min(room, below), std::min<uint32_t>(room, 32));
}

// The kept indices (ascending) of one KV head holding n tokens: positions[i]
// and scores[i] (scores may be null for streaming) of index i. n_keep <= n.
std::vector<uint32_t> select_kept(const KvPolicySpec& p, const uint32_t* positions, const float* scores, uint32_t n,
                                  uint32_t n_keep);

}  // namespace mkv::kv
