// KvOptions: every KV cache option a user sets, whatever the door (the CLI's
// --kv-* flags, Engine.load and new_cache's kv_* keywords, a saved cache's
// metadata, `metalkv serve`): each default and each check is written here once.
// Python reads the names, choices, defaults and help from kv_option_table()
// (_core.KV_OPTIONS) and forwards values; the binding only converts types.
//
// A cache's options over its engine's: the fields a user gave (`given`) win,
// the rest come from the engine (over()). resolve() turns options into what a
// cache of one model is made of: a format per layer for K and V, the residual
// window, and the eviction policy with its budget in tokens.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kv/kv_cache.h"
#include "kv/kv_policy.h"

namespace mkv::kv {

inline constexpr size_t kKvMemoryAuto = ~size_t(0);  // KvOptions::memory: the engine picks (auto_kv_memory)
// The residual window a q2 cache (KIVI's window) and a q4 cache get unless told
// (docs/KV_QUANT.md "Defaults": measured with `metalkv ppl`).
inline constexpr uint32_t kDefaultResidual = 128;

enum class PromptMode : int32_t { policy_default = -1, stream = 0, whole = 1 };
PromptMode parse_prompt_mode(const std::string& name);  // "whole" | "stream"; ArgumentError("kv_prompt")
const char* prompt_mode_name(PromptMode mode);          // "" (the policy's) | "whole" | "stream"

// One bit per option (KvOptions::given), in kv_option_table()'s order.
enum class KvField : uint32_t { k, v, f16_layers, rotate, residual, policy, budget, sinks, recent, window, prompt,
                                memory, count };

struct KvOptions {
  // K and V formats: one name for every layer, or one per layer (kv_format_names()).
  std::vector<std::string> k{"f16"}, v{"f16"};
  bool k_list = false, v_list = false;  // given as a list: one per layer (else one name, every layer)
  std::vector<int64_t> f16_layers;  // layers whose K and V stay f16; negative: from the last
  // Hadamard-rotate the quantized layers (LayerLayout::rotate): 1, 0, or -1 (not
  // given): on where a layer is q4 or q2 and the head_dim has the transform.
  int rotate = -1;
  // Tokens read as f16 beside a quantized cache; -1 (not given): kDefaultResidual
  // with q2, and with q4 unless an eviction policy runs (the two do not go together); else 0.
  int64_t residual = -1;
  std::string policy = "none";      // "none" or a policy_names_text() name
  bool budget_in_tokens = false;    // budget_tokens, else budget_fraction of the context
  int64_t budget_tokens = 0;        // tokens each full layer keeps
  double budget_fraction = 0.25;
  int64_t sinks = 4;
  int64_t recent = -1;  // -1: the policy's default
  int64_t window = 32;
  PromptMode prompt = PromptMode::policy_default;
  size_t memory = kKvMemoryAuto;  // the engine's shared pool: bytes, kKvMemoryAuto, or 0 (each cache its own)
  uint32_t given = 0;             // KvField bits the user set

  bool has(KvField f) const { return given >> uint32_t(f) & 1u; }
  void mark(KvField f) { given |= 1u << uint32_t(f); }
  // Whether any eviction option was given (a cache's own budget is then of its capacity).
  bool policy_given() const;
  // These options where given, `base`'s elsewhere.
  KvOptions over(const KvOptions& base) const;
  // ArgumentError("[op] kv_...=value: expected ...") for the first bad option, in the user's names.
  const KvOptions& check(const std::string& op = "engine") const;
  // Options that do nothing without another, refused (ArgumentError naming the first):
  // the eviction ones without kv_policy, kv_window without a policy that observes. For a
  // whole set (an engine's, or a cache's over its engine's): resolve() runs it.
  const KvOptions& check_together(const std::string& op = "engine") const;
};

// A cache's options resolved for a model of n_layers layers of head_dim (KvCacheSpec's KV fields).
struct KvResolved {
  std::vector<uint32_t> k_formats, v_formats;  // kv_format.h numbers, one per layer
  bool rotate = false;
  uint32_t residual = 0;
  KvPolicySpec policy;  // budget in tokens (of `context`)
  bool quantized() const;
};
// Checks layer-dependent options (kv_f16_layers' range, kv_k lists' length) and check_together too.
KvResolved resolve(const KvOptions& o, uint32_t n_layers, uint32_t head_dim, uint32_t context,
                   const std::string& op = "engine");

// One line on what a resolved cache costs in quality when it is a combination the
// measurements call unsafe (a q4 or q2 layer not rotated); "" otherwise. The engine
// warns with it (docs/KV_QUANT.md "Defaults").
std::string caution(const KvResolved& r);

// The cache a model shape (`shape`: layers, heads, windows, max_chunk, store) holds with
// these options for `capacity` tokens. With a policy its full layers hold the budget (the
// largest layer's), or with whole prompts the larger of budget and capacity (a prompt's
// peak); a budget too small for a prefill chunk's room takes smaller chunks.
KvCacheSpec cache_spec(KvCacheSpec shape, const KvResolved& r, uint32_t capacity);

// "K q8, V q4, rotated, residual 128" or per layer where they differ; with a policy
// "; snapkv 1024 (4 sinks)" after them (an f16 cache's: that alone). For logs and the CLI.
std::string describe(const KvResolved& r);

// kv_memory as bytes: "auto" -> kKvMemoryAuto, "0" -> 0, "4GB", "512 MiB", "1.5gb" (decimal
// kB..TB, binary KiB..TiB). ArgumentError("kv_memory") otherwise.
size_t parse_kv_memory(const std::string& text);

// One row per option, for the CLI's flags, the bindings' keywords and the docs.
struct KvOptionInfo {
  KvField field;
  const char* name;     // the keyword: "kv_k"; the flag is "--kv-k"
  const char* type;     // how a flag's text reads: "str", "int", "bool", "ints" (0,-1), "budget" (N or F)
  const char* metavar;  // "" for a flag without a value (kv_rotate) or one with choices
  std::vector<std::string> choices;  // {"f16", "q8", "q4", "q2"}, or none: any value of its type
  const char* fallback;  // the default as the CLI shows it
  const char* help;
};
const std::vector<KvOptionInfo>& kv_option_table();

}  // namespace mkv::kv
