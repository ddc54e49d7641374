#include "engine/engine.h"

#include <algorithm>

#include "engine/media.h"
#include "metal/sample_params.h"
#include "ops/elementwise.h"

// A verified row passes the sampler the proposals before it (Running::proposed).
static_assert(mkv::engine::kMaxDraftTokens <= mkv_params::kSampleMaxExtra,
              "the sampler's extra counted ids must hold a step's proposals");

namespace mkv::engine {
namespace {

[[noreturn]] void fail(const std::string& m) { ops::fail("engine", m); }
std::string str(int64_t v) { return std::to_string(v); }

SchedulerOptions scheduler_options(const EngineOptions& o, const gpu::Device& device) {
  return {o.prefill_chunk, o.max_seqs, o.step_tokens ? o.step_tokens : o.prefill_chunk + o.max_seqs,
          o.batch_invariant ? 0 : device.properties().gemm_decode_rows, o.preempt};
}

}  // namespace

void check_generate_options(const GenerateOptions& o) {
  if (o.max_tokens < 0)
    throw gpu::ArgumentError("generate", "max_tokens", str(o.max_tokens), "an int >= 0");
  ops::validate_sampling(o.sampling);
  check_logprobs(o.logprobs);
  if (o.speculate != Speculate::none) {
    if (o.draft_tokens < 1 || o.draft_tokens > kMaxDraftTokens)
      throw gpu::ArgumentError("generate", "draft_tokens", str(o.draft_tokens),
                               "an int in 1.." + str(kMaxDraftTokens) + " (ids proposed per step)");
  }
}

void check_logit_bias(const std::vector<std::pair<int32_t, float>>& bias, uint32_t vocab) {
  if (bias.size() > mkv_params::kSampleMaxBias)
    throw gpu::ArgumentError("generate", "logit_bias", str(bias.size()) + " entries",
                             "at most " + str(mkv_params::kSampleMaxBias) + " token ids");
  for (const auto& [id, b] : bias) {
    if (id < 0 || uint32_t(id) >= vocab)
      throw gpu::ArgumentError("generate", "logit_bias", "{" + std::to_string(id) + ": ...}",
                               "token ids in 0.." + str(vocab - 1));
    if (!(b >= -100.0f && b <= 100.0f))  // OpenAI's range; NaN fails too
      throw gpu::ArgumentError("generate", "logit_bias", "{" + std::to_string(id) + ": " + gpu::format_number(b) + "}",
                               "biases in [-100, 100]");
  }
}

void check_max_seqs(int64_t n) {
  if (n < 1 || n > kMaxSeqs)
    throw gpu::ArgumentError("engine", "max_seqs", str(n), "an int in 1.." + str(kMaxSeqs) + " (calls batched at once)");
}

void check_logprobs(int64_t n) {
  if (n < -1 || n > 20)  // 20: OpenAI's most top_logprobs
    throw gpu::ArgumentError("generate", "logprobs", str(n), "an int in 0..20, or -1/None for off");
}

size_t auto_kv_memory(gpu::Device& device, const model::Model& model, uint32_t kv_context, uint32_t max_chunk,
                      const std::vector<uint32_t>& kv_k, const std::vector<uint32_t>& kv_v) {
  const kv::KvCacheSpec c = model.cache_spec(kv_context, max_chunk, kv::StorePath::compute);
  const size_t one = kv::KvPool::pool_bytes({c.n_kv_heads, c.head_dim, c.windows,
                                             kv::KvPool::sequence_blocks(c.windows, c.capacity, c.max_chunk), kv_k,
                                             kv_v});
  const size_t share = device.properties().memory_bytes / 4;
  return std::max(3 * one, std::min(share ? share : one, kAutoKvSequences * one));
}

Engine::Engine(gpu::DevicePtr device, std::shared_ptr<const model::Model> model, EngineOptions options,
               std::shared_ptr<const model::Model> draft)
    : device_(std::move(device)), model_(std::move(model)), options_(options) {
  if (!device_) fail("device is null");
  if (draft && draft->spec().vocab != model_->spec().vocab)
    throw gpu::ArgumentError("engine", "draft", "a model of " + str(draft->spec().vocab) + " ids",
                             "a draft model with the target's vocabulary (" + str(model_->spec().vocab) + " ids)");
  if (options_.prefill_chunk == 0) fail("prefill_chunk must be at least 1");
  check_max_seqs(options_.max_seqs);
  kv_ = kv::resolve(options_.kv, model_->spec().n_kv_layers(), model_->spec().head_dim, options_.kv_context);
  size_t& memory = options_.kv.memory;
  // a policy with per-layer budgets keeps each cache's own pool: no default shared one beside them
  if (memory == kv::kKvMemoryAuto && kv_.policy.traits().budget_per_layer) memory = 0;
  if (memory) {
    if (options_.kv_context == 0) fail("kv_memory needs kv_context (the tokens of a sequence it is sized for)");
    const kv::KvCacheSpec c = kv::cache_spec(
        model_->cache_spec(options_.kv_context, options_.prefill_chunk, kv::StorePath::compute), kv_,
        options_.kv_context);
    const kv::KvPoolSpec shape{c.n_kv_heads, c.head_dim, c.windows, {}, c.k_formats, c.v_formats, c.rotate};
    // kv_memory holds the blocks and every sequence's own buffers (rings, table
    // mirrors: kv_budget.h). The auto budget adds room for max_seqs of them to
    // its blocks; a given one keeps that room out of the pool, at most half of it.
    const size_t one = kv::KvCache::own_bytes_to_run(c, shape);
    size_t own = size_t(options_.max_seqs) * one;
    if (memory == kv::kKvMemoryAuto)  // (and one blit path's staging: new_cache(store="blit"), one at a time)
      memory = auto_kv_memory(*device_, *model_, options_.kv_context, options_.prefill_chunk, kv_.k_formats,
                              kv_.v_formats) + (own += kv::KvCache::staging_bytes(c, shape));
    else
      own = std::min(own, std::max(one, memory / 2));
    kv_pool_ = std::make_shared<kv::KvPool>(
        device_, kv::KvPool::for_budget(shape, c.capacity, c.max_chunk, memory, own),
        std::make_shared<kv::KvBudget>(memory));
  }
  scheduler_ = std::make_unique<Scheduler>(device_, model_, scheduler_options(options_, *device_), std::move(draft));
}

std::unique_ptr<kv::KvCache> Engine::new_cache(uint32_t capacity, kv::StorePath store, const kv::KvOptions* own) const {
  // a cache's own eviction options take its budget's fraction of its capacity, the engine's of kv_context
  const kv::KvResolved r = !own ? kv_
                           : kv::resolve(own->over(options_.kv), model_->spec().n_kv_layers(), model_->spec().head_dim,
                                         own->policy_given() ? capacity : options_.kv_context, "new_cache");
  kv::KvCacheSpec spec = kv::cache_spec(model_->cache_spec(capacity, options_.prefill_chunk, store), r, capacity);
  if (kv_pool_ && !r.policy.traits().budget_per_layer) {
    kv_pool_->spec().check_serves(spec.k_formats, spec.v_formats, spec.rotate, "engine");
    return std::make_unique<kv::KvCache>(device_, kv_pool_, std::move(spec));
  }
  return std::make_unique<kv::KvCache>(device_, std::move(spec));
}

void Engine::check_room(const kv::KvCache& cache, uint32_t keep, uint32_t n) const {
  model_->check_cache(cache);
  if (keep > cache.length(0))
    throw gpu::ArgumentError("generate", "keep", "cannot keep " + str(keep) + " tokens of a cache that holds " +
                                                     str(cache.length(0)));
  for (uint32_t l = 0; l < cache.n_layers(); ++l)
    if (!cache.wraps(l) && uint64_t(keep) + n > cache.spec().capacity)
      throw gpu::ArgumentError("engine", "prompt",
                               str(n) + " tokens do not fit: the cache holds " + str(cache.spec().capacity) + " and " +
                                   str(keep) + " are used; use a larger cache (new_cache(capacity=...) or "
                                   "Engine.load(context=...)) or a shorter prompt");
}

void Engine::check_media(const kv::KvCache& cache, const std::vector<int32_t>& prompt, const Media* media) const {
  // (the spans first: the ids' check walks them in order)
  if (media) media->check(prompt.size(), model_->spec().hidden, chunk_cap(cache, options_.prefill_chunk));
  check_prompt_ids(prompt, model_->spec().vocab, media);
  if (!media) return;
  const bool blocks = std::any_of(media->spans.begin(), media->spans.end(), [](const MediaSpan& s) {
    return s.bidirectional;
  });
  if (blocks && cache.spec().policy.kind != kv::PolicyKind::none)
    throw gpu::ArgumentError("generate", "media",
                             "an image whose tokens see each other (Gemma 3) needs a cache without an eviction "
                             "policy (kv_policy)");
}

std::shared_ptr<Request> Engine::queue(Job job, std::shared_ptr<Channel> channel) {
  if (!channel) channel = std::make_shared<Channel>();
  job.request = std::make_shared<Request>(std::move(channel), scheduler_->wakeup());
  std::shared_ptr<Request> request = job.request;
  scheduler_->submit(std::move(job));
  return request;
}

std::shared_ptr<Request> Engine::submit(kv::KvCache& cache, std::vector<int32_t> prompt, const GenerateOptions& o,
                                        std::shared_ptr<Channel> channel) {
  check_generate_options(o);
  check_media(cache, prompt, o.media.get());
  check_logit_bias(o.logit_bias, model_->spec().vocab);
  check_room(cache, o.keep.value_or(cache.length(0)), uint32_t(prompt.size()));
  if (o.speculate == Speculate::draft && !scheduler_->has_draft())
    throw gpu::ArgumentError("generate", "speculate", "'draft'",
                             "an engine loaded with a draft model (Engine.load(draft=...), --draft-model)");
  Job job;
  job.cache = &cache;
  job.prompt = std::move(prompt);
  job.options = o;
  return queue(std::move(job), std::move(channel));
}

std::shared_ptr<Request> Engine::submit_logits(kv::KvCache& cache, std::vector<int32_t> ids,
                                               const GenerateOptions& options, std::shared_ptr<Channel> channel) {
  check_media(cache, ids, options.media.get());
  check_room(cache, cache.length(0), uint32_t(ids.size()));
  Job job;
  job.cache = &cache;
  job.prompt = std::move(ids);
  job.logits = true;
  job.options.media = options.media;
  job.options.hold_at_step = options.hold_at_step;
  job.options.ephemeral = options.ephemeral;
  return queue(std::move(job), std::move(channel));
}

}  // namespace mkv::engine
