#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "kv/encoder_session.h"
#include "ops/elementwise.h"

namespace mkv::engine {
namespace {

[[noreturn]] void fail(const std::string& m) { ops::fail("engine", m); }
std::string str(int64_t v) { return std::to_string(v); }

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool greedy(const ops::SamplingParams& s) { return s.temperature == 0.0f && s.repetition_penalty == 1.0f; }

}  // namespace

Engine::Engine(gpu::DevicePtr device, std::shared_ptr<const model::Model> model, EngineOptions options)
    : device_(std::move(device)),
      queue_(device_ ? device_->new_command_queue() : nullptr),
      model_(std::move(model)),
      options_(options),
      ws_(*device_, model_->spec(), std::max<uint32_t>(options.prefill_chunk, 1)) {
  if (options_.prefill_chunk == 0) fail("prefill_chunk must be at least 1");
  token_ = device_->new_buffer(sizeof(int32_t));
  sample_work_ = device_->new_buffer(size_t(model_->spec().vocab) * sizeof(float));
}

std::unique_ptr<kv::KVCache> Engine::new_cache(uint32_t capacity, kv::StorePath store) const {
  return std::make_unique<kv::KVCache>(device_, model_->cache_spec(capacity, options_.prefill_chunk, store));
}

uint32_t Engine::chunk_for(const kv::KVCache& cache) const {
  // A sliding layer's ring takes at most max_chunk tokens per store.
  uint32_t chunk = options_.prefill_chunk;
  for (uint32_t w : cache.spec().windows)
    if (w) chunk = std::min(chunk, cache.spec().max_chunk);
  return chunk;
}

void Engine::check_ids(const int32_t* ids, uint32_t n) const {
  const uint32_t vocab = model_->spec().vocab;
  for (uint32_t i = 0; i < n; ++i)
    if (ids[i] < 0 || uint32_t(ids[i]) >= vocab)
      fail("token id " + str(ids[i]) + " at index " + str(i) + " is out of range; the vocabulary has " +
           str(vocab) + " ids (0.." + str(vocab - 1) + ")");
}

void Engine::check_room(const kv::KVCache& cache, uint32_t n) const {
  model_->check_cache(cache);
  const uint32_t held = cache.length(0);
  for (uint32_t l = 0; l < cache.n_layers(); ++l)
    if (!cache.wraps(l) && uint64_t(held) + n > cache.slots(l))
      fail("the prompt has " + str(n) + " tokens but the cache holds " + str(cache.slots(l)) + " (" + str(held) +
           " already used); create a larger cache (capacity / context) or shorten the prompt");
}

gpu::Counters Engine::run_step(kv::KVCache& cache, const int32_t* ids, uint32_t n, uint32_t n_logits,
                               const ops::SamplingParams* sample, float uniform, uint32_t n_penalty) {
  std::memcpy(ws_.ids(), ids, n * sizeof(int32_t));
  auto cb = queue_->command_buffer();
  {
    kv::EncoderSession session(*cb);
    model_->encode_step(session, ws_, cache, n, n_logits);
    if (sample) {
      const uint32_t vocab = model_->spec().vocab;
      gpu::ComputeEncoder& enc = session.compute();
      if (greedy(*sample))
        ops::argmax(*device_, enc, ws_.logits(), {token_, 0}, 1, vocab);
      else
        ops::sample(*device_, enc, ws_.logits(), {penalty_ids_, 0}, n_penalty, {sample_work_, 0}, {token_, 0},
                    vocab, *sample, uniform);
    }
    session.end();
  }
  cb->commit();
  cb->wait();
  return cb->counters();
}

void Engine::prefill(kv::KVCache& cache, const int32_t* ids, uint32_t n, float* logits_out) {
  check_ids(ids, n);
  check_room(cache, n);
  stats_ = Stats{};
  stats_.prompt_tokens = n;
  const auto t0 = std::chrono::steady_clock::now();
  const uint32_t chunk = chunk_for(cache), vocab = model_->spec().vocab;
  for (uint32_t i = 0; i < n; i += chunk) {
    const uint32_t m = std::min(chunk, n - i);
    // Without logits wanted, one row is the cheapest the step can make.
    stats_.prefill_counters += run_step(cache, ids + i, m, logits_out ? m : 1, nullptr, 0.0f, 0);
    ++stats_.prefill_steps;
    if (logits_out) std::memcpy(logits_out + size_t(i) * vocab, ws_.logits_host(), size_t(m) * vocab * sizeof(float));
  }
  stats_.prefill_seconds = seconds_since(t0);
}

std::vector<int32_t> Engine::generate(kv::KVCache& cache, std::vector<int32_t>& history, const int32_t* prompt,
                                      uint32_t n, const GenerateOptions& o, const TokenCallback& on_token) {
  if (n == 0) fail("generate needs at least one prompt token");
  ops::validate_sampling(o.sampling);
  check_ids(prompt, n);
  check_room(cache, n);
  if (o.max_tokens == 0) {  // just feed the prompt
    prefill(cache, prompt, n, nullptr);
    history.insert(history.end(), prompt, prompt + n);
    stats_.finish_reason = "length";
    return {};
  }
  stats_ = Stats{};
  stats_.prompt_tokens = n;
  std::mt19937_64 rng(o.seed);
  auto draw = [&] { return float(rng() >> 40) * 0x1.0p-24f; };  // uniform in [0, 1), 24 bits

  // Every id the penalty may look at: what the cache holds, the prompt, and what is generated.
  const size_t most = history.size() + n + o.max_tokens;
  if (!penalty_ids_ || penalty_ids_->length() < most * sizeof(uint32_t))
    penalty_ids_ = device_->new_buffer(std::max<size_t>(most, 1) * sizeof(uint32_t));
  uint32_t* pen = static_cast<uint32_t*>(penalty_ids_->contents());
  uint32_t n_pen = 0;
  for (int32_t id : history) pen[n_pen++] = uint32_t(id);
  for (uint32_t i = 0; i < n; ++i) pen[n_pen++] = uint32_t(prompt[i]);

  std::vector<int32_t> out;
  stats_.finish_reason = "length";
  const auto t0 = std::chrono::steady_clock::now();
  const uint32_t chunk = chunk_for(cache);
  for (uint32_t i = 0; i < n; i += chunk) {  // the last chunk samples the first token
    const uint32_t m = std::min(chunk, n - i);
    const bool last = i + m == n;
    stats_.prefill_counters += run_step(cache, prompt + i, m, 1, last ? &o.sampling : nullptr, draw(), n_pen);
    ++stats_.prefill_steps;
  }
  history.insert(history.end(), prompt, prompt + n);
  stats_.prefill_seconds = seconds_since(t0);

  const auto t1 = std::chrono::steady_clock::now();
  for (;;) {
    const int32_t id = *static_cast<const int32_t*>(token_->contents());
    if (std::find(o.stop_ids.begin(), o.stop_ids.end(), id) != o.stop_ids.end()) {
      stats_.finish_reason = "stop";
      break;
    }
    out.push_back(id);
    pen[n_pen++] = uint32_t(id);
    if (on_token && !on_token(id)) {
      stats_.finish_reason = "callback";
      break;
    }
    if (out.size() >= o.max_tokens) break;
    bool full = false;
    for (uint32_t l = 0; l < cache.n_layers(); ++l) full |= !cache.wraps(l) && cache.length(l) >= cache.slots(l);
    if (full) {
      stats_.finish_reason = "cache_full";
      break;
    }
    stats_.decode_counters += run_step(cache, &id, 1, 1, &o.sampling, draw(), n_pen);
    ++stats_.decode_steps;
    history.push_back(id);
  }
  stats_.decode_seconds = seconds_since(t1);
  stats_.generated_tokens = uint32_t(out.size());
  return out;
}

}  // namespace mkv::engine
