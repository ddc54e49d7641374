#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>

#include "kv/encoder_session.h"
#include "ops/elementwise.h"

namespace mkv::engine {
namespace {

[[noreturn]] void fail(const std::string& m) { ops::fail("engine", m); }
std::string str(int64_t v) { return std::to_string(v); }

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

uint64_t saturating_add(uint64_t a, uint64_t b) {
  return a > std::numeric_limits<uint64_t>::max() - b ? std::numeric_limits<uint64_t>::max() : a + b;
}

bool cache_full(const kv::KVCache& cache) {
  for (uint32_t l = 0; l < cache.n_layers(); ++l)
    if (!cache.wraps(l) && cache.length(l) >= cache.spec().capacity) return true;
  return false;
}

}  // namespace

void check_generate_options(const GenerateOptions& o) {
  if (o.max_tokens < 0)
    throw gpu::ArgumentError("generate", "max_tokens", str(o.max_tokens), "an int >= 0");
  ops::validate_sampling(o.sampling);
}

Engine::Engine(gpu::DevicePtr device, std::shared_ptr<const model::Model> model, EngineOptions options)
    : device_(std::move(device)),
      queue_(device_ ? device_->new_command_queue() : nullptr),
      model_(std::move(model)),
      options_(options),
      ws_(*device_, model_->spec(), std::max<uint32_t>(options.prefill_chunk, 1)) {
  if (options_.prefill_chunk == 0) fail("prefill_chunk must be at least 1");
  if (options_.kv_memory) {
    if (options_.kv_context == 0) fail("kv_memory needs kv_context (the tokens of a sequence it is sized for)");
    const kv::KVCacheSpec c = model_->cache_spec(options_.kv_context, options_.prefill_chunk, kv::StorePath::compute);
    kv_pool_ = std::make_shared<kv::KvPool>(
        device_, kv::KvPool::for_budget(c.n_kv_heads, c.head_dim, c.windows, c.capacity, c.max_chunk,
                                        options_.kv_memory));
  }
  token_ = device_->new_buffer(sizeof(int32_t));
  sample_work_ = device_->new_buffer(size_t(model_->spec().vocab) * sizeof(float));
}

std::unique_ptr<kv::KVCache> Engine::new_cache(uint32_t capacity, kv::StorePath store) const {
  kv::KVCacheSpec spec = model_->cache_spec(capacity, options_.prefill_chunk, store);
  if (kv_pool_) return std::make_unique<kv::KVCache>(device_, kv_pool_, std::move(spec));
  return std::make_unique<kv::KVCache>(device_, std::move(spec));
}

uint32_t Engine::chunk_for(const kv::KVCache& cache) const {
  // A sliding layer's ring takes at most max_chunk tokens per store.
  uint32_t chunk = options_.prefill_chunk;
  for (uint32_t w : cache.spec().windows)
    if (w) chunk = std::min(chunk, cache.spec().max_chunk);
  return chunk;
}

void Engine::check_room(const kv::KVCache& cache, uint32_t keep, uint32_t n) const {
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

void Engine::write_penalty_ids(size_t at, const uint32_t* ids, size_t n) {
  const size_t have = penalty_ids_ ? penalty_ids_->length() / sizeof(uint32_t) : 0;
  if (at + n > have) {
    auto grown = device_->new_buffer(std::max(at + n, 2 * have) * sizeof(uint32_t));
    if (at) {
      std::vector<uint32_t> kept(at);
      penalty_ids_->read(0, kept.data(), at * sizeof(uint32_t));
      grown->write(0, kept.data(), at * sizeof(uint32_t));
    }
    penalty_ids_ = grown;
  }
  penalty_ids_->write(at * sizeof(uint32_t), ids, n * sizeof(uint32_t));
}

gpu::Counters Engine::run_step(kv::KVCache& cache, const int32_t* ids, uint32_t n, uint32_t n_logits,
                               const ops::SamplingParams* sample, float uniform, uint32_t n_penalty) {
  ws_.write_ids(ids, n);
  gpu::Counters counters;
  {
    kv::EncoderSession session(*queue_);  // the model commits every few layers (Model::encode_step)
    model_->encode_step(session, ws_, cache, n, n_logits);
    if (sample) {
      const uint32_t vocab = model_->spec().vocab;
      gpu::ComputeEncoder& enc = session.compute();
      if (sample->greedy())
        ops::argmax(*device_, enc, ws_.logits(), {token_, 0}, 1, vocab);
      else
        ops::sample(*device_, enc, ws_.logits(), {penalty_ids_, 0}, n_penalty, {sample_work_, 0}, {token_, 0},
                    vocab, *sample, uniform);
    }
    counters = session.finish();
  }
  cache.record_tokens(ids, n);
  return counters;
}

void Engine::prefill(kv::KVCache& cache, const int32_t* ids, uint32_t n, float* logits_out, const StepPoll& poll) {
  check_token_ids(ids, n, model_->spec().vocab);
  check_room(cache, cache.length(0), n);
  stats_ = Stats{};
  stats_.prompt_tokens = n;
  stats_.finish_reason = "length";
  const auto t0 = std::chrono::steady_clock::now();
  const uint32_t chunk = chunk_for(cache), vocab = model_->spec().vocab;
  const kv::KVCache::Checkpoint cp = cache.checkpoint(*queue_, cache.length(0), n);
  try {
    for (uint32_t i = 0; i < n; i += chunk) {
      if (poll && !poll()) {
        cache.restore(*queue_, cp);
        stats_.finish_reason = "cancelled";
        break;
      }
      const uint32_t m = std::min(chunk, n - i);
      // Without logits wanted, one row is the cheapest the step can make.
      stats_.prefill_counters += run_step(cache, ids + i, m, logits_out ? m : 1, nullptr, 0.0f, 0);
      ++stats_.prefill_steps;
      if (logits_out)
        ws_.read_logits(logits_out + size_t(i) * vocab, m);
    }
  } catch (...) {
    cache.restore(*queue_, cp);
    throw;
  }
  stats_.prefill_seconds = seconds_since(t0);
}

std::vector<int32_t> Engine::generate(kv::KVCache& cache, const int32_t* prompt, uint32_t n, const GenerateOptions& o,
                                      const TokenCallback& on_token, const StepPoll& poll) {
  // 1. checks, before the cache changes
  check_generate_options(o);
  check_token_ids(prompt, n, model_->spec().vocab);
  const uint32_t keep = o.keep.value_or(cache.length(0));
  check_room(cache, keep, n);

  stats_ = Stats{};
  stats_.prompt_tokens = n;
  stats_.finish_reason = "length";
  std::mt19937_64 rng(o.seed);
  auto draw = [&] { return float(rng() >> 40) * 0x1.0p-24f; };  // uniform in [0, 1), 24 bits
  const uint64_t n_store = saturating_add(n, o.max_tokens > 0 ? uint64_t(o.max_tokens - 1) : 0);
  const kv::KVCache::Checkpoint cp = cache.checkpoint(*queue_, keep, n_store);
  try {
    // 2. roll back to what the caller keeps
    if (keep < cache.length(0)) {
      try {
        cache.truncate(keep);
      } catch (const gpu::GpuError& e) {
        throw gpu::ArgumentError("generate", "cache",
                                 std::string("the cache holds a conversation this prompt does not continue and "
                                             "cannot roll it back (") + e.what() + "); pass a new cache");
      }
    }
    // 3. the prompt; its last chunk samples the first token. Repetition penalty
    // looks at every id the cache holds, the prompt, and what is generated.
    // (written only when the penalty is on: the sampler reads them only then)
    const bool penalty = o.sampling.repetition_penalty != 1.0;
    std::vector<uint32_t> pen(cache.tokens().begin(), cache.tokens().end());
    pen.insert(pen.end(), prompt, prompt + n);
    if (penalty) write_penalty_ids(0, pen.data(), pen.size());
    const uint32_t n_pen = uint32_t(pen.size());
    const auto t0 = std::chrono::steady_clock::now();
    const uint32_t chunk = chunk_for(cache);
    for (uint32_t i = 0; i < n; i += chunk) {
      if (poll && !poll()) {  // nothing generated yet: the call did not happen
        cache.restore(*queue_, cp);
        stats_.finish_reason = "cancelled";
        return {};
      }
      const uint32_t m = std::min(chunk, n - i);
      const bool last = i + m == n;
      const bool sample = last && o.max_tokens > 0;
      // A draw only where a token is sampled: the same seed gives the same
      // tokens whatever prefill_chunk is.
      stats_.prefill_counters +=
          run_step(cache, prompt + i, m, 1, sample ? &o.sampling : nullptr, sample ? draw() : 0.0f, n_pen);
      ++stats_.prefill_steps;
    }
    stats_.prefill_seconds = seconds_since(t0);
    if (o.max_tokens == 0) return {};
    // 4. decode
    return decode(cache, o, on_token, poll, draw, n_pen);
  } catch (...) {
    cache.restore(*queue_, cp);
    throw;
  }
}

std::vector<int32_t> Engine::decode(kv::KVCache& cache, const GenerateOptions& o, const TokenCallback& on_token,
                                    const StepPoll& poll, const std::function<float()>& draw, uint32_t n_pen) {
  std::vector<int32_t> out;
  const auto t1 = std::chrono::steady_clock::now();
  for (;;) {
    int32_t id = 0;
    token_->read(0, &id, sizeof id);
    if (std::find(o.stop_ids.begin(), o.stop_ids.end(), id) != o.stop_ids.end()) {
      stats_.finish_reason = "stop";
      break;
    }
    out.push_back(id);
    const uint32_t pen_id = uint32_t(id);
    if (o.sampling.repetition_penalty != 1.0) write_penalty_ids(n_pen, &pen_id, 1);
    ++n_pen;
    if (on_token && !on_token(id)) {
      stats_.finish_reason = "cancelled";
      break;
    }
    if (int64_t(out.size()) >= o.max_tokens) break;
    if (cache_full(cache)) {
      stats_.finish_reason = "context_full";
      break;
    }
    if (poll && !poll()) {
      stats_.finish_reason = "cancelled";
      break;
    }
    stats_.decode_counters += run_step(cache, &id, 1, 1, &o.sampling, draw(), n_pen);
    ++stats_.decode_steps;
  }
  stats_.decode_seconds = seconds_since(t1);
  stats_.generated_tokens = uint32_t(out.size());
  return out;
}

}  // namespace mkv::engine
