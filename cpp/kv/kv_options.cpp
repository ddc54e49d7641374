// KvOptions: defaults, checks, merging and resolution (kv_options.h).
#include "kv/kv_options.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <utility>

#include "gpu/errors.h"
#include "kv/kv_layout.h"
#include "ops/rope.h"

namespace mkv::kv {
namespace {

std::string str(int64_t v) { return std::to_string(v); }
std::string quoted(const std::string& s) { return "'" + s + "'"; }
std::string names(const std::vector<std::string>& v, bool list) {
  if (!list && v.size() == 1) return quoted(v[0]);
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + quoted(v[i]);
  return out + "]";
}

constexpr int64_t kIntLimit = int64_t(1) << 31;  // counts of tokens: what a uint32 kernel argument holds

void check_count(const std::string& op, const char* name, int64_t v, int64_t least, const char* expected) {
  if (v < least || v >= kIntLimit) throw gpu::ArgumentError(op, name, str(v), expected);
}

std::vector<uint32_t> per_layer(const std::vector<std::string>& names_, bool list, uint32_t n_layers,
                                const char* what, const std::string& op) {
  if (list && names_.size() != n_layers)
    throw gpu::ArgumentError(op, what, names(names_, true), "one format per layer: " + str(n_layers) + " of them");
  std::vector<uint32_t> out;
  for (uint32_t l = 0; l < n_layers; ++l) out.push_back(parse_kv_format(list ? names_[l] : names_[0], what));
  return out;
}

}  // namespace

PromptMode parse_prompt_mode(const std::string& name) {
  if (name == "whole") return PromptMode::whole;
  if (name == "stream") return PromptMode::stream;
  throw gpu::ArgumentError("engine", "kv_prompt", quoted(name), "None, 'whole' or 'stream'");
}

const char* prompt_mode_name(PromptMode mode) {
  return mode == PromptMode::whole ? "whole" : mode == PromptMode::stream ? "stream" : "";
}

bool KvOptions::policy_given() const {
  for (KvField f : {KvField::policy, KvField::budget, KvField::sinks, KvField::recent, KvField::window,
                    KvField::prompt})
    if (has(f)) return true;
  return false;
}

KvOptions KvOptions::over(const KvOptions& base) const {
  KvOptions o = base;
  if (has(KvField::k)) o.k = k, o.k_list = k_list;
  if (has(KvField::v)) o.v = v, o.v_list = v_list;
  if (has(KvField::f16_layers)) o.f16_layers = f16_layers;
  if (has(KvField::rotate)) o.rotate = rotate;
  if (has(KvField::residual)) o.residual = residual;
  if (has(KvField::policy)) o.policy = policy;
  if (has(KvField::budget))
    o.budget_in_tokens = budget_in_tokens, o.budget_tokens = budget_tokens, o.budget_fraction = budget_fraction;
  if (has(KvField::sinks)) o.sinks = sinks;
  if (has(KvField::recent)) o.recent = recent;
  if (has(KvField::window)) o.window = window;
  if (has(KvField::prompt)) o.prompt = prompt;
  if (has(KvField::memory)) o.memory = memory;
  // A policy given here makes the base's eviction options this one's defaults, not
  // options given (check_together asks only what the user set for this policy).
  uint32_t base_given = base.given;
  if (has(KvField::policy))
    for (KvField f : {KvField::budget, KvField::sinks, KvField::recent, KvField::window, KvField::prompt})
      base_given &= ~(1u << uint32_t(f));
  o.given = base_given | given;
  return o;
}

const KvOptions& KvOptions::check(const std::string& op) const {
  for (const auto& [name, f] : {std::pair<const char*, const std::vector<std::string>*>{"kv_k", &k}, {"kv_v", &v}}) {
    if (f->empty())
      throw gpu::ArgumentError(op, name, "[]", "'f16', 'q8', 'q4' or 'q2', or a list of them (one per layer)");
    for (const std::string& n : *f) parse_kv_format(n, name);
  }
  if (residual != -1 && (residual < 0 || residual % kBlockTokens || residual >= kIntLimit))
    throw gpu::ArgumentError(op, "kv_residual", str(residual),
                             "None or an int >= 0, a multiple of 32 (tokens kept in f16)");
  parse_policy(policy);
  if (budget_in_tokens)
    check_count(op, "kv_budget", budget_tokens, 1, "None, a token count >= 1 or a fraction of the context in (0, 1]");
  else if (!(budget_fraction > 0 && budget_fraction <= 1))
    throw gpu::ArgumentError(op, "kv_budget", gpu::format_number(budget_fraction),
                             "None, a token count >= 1 or a fraction of the context in (0, 1]");
  check_count(op, "kv_sinks", sinks, 0, "an int >= 0");
  check_count(op, "kv_window", window, 1, "an int >= 1");
  if (recent != -1) check_count(op, "kv_recent", recent, 0, "None or an int >= 0 (tokens)");
  return *this;
}

const KvOptions& KvOptions::check_together(const std::string& op) const {
  const PolicyKind kind = parse_policy(policy);
  if (kind == PolicyKind::none)
    for (KvField f : {KvField::budget, KvField::sinks, KvField::recent, KvField::window, KvField::prompt})
      if (has(f)) {
        const std::string name = kv_option_table()[uint32_t(f)].name;
        throw gpu::ArgumentError(op, name, name + " does nothing without kv_policy (which keeps everything unless "
                                           "given): give kv_policy too, or leave " + name + " out");
      }
  if (kind != PolicyKind::none && has(KvField::window) && !policy_traits(kind).observes)
    throw gpu::ArgumentError(op, "kv_window", "kv_window does nothing with kv_policy '" + policy +
                                                  "' (only a policy that observes a window of queries reads it: " +
                                                  "snapkv, pyramidkv): leave kv_window out");
  return *this;
}

bool KvResolved::quantized() const {
  for (const std::vector<uint32_t>* f : {&k_formats, &v_formats})
    for (uint32_t x : *f)
      if (x != mkv_params::kKvF16) return true;
  return false;
}

KvResolved resolve(const KvOptions& o, uint32_t n_layers, uint32_t head_dim, uint32_t context,
                   const std::string& op) {
  o.check(op);
  o.check_together(op);
  KvResolved r;
  r.k_formats = per_layer(o.k, o.k_list, n_layers, "kv_k", op);
  r.v_formats = per_layer(o.v, o.v_list, n_layers, "kv_v", op);
  for (int64_t i : o.f16_layers) {
    if (i < -int64_t(n_layers) || i >= int64_t(n_layers)) {
      std::string shown = "[";
      for (size_t j = 0; j < o.f16_layers.size(); ++j) shown += (j ? ", " : "") + str(o.f16_layers[j]);
      throw gpu::ArgumentError(op, "kv_f16_layers", shown + "]",
                               "layer indices in " + str(-int64_t(n_layers)) + ".." + str(int64_t(n_layers) - 1));
    }
    const uint32_t l = uint32_t(i < 0 ? i + n_layers : i);
    r.k_formats[l] = r.v_formats[l] = mkv_params::kKvF16;
  }
  bool q2 = false, q4 = false;
  for (uint32_t l = 0; l < n_layers; ++l) {
    q2 = q2 || r.k_formats[l] == mkv_params::kKvQ2K || r.v_formats[l] == mkv_params::kKvQ2V;
    q4 = q4 || r.k_formats[l] == mkv_params::kKvQ4 || r.v_formats[l] == mkv_params::kKvQ4;
  }
  // the safe defaults (docs/KV_QUANT.md "Defaults"): 4 and 2 bits rotate, and read their recent rows in f16
  r.rotate = o.rotate >= 0 ? o.rotate == 1 : (q2 || q4) && ops::hadamard_fits(head_dim);
  KvPolicySpec& p = r.policy;
  p.kind = parse_policy(o.policy);
  r.residual = o.residual >= 0 ? uint32_t(o.residual) : q2 || (q4 && !p.evicts()) ? kDefaultResidual : 0;
  if (p.evicts()) {
    // (no context: the budget is the capacity of each cache, cache_spec)
    p.budget = uint32_t(o.budget_in_tokens ? o.budget_tokens
                        : context          ? std::max<int64_t>(1, int64_t(o.budget_fraction * double(context)))
                                           : 0);
    p.sinks = uint32_t(o.sinks);
    p.recent = o.recent;
    p.window = uint32_t(o.window);
    p.whole_prompt = int(o.prompt);
  }
  return r;
}

KvCacheSpec cache_spec(KvCacheSpec shape, const KvResolved& r, uint32_t capacity) {
  KvCacheSpec spec = std::move(shape);
  spec.capacity = capacity;
  spec.k_formats = r.k_formats;
  spec.v_formats = r.v_formats;
  spec.rotate = r.rotate;
  spec.residual = r.residual;
  spec.policy = r.policy;
  KvPolicySpec& policy = spec.policy;
  if (!policy.evicts()) return spec;
  if (!policy.budget) policy.budget = capacity;
  const BudgetRange b = budget_range(policy, spec.windows);
  const uint32_t most = std::max(b.most, policy.budget);
  spec.capacity = policy.holds_prompts() ? std::max(capacity, most) : most;
  // (the scheduler cuts a policy cache's prompt to its max_chunk)
  const uint64_t room = uint64_t(policy.sinks) + kBlockTokens;
  if (b.least > room) spec.max_chunk = uint32_t(std::min<uint64_t>(spec.max_chunk, b.least - room));
  return spec;
}

std::string caution(const KvResolved& r) {
  if (r.rotate) return "";
  for (const std::vector<uint32_t>* f : {&r.k_formats, &r.v_formats})
    for (uint32_t x : *f)
      if (x == mkv_params::kKvQ4 || x == mkv_params::kKvQ2K || x == mkv_params::kKvQ2V) {
        // measured with `metalkv ppl` (docs/KV_QUANT.md "Quality": the default model, 1,024 tokens)
        const bool q4 = x == mkv_params::kKvQ4;
        return std::string("a ") + kv_format_name(x) + " KV cache without rotation loses much more than a rotated "
               "one: " + (q4 ? "+14.1 % perplexity for q4/q4 against +3.8 % rotated (+0.14 % rotated with the "
                               "128-token window)"
                             : "+9.2 % perplexity for q2/q2 with the 128-token window against +3.4 % rotated") +
               " on held-out text with the default model (docs/KV_QUANT.md \"Defaults\"); leave kv_rotate to "
               "its default (on for q4 and q2)";
      }
  return "";
}

std::string describe(const KvResolved& r) {
  auto joined = [](const std::vector<uint32_t>& f) {
    std::string out;
    for (size_t i = 0; i < f.size(); ++i) out += (i ? "," : "") + std::string(kv_format_name(f[i]));
    return out;
  };
  const bool uniform = std::all_of(r.k_formats.begin(), r.k_formats.end(),
                                   [&](uint32_t f) { return f == r.k_formats[0]; }) &&
                       std::all_of(r.v_formats.begin(), r.v_formats.end(),
                                   [&](uint32_t f) { return f == r.v_formats[0]; });
  std::string out = uniform ? "K " + std::string(kv_format_name(r.k_formats.at(0))) + ", V " +
                                  kv_format_name(r.v_formats.at(0))
                            : "K " + joined(r.k_formats) + "; V " + joined(r.v_formats);
  if (r.rotate && r.quantized()) out += ", rotated";
  if (r.residual) out += ", residual " + str(r.residual);
  if (!r.policy.evicts()) return out;
  const std::string policy = std::string(policy_name(r.policy.kind)) + " " + str(r.policy.budget) + " (" +
                             str(r.policy.sinks) + " sinks)";
  return r.quantized() ? out + "; " + policy : policy;
}

size_t parse_kv_memory(const std::string& text) {
  const char* expected = "'auto', None or 0 (no shared pool), a positive int (bytes) or a size such as '4GB' or '512MiB'";
  auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  std::string t;  // lower case, without the spaces around the number and the unit
  size_t i = 0;
  while (i < text.size() && space(text[i])) ++i;
  size_t digits = i;
  while (digits < text.size() && (std::isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.'))
    ++digits;
  const std::string number = text.substr(i, digits - i);
  std::string unit;
  for (size_t j = digits; j < text.size(); ++j)
    if (!space(text[j])) unit += char(std::tolower(static_cast<unsigned char>(text[j])));
  const bool unit_whole = unit.empty() || text.find_first_not_of(" \t\n\r\f\v", digits) + unit.size() ==
                                              text.find_last_not_of(" \t\n\r\f\v") + 1;
  if (number.empty() && unit_whole && unit == "auto") return kKvMemoryAuto;
  static const std::pair<const char*, double> kUnits[] = {
      {"", 1},      {"b", 1},         {"kb", 1e3},       {"mb", 1e6},          {"gb", 1e9},
      {"tb", 1e12}, {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0}};
  const bool one_point = std::count(number.begin(), number.end(), '.') <= 1 && number != ".";
  for (const auto& [name, scale] : kUnits)
    if (!number.empty() && one_point && unit_whole && unit == name) {
      const double bytes = std::strtod(number.c_str(), nullptr) * scale;
      if (bytes >= 1 && bytes < 1.8e19) return size_t(bytes);
      break;
    }
  throw gpu::ArgumentError("engine", "kv_memory", quoted(text), expected);
}

const std::vector<KvOptionInfo>& kv_option_table() {
  static const std::vector<std::string> formats = [] {
    std::vector<std::string> out;
    for (uint32_t f = 0; f < mkv_params::kKvQ2V; ++f) out.push_back(kv_format_name(f));  // (q2: one name, K and V)
    return out;
  }();
  static const KvOptions d;  // the defaults, shown as the CLI shows them
  static const std::string residual = str(kDefaultResidual) + " with q4 or q2 (q4: not with --kv-policy), else 0", budget =
      gpu::format_number(d.budget_fraction), sinks = str(d.sinks), window = str(d.window);
  static const std::vector<KvOptionInfo> rows = {
      {KvField::k, "kv_k", "str", "", formats, "f16",
       "the KV cache's K format: f16, or q8/q4/q2 read in place by the attention kernels (docs/KV_QUANT.md)"},
      {KvField::v, "kv_v", "str", "", formats, "f16", "the V format, as --kv-k"},
      {KvField::f16_layers, "kv_f16_layers", "ints", "L,L,...", {}, "",
       "layers whose K and V stay f16 whatever --kv-k/--kv-v say, e.g. 0,-1 (first and last)"},
      {KvField::rotate, "kv_rotate", "bool", "", {}, "on with q4 or q2, else off",
       "store the quantized layers' K, V and queries Hadamard-rotated (spreads outlier channels)"},
      {KvField::residual, "kv_residual", "int", "N", {}, residual.c_str(),
       "keep each query's last N positions (a multiple of 32) in f16 beside a quantized cache"},
      {KvField::policy, "kv_policy", "str", "", policy_names(), "keep everything",
       "evict to keep each full layer within --kv-budget tokens, so generation never stops for a full cache "
       "(docs/KV_POLICIES.md)"},
      {KvField::budget, "kv_budget", "budget", "N|F", {}, budget.c_str(),
       "tokens a full layer keeps with --kv-policy, or a fraction of --context"},
      {KvField::sinks, "kv_sinks", "int", "N", {}, sinks.c_str(), "first positions always kept"},
      {KvField::recent, "kv_recent", "int", "N", {}, "the policy's own", "latest tokens always kept"},
      {KvField::window, "kv_window", "int", "N", {}, window.c_str(), "snapkv, pyramidkv: queries whose attention picks what stays"},
      {KvField::prompt, "kv_prompt", "str", "", {"whole", "stream"}, "whole for snapkv and pyramidkv, stream for the others",
       "whole: hold each prompt (up to --context) and compress it once read; stream: evict as it is stored"},
      {KvField::memory, "kv_memory", "str", "BYTES", {}, "auto",
       "one pool of KV blocks shared by every cache, e.g. 4GB or 512MiB; auto: a quarter of the device's "
       "memory, at most 16 sequences of --context; 0: each cache its own"},
  };
  return rows;
}

}  // namespace mkv::kv
