// metalkv._core.Weights and metalkv._core.Engine: the doorway the Python
// Engine (python/metalkv/engine.py) goes through. Python loads and tokenizes;
// everything per token happens here with the GIL released.
#include <nanobind/nanobind.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>

#include "bindings.h"
#include "kv/prefix_cache.h"
#include "bindings/args.h"
#include "engine/engine.h"
#include "engine/lookup.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace mkv::bindings {
namespace {

using Bytes = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;

// The engines alive, for Python's exit (bind_engine's atexit hook stops their scheduler
// threads: one left running into the C runtime's exit would meet the host executor's
// static thread pool being destroyed under it, and the process would hang).
std::mutex engines_mutex;
std::set<engine::Engine*> engines;

struct PyEngine {
  PyDevice dev;
  std::unique_ptr<engine::Engine> engine;  // its scheduler thread runs every step
  size_t weight_bytes = 0;
  ~PyEngine() {
    std::lock_guard<std::mutex> lock(engines_mutex);
    engines.erase(engine.get());
  }
};

// dict(name=value) -> ModelSpec; every key must be known, so a typo is an error.
model::ModelSpec parse_spec(const nb::dict& d) {
  model::ModelSpec s;
  for (auto [key, value] : d) {
    const std::string k = nb::cast<std::string>(key);
    auto u32 = [&] { return nb::cast<uint32_t>(value); };
    auto f32 = [&] { return nb::cast<float>(value); };
    auto flag = [&] { return nb::cast<bool>(value); };
    if (k == "n_layers") s.n_layers = u32();
    else if (k == "hidden") s.hidden = u32();
    else if (k == "n_heads") s.n_heads = u32();
    else if (k == "n_kv_heads") s.n_kv_heads = u32();
    else if (k == "head_dim") s.head_dim = u32();
    else if (k == "ffn_hidden") s.ffn_hidden = u32();
    else if (k == "vocab") s.vocab = u32();
    else if (k == "rms_eps") s.rms_eps = f32();
    else if (k == "norm_offset") s.norm_offset = f32();
    else if (k == "embedding_scale") s.embedding_scale = f32();
    else if (k == "attn_scale") s.attn_scale = f32();
    else if (k == "attn_softcap") s.attn_softcap = f32();
    else if (k == "final_softcap") s.final_softcap = f32();
    else if (k == "activation") {
      const std::string a = nb::cast<std::string>(value);
      if (a != "silu" && a != "gelu_tanh")
        throw nb::value_error(("[model] activation '" + a + "'; expected 'silu' or 'gelu_tanh'").c_str());
      s.activation = a == "silu" ? model::Activation::silu : model::Activation::gelu_tanh;
    } else if (k == "attn_bias") s.attn_bias = flag();
    else if (k == "qk_norm") s.qk_norm = flag();
    else if (k == "sandwich_norms") s.sandwich_norms = flag();
    else if (k == "tied_embeddings") s.tied_embeddings = flag();
    else if (k == "rope_style") s.rope_style = ops::parse_rope_style(nb::cast<std::string>(value));
    else if (k == "rotary_dim") s.rotary_dim = u32();
    else if (k == "rope_tables") s.rope_tables = nb::cast<std::vector<std::vector<float>>>(value);
    else if (k == "layer_rope_table") s.layer_rope_table = nb::cast<std::vector<uint32_t>>(value);
    else if (k == "layer_window") s.layer_window = nb::cast<std::vector<uint32_t>>(value);
    else if (k == "kv_layer") s.kv_layer = nb::cast<std::vector<uint32_t>>(value);
    else if (k == "rope_tables_long") s.rope_tables_long = nb::cast<std::vector<std::vector<float>>>(value);
    else if (k == "rope_long_above") s.rope_long_above = u32();
    else if (k == "altup_inputs") s.altup_inputs = u32();
    else if (k == "altup_active") s.altup_active = u32();
    else if (k == "per_layer_dim") s.per_layer_dim = u32();
    else if (k == "per_layer_vocab") s.per_layer_vocab = u32();
    else if (k == "laurel_rank") s.laurel_rank = u32();
    else if (k == "v_norm") s.v_norm = flag();
    else if (k == "ffn_sparse") {
      for (bool b : nb::cast<std::vector<bool>>(value)) s.ffn_sparse.push_back(b);
    } else if (k == "ffn_sparse_std") s.ffn_sparse_std = nb::cast<std::vector<float>>(value);
    else throw nb::value_error(("[model] unknown spec key '" + k + "'").c_str());
  }
  return s;
}

// The GIL released around a wait that may outlast the interpreter. A daemon thread
// that asks for the GIL back once the interpreter is finalizing is ended by CPython
// (< 3.14) with pthread_exit, whose forced unwinding cannot pass the noexcept frames
// it meets here (a destructor, nanobind's dispatch): std::terminate, "terminate called
// without an active exception", and the process aborts instead of exiting. So from
// the moment Python starts exiting (its atexit hooks run before finalization; the
// hook is registered in bind_engine) a thread other than the exiting one does not
// take the GIL back: it parks until the process is gone, as CPython 3.14 itself parks
// such threads. Its call, still running on the scheduler thread, dies with the process.
std::atomic<bool> python_exiting{false};
std::thread::id exiting_thread;  // written before python_exiting is set, read after

class ReleaseGil {
 public:
  ReleaseGil() : state_(PyEval_SaveThread()) {}
  ~ReleaseGil() {
    if (python_exiting.load(std::memory_order_acquire) && std::this_thread::get_id() != exiting_thread)
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    PyEval_RestoreThread(state_);
  }
  ReleaseGil(const ReleaseGil&) = delete;
  ReleaseGil& operator=(const ReleaseGil&) = delete;

 private:
  PyThreadState* state_;
};

// A call in flight as Python sees it: the request, and the cache and engine
// it needs alive until the scheduler is done with them. Dropped before it is
// done (an exception in the caller's loop), it aborts the call and waits.
struct PyRequest {
  std::shared_ptr<engine::Request> request;
  nb::object cache;
  nb::object engine;
  PyRequest(std::shared_ptr<engine::Request> r, nb::object c, nb::object e)
      : request(std::move(r)), cache(std::move(c)), engine(std::move(e)) {}
  PyRequest(PyRequest&&) = default;
  PyRequest(const PyRequest&) = delete;
  ~PyRequest() {
    if (!request || request->done()) return;
    request->abort();
    ReleaseGil release;
    while (!request->done()) request->channel()->wait(0.05);
  }
};

nb::object to_numpy(std::vector<float>&& rows, size_t n, size_t width) {
  auto* data = new std::vector<float>(std::move(rows));
  nb::capsule owner(data, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  const size_t shape[2] = {n, width};
  return nb::cast(nb::ndarray<nb::numpy, float, nb::ndim<2>>(data->data(), 2, shape, owner));
}

std::map<std::string, double> stats_dict(const engine::Stats& s) {
  std::map<std::string, double> out{
      {"prompt_tokens", s.prompt_tokens},         {"prompt_tokens_cached", s.prompt_tokens_cached},
      {"generated_tokens", s.generated_tokens},   {"prefill_steps", s.prefill_steps},
      {"decode_steps", s.decode_steps},           {"queue_seconds", s.queue_seconds},
      {"prefill_seconds", s.prefill_seconds},     {"decode_seconds", s.decode_seconds},
      {"max_batch", s.max_batch},                 {"draft_proposed", s.draft_proposed},
      {"draft_accepted", s.draft_accepted},       {"preemptions", s.preemptions},
      {"recomputed_tokens", s.recomputed_tokens},
      {"batch_size", s.decode_steps ? double(s.batch_sequences) / s.decode_steps : double(s.max_batch)}};
  for (auto [prefix, c] : {std::pair<const char*, const gpu::Counters*>{"prefill_", &s.prefill_counters},
                           {"decode_", &s.decode_counters}})
    for (const auto& [k, v] : c->as_map()) out[prefix + k] = double(v);
  return out;
}

// metalkv._core.Channel: holds a Channel made and owned in C++, so the
// scheduler thread can drop the last reference without Python's GIL (a
// shared_ptr from a Python-owned object would call back into Python).
struct PyChannel {
  std::shared_ptr<engine::Channel> channel = std::make_shared<engine::Channel>();
};

std::shared_ptr<engine::Channel> channel_arg(PyChannel* c) {
  return c ? c->channel : std::make_shared<engine::Channel>();
}

void bind_engine(nb::module_& m, nb::module_&) {
  // Python is exiting (only daemon threads are left): ReleaseGil parks them from now on,
  // and every engine's scheduler thread ends, its calls aborted, so that the waits of
  // those threads end (and park) and no thread of ours outlives the interpreter.
  nb::module_::import_("atexit").attr("register")(nb::cpp_function([] {
    exiting_thread = std::this_thread::get_id();
    python_exiting.store(true, std::memory_order_release);
    // A daemon thread still alive with an engine about: it may wait on a call now,
    // or start one a moment later (between two calls there is none in flight), and
    // it parks holding its objects, which are then never freed: by design, not a
    // refcount bug, so nanobind's leak report is off.
    bool engines_alive = false;
    {
      std::lock_guard<std::mutex> lock(engines_mutex);
      engines_alive = !engines.empty();
    }
    bool daemons = false;
    for (nb::handle t : nb::module_::import_("threading").attr("enumerate")())
      daemons |= nb::cast<bool>(t.attr("daemon")) && nb::cast<bool>(t.attr("is_alive")());
    if (engines_alive && daemons) nb::set_leak_warnings(false);
    {
      nb::gil_scoped_release release;  // a step in flight finishes first (a constraint's calls take the GIL)
      std::lock_guard<std::mutex> lock(engines_mutex);
      for (engine::Engine* e : engines) e->stop();
    }
    release_pending();  // the constraints the engines let go
  }));
  m.attr("DEFAULT_MAX_TOKENS") = engine::GenerateOptions{}.max_tokens;  // metalkv.Sampling's default
  m.def(
      "lookup_drafts",
      [](const std::vector<int32_t>& history, uint32_t k) { return engine::lookup_drafts(history, k); },
      "history"_a, "k"_a,
      "Prompt lookup's proposal (cpp/engine/lookup.h): up to k ids that followed the latest earlier occurrence of\n"
      "the history's last 4, 3 or 2 ids (the longest that occurred), or [].");
  m.def(
      "check_max_seqs", [](nb::handle n) { engine::check_max_seqs(int_arg("engine", "max_seqs", n)); }, "max_seqs"_a,
      "Raises ArgumentError unless max_seqs is an int in 1..4096 (Engine.load checks it before reading a model).");
  m.def(
      "check_generate",
      [](nb::handle max_tokens, nb::handle temperature, nb::handle top_k, nb::handle top_p, nb::handle min_p,
         nb::handle repetition_penalty, nb::handle presence_penalty, nb::handle frequency_penalty, nb::handle seed,
         nb::handle logprobs, nb::handle speculate, nb::handle draft_tokens) {
        engine::check_generate_options(generate_options(max_tokens, temperature, top_k, top_p, min_p,
                                                        repetition_penalty, presence_penalty, frequency_penalty,
                                                        seed, logprobs, speculate, draft_tokens));
      },
      nb::kw_only(), "max_tokens"_a = engine::GenerateOptions{}.max_tokens, "temperature"_a = 0.0, "top_k"_a = 0, "top_p"_a = 1.0, "min_p"_a = 0.0,
      "repetition_penalty"_a = 1.0, "presence_penalty"_a = 0.0, "frequency_penalty"_a = 0.0, "seed"_a = 0,
      "logprobs"_a.none() = nb::none(), "speculate"_a.none() = nb::none(), "draft_tokens"_a.none() = nb::none(),
      "The checks Engine.generate makes of its options, without a model: raises ArgumentError (a ValueError "
      "naming the argument) for a value of the wrong type or range.");

  nb::class_<PyWeights>(m, "Weights", "A model's tensors on a device, by canonical (GGUF) name.")
      .def(
          "__init__", [](PyWeights* self, PyDevice& dev) {
            new (self) PyWeights{dev, std::make_unique<model::Weights>(dev.device)};
          },
          "device"_a)
      .def(
          "add",
          [](PyWeights& w, const std::string& name, const std::string& dtype, const std::vector<uint64_t>& shape,
             const Bytes& data) {
            if (!w.weights) throw nb::value_error("[weights] already given to an Engine");
            return w.weights->add(name, dtype, shape, data.data(), data.nbytes());
          },
          "name"_a, "dtype"_a, "shape"_a, "data"_a,
          "Copies data (the file's bytes of a kernel weight type, logical shape) to the device, packed\n"
          "as the kernels read it (ops.pack_weights); returns the bytes it takes there.")
      .def_prop_ro("nbytes", [](const PyWeights& w) { return w.weights ? w.weights->nbytes() : 0; })
      .def("__len__", [](const PyWeights& w) { return w.weights ? w.weights->size() : 0; });

  nb::class_<PyChannel>(m, "Channel", "Wakes whoever waits on a group of requests.")
      .def(nb::init<>())
      .def(
          "wait",
          [](PyChannel& c, double timeout) {
            ReleaseGil release;
            return c.channel->wait(timeout);
          },
          "timeout"_a,
          "Waits (GIL released) until a request of the channel made progress since the last wait, or timeout\n"
          "seconds pass; returns whether it did. Keep timeouts short on the main thread: Ctrl-C is seen between\n"
          "waits.");

  nb::class_<PyRequest>(m, "Request", "A call in flight (Engine.submit).")
      .def(
          "take",
          [](PyRequest& r) {
            std::vector<int32_t> ids;
            const bool done = r.request->take(ids);
            return std::make_pair(ids, done);
          },
          "(ids generated since the last take, whether the call is over and every id taken).")
      .def("stop_after", [](PyRequest& r, uint64_t k) { r.request->stop_after(k); }, "k"_a,
           "Keep ids 0..k and stop: the cache as if id k were the last sampled (what a stop string in id k's text "
           "needs).")
      .def("cancel", [](PyRequest& r) { r.request->cancel(); },
           "Stop before the next step, keeping what was generated (nothing yet: the cache as before).")
      .def("abort", [](PyRequest& r) { r.request->abort(); }, "Stop and put the cache back as before the call.")
      .def_prop_ro("done", [](const PyRequest& r) { return r.request->done(); })
      .def_prop_ro("held", [](const PyRequest& r) { return r.request->held(); },
                   "Waiting before the step hold_at_step named (tests).")
      .def("resume", [](PyRequest& r) { r.request->resume(); }, "Lets a held call go on.")
      .def_prop_ro("ids", [](const PyRequest& r) { return r.request->ids(); })
      .def(
          "logprobs",
          [](const PyRequest& r, size_t start) {
            std::vector<std::pair<float, std::vector<std::pair<int32_t, float>>>> out;
            for (engine::TokenLogprob& e : r.request->logprobs(start)) out.emplace_back(e.logprob, std::move(e.top));
            return out;
          },
          "start"_a = 0,
          "With submit(logprobs=n): [(logprob, [(id, logprob), ...n, highest first, ties by lower id]), ...] for\n"
          "ids start.. (one entry per id generated so far, in order; a stop id has none): log-softmax of the raw\n"
          "logits row each id was sampled from (before penalties and temperature). Without logprobs: [].")
      .def_prop_ro("stats", [](const PyRequest& r) { return stats_dict(r.request->stats()); })
      .def_prop_ro("prompt_progress", [](const PyRequest& r) { return r.request->prompt_progress(); },
                   "(prompt tokens the cache holds so far, the prompt's tokens): (0, 0) before the first step.")
      .def_prop_ro("finish_reason", [](const PyRequest& r) { return r.request->stats().finish_reason; })
      .def("result",
           [](PyRequest& r) {
             {
               ReleaseGil release;
               r.request->unpace();  // waiting for the end: a paced call need not wait for reads
               while (!r.request->done()) r.request->channel()->wait(0.05);
             }
             r.request->rethrow();
             return r.request->ids();
           },
           "Waits for the call (GIL released), raises its error if it failed, and returns its ids.")
      .def("logits",
           [](PyRequest& r) -> nb::object {
             r.request->rethrow();
             std::vector<float> rows = r.request->take_logits();
             if (rows.empty()) return nb::none();
             PyEngine& e = nb::cast<PyEngine&>(r.engine);
             const size_t vocab = e.engine->model().spec().vocab, n = rows.size() / vocab;
             return to_numpy(std::move(rows), n, vocab);
           },
           "A finished logits call's (n, vocab) float32 rows (once), or None if it was cancelled; a generate call\n"
           "made with keep_logits: the rows its ids were sampled from.");

  nb::class_<PyEngine>(m, "Engine", "The C++ engine: a model on a device, run over KV caches.")
      .def(
          "__init__",
          [](PyEngine* self, PyDevice& dev, const nb::dict& spec, PyWeights& weights, uint32_t prefill_chunk,
             uint32_t kv_context, uint32_t max_seqs, uint32_t step_tokens, const std::optional<kv::KvOptions>& kv,
             bool batch_invariant, std::optional<nb::dict> draft_spec, PyWeights* draft_weights, bool preempt) {
            for (PyWeights* w : {&weights, draft_weights}) {
              if (!w) continue;
              if (!w->weights) throw nb::value_error("[engine] these weights were given to an Engine already");
              if (w->dev.device != dev.device) throw nb::value_error("[engine] the weights live on another device");
            }
            if (draft_spec.has_value() != (draft_weights != nullptr))
              throw nb::value_error("[engine] a draft model needs both draft_spec and draft_weights");
            size_t bytes = weights.weights->nbytes();
            auto mdl = std::make_shared<model::Model>(dev.device, parse_spec(spec), std::move(*weights.weights));
            weights.weights.reset();
            std::shared_ptr<model::Model> draft;
            if (draft_weights) {
              bytes += draft_weights->weights->nbytes();
              draft = std::make_shared<model::Model>(dev.device, parse_spec(*draft_spec),
                                                     std::move(*draft_weights->weights));
              draft_weights->weights.reset();
            }
            const engine::EngineOptions o{prefill_chunk, kv_context, max_seqs, step_tokens, kv.value_or(kv::KvOptions{}),
                                          batch_invariant, preempt};
            new (self) PyEngine{dev, std::make_unique<engine::Engine>(dev.device, std::move(mdl), o, std::move(draft)),
                                bytes};
            std::lock_guard<std::mutex> lock(engines_mutex);
            engines.insert(self->engine.get());
          },
          "device"_a, "spec"_a, "weights"_a, "prefill_chunk"_a = 128, "kv_context"_a = 0, "max_seqs"_a = 64,
          "step_tokens"_a = 0, "kv"_a = nb::none(), "batch_invariant"_a = true, "draft_spec"_a = nb::none(),
          "draft_weights"_a.none() = nb::none(), "preempt"_a = true,
          "Takes the weights (the Weights object is empty afterwards). kv_context: tokens a cache holds by\n"
          "default (a budget's fraction is of it; the shared pool is sized for sequences of it). max_seqs: calls\n"
          "running at once (more wait); step_tokens: rows one step feeds (0: prefill_chunk + max_seqs).\n"
          "kv: the caches' KvOptions (formats, residual window, eviction policy, kv_memory: the shared pool's\n"
          "bytes, 'auto' by default); None: the defaults. batch_invariant: False lets a step with the device's\n"
          "gemm_decode_rows decoding sequences or more run their projections as a gemm (EngineOptions).\n"
          "draft_spec, draft_weights: a draft model for speculate='draft' (its Weights are taken too).\n"
          "preempt: optimistic admission with preemption (EngineOptions::preempt); False: every call reserves all.")
      .def_prop_ro("preempt", [](const PyEngine& e) { return e.engine->options().preempt; })
      .def_prop_ro("batch_invariant", [](const PyEngine& e) { return e.engine->options().batch_invariant; },
                   "False when decode rows may join the gemm (EngineOptions::batch_invariant).")
      .def_prop_ro("kv_options", [](const PyEngine& e) { return e.engine->options().kv; },
                   "The KvOptions new caches get (kv_memory as the bytes the pool got).")
      .def_prop_ro(
          "kv_pool",
          [](const PyEngine& e) { return pool_info(e.engine->kv_pool()); },
          "The shared KV pool (None without kv_memory): its bytes; kv_memory, the bytes charged to it now\n"
          "(used: the pool and every sequence's own buffers; sequences: theirs) and at most; per window group,\n"
          "blocks, free blocks (evictable ones included), blocks in the prefix cache, evictable ones (cached, no\n"
          "owner) and reserved ones.")
      // (residual: the caches' residual window, kv/prefix_cache.h; for metalkv.prefix_store)
      .def("cached_prefix", [](const PyEngine& e, const std::vector<int32_t>& ids, uint32_t residual) {
             return cached_prefix(e.engine->kv_pool(), ids, residual); },
           "ids"_a, "residual"_a = 0, "Tokens of ids' longest prefix the prefix cache holds now (whole blocks).")
      .def("prefix_record_bytes", [](const PyEngine& e, uint32_t residual) {
             return e.engine->kv_pool() ? kv::prefix::record_bytes(*e.engine->kv_pool(), residual) : 0; },
           "residual"_a = 0, "Bytes of one block's record (export_prefix): its rows in every layer as the pool "
           "holds them, and its window rows with a residual window.")
      .def("export_prefix", [](const PyEngine& e, const std::vector<int32_t>& ids, uint32_t residual) {
             return export_prefix(e.engine->kv_pool(), ids, residual); },
           "ids"_a, "residual"_a = 0, "The records (bytes) of the blocks of ids' longest prefix the prefix cache "
           "holds.")
      .def("import_prefix", [](PyEngine& e, const std::vector<int32_t>& ids, const std::vector<RecordArray>& records,
                               uint32_t residual) { return import_prefix(e.engine->kv_pool_mut(), ids, records, residual); },
           "ids"_a, "records"_a, "residual"_a = 0, "Puts the records of ids' first blocks (export_prefix's, as uint8 "
           "arrays) into the prefix cache, evictable; the tokens of ids a call could then take from it.")
      .def(
          "new_cache",
          [](PyEngine& e, uint32_t capacity, const std::string& store,
             const std::optional<kv::KvOptions>& kv) {
            return new PyKVCache{e.dev, e.engine->new_cache(capacity, kv::parse_store_path(store), kv ? &*kv : nullptr), {}};
          },
          "capacity"_a, "store"_a = "compute", "kv"_a = nb::none(),
          nb::rv_policy::take_ownership)
      .def(
          "submit_logits",
          [](nb::handle self, PyKVCache& c, nb::handle ids, PyChannel* channel, uint32_t hold_at_step,
             bool ephemeral, nb::handle media) {
            PyEngine& e = nb::cast<PyEngine&>(self);
            engine::GenerateOptions o;
            o.media = media_arg(media);
            std::vector<int32_t> fed = token_ids_arg(ids, e.engine->model().spec().vocab, !o.media);
            o.hold_at_step = hold_at_step;
            o.ephemeral = ephemeral;
            auto r = e.engine->submit_logits(*c.cache, std::move(fed), o, channel_arg(channel));
            return PyRequest{r, nb::borrow(nb::find(&c)), nb::borrow(self)};
          },
          "cache"_a, "ids"_a, "channel"_a.none() = nb::none(), "hold_at_step"_a = 0, "ephemeral"_a = false,
          "media"_a.none() = nb::none(),
          "Queues a logits call: ids (int64, 1-D) fed after what the cache holds; the request's logits() are then\n"
          "(n, vocab) float32. media: as for submit.")
      .def(
          "submit",
          [](nb::handle self, PyKVCache& c, nb::handle prompt, nb::handle max_tokens, nb::handle temperature,
             nb::handle top_k, nb::handle top_p, nb::handle min_p, nb::handle repetition_penalty,
             nb::handle presence_penalty, nb::handle frequency_penalty, nb::handle seed,
             const std::vector<int32_t>& stop_ids, std::optional<uint32_t> keep, bool paced, bool prefix_cache,
             PyChannel* channel, uint32_t hold_at_step, bool ephemeral, bool keep_logits, nb::handle logprobs,
             nb::handle speculate, nb::handle draft_tokens, nb::handle logit_bias, nb::handle constraint,
             nb::handle media) {
            PyEngine& e = nb::cast<PyEngine&>(self);
            engine::GenerateOptions o = generate_options(max_tokens, temperature, top_k, top_p, min_p,
                                                         repetition_penalty, presence_penalty, frequency_penalty,
                                                         seed, logprobs, speculate, draft_tokens);
            o.logit_bias = logit_bias_arg(logit_bias);
            o.constraint = constraint_arg(constraint);
            o.stop_ids = stop_ids;
            o.keep = keep;
            o.paced = paced;
            o.prefix_cache = prefix_cache;
            o.hold_at_step = hold_at_step;
            o.ephemeral = ephemeral;
            o.keep_logits = keep_logits;
            o.media = media_arg(media);
            std::vector<int32_t> ids = token_ids_arg(prompt, e.engine->model().spec().vocab, !o.media);
            auto r = e.engine->submit(*c.cache, std::move(ids), o, channel_arg(channel));
            return PyRequest{r, nb::borrow(nb::find(&c)), nb::borrow(self)};
          },
          "cache"_a, "prompt"_a, nb::kw_only(), "max_tokens"_a, "temperature"_a = 0.0, "top_k"_a = 0,
          "top_p"_a = 1.0, "min_p"_a = 0.0, "repetition_penalty"_a = 1.0, "presence_penalty"_a = 0.0,
          "frequency_penalty"_a = 0.0, "seed"_a = 0, "stop_ids"_a = std::vector<int32_t>{}, "keep"_a = nb::none(),
          "paced"_a = false, "prefix_cache"_a = true, "channel"_a.none() = nb::none(), "hold_at_step"_a = 0,
          "ephemeral"_a = false, "keep_logits"_a = false, "logprobs"_a.none() = nb::none(),
          "speculate"_a.none() = nb::none(), "draft_tokens"_a.none() = nb::none(),
          "logit_bias"_a.none() = nb::none(), "constraint"_a.none() = nb::none(), "media"_a.none() = nb::none(),
          "Checks and queues a generate call; returns its Request at once. It rolls the cache back to `keep`\n"
          "tokens (None: keeps all), feeds the prompt (int64 ids), samples up to max_tokens ids (a stop id ends\n"
          "it, not returned). paced: the caller reads ids as they come (take), and the engine stays at most a\n"
          "few ids ahead of it so stop_after can always roll back. prefix_cache: an empty cache may start from\n"
          "cached prefix blocks of the shared pool. channel: a Channel several requests share (a new one if\n"
          "None), which wakes the caller's wait. hold_at_step (tests): the call waits before its k-th step\n"
          "until resume(), cancel() or abort() (Request.held says it is there). ephemeral: the cache is the\n"
          "call's alone and is emptied when it ends, its blocks back in the pool at once. keep_logits: logits()\n"
          "gives the (steps, vocab) logits each id was sampled from (decode-time logits, as a ppl needs).\n"
          "presence_penalty, frequency_penalty (OpenAI's, in [-2, 2], 0 = off): over the ids this call generated\n"
          "(not the prompt), id j generated c times loses frequency_penalty * c + presence_penalty * (c > 0)\n"
          "from its logit, after the repetition penalty and before temperature (greedy included). logprobs\n"
          "(None or -1: off; 0..20): Request.logprobs() gives, for each id, its log-probability under the raw\n"
          "logits it was sampled from (before penalties and temperature) and the top `logprobs` ids with theirs.\n"
          "speculate ('lookup' or None) and draft_tokens (1..16, default 4): speculative decoding by prompt lookup,\n"
          "no penalties; greedy, the ids and logits are those without it; sampled, the same distribution\n"
          "(docs/SPECULATIVE.md). logit_bias ({id: bias}, OpenAI's, bias in [-100, 100]): added to those logits\n"
          "after the penalties. constraint (a metalkv._core.Constraint): only the ids it allows are sampled, and\n"
          "the call ends when it is done (docs/CONSTRAINED.md). media: None, or (spans, rows): the prompt's soft\n"
          "tokens (docs/MULTIMODAL.md), spans [(start, length, bidirectional), ...] of prompt indices whose rows\n"
          "(rows (n, hidden) float32, the spans' in order) replace their ids' embeddings; a span's ids are its\n"
          "prefix-cache keys (any int32); a bidirectional span's tokens see each other (Gemma 3's images).")
      .def_prop_ro("queued", [](const PyEngine& e) { return e.engine->scheduler().queued(); },
                   "Calls waiting for admission (max_seqs running, or the KV pool without room).")
      .def_prop_ro("running", [](const PyEngine& e) { return e.engine->scheduler().running(); })
      .def_prop_ro("max_seqs", [](const PyEngine& e) { return e.engine->options().max_seqs; })
      .def_prop_ro("weights_nbytes", [](const PyEngine& e) { return e.weight_bytes; })
      .def_prop_ro("prefill_chunk", [](const PyEngine& e) { return e.engine->options().prefill_chunk; })
      .def_prop_ro("device", [](const PyEngine& e) { return e.dev; });
}

}  // namespace

MKV_BINDING(engine, bind_engine);

}  // namespace mkv::bindings
