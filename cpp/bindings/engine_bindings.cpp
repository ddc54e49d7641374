// metalkv._core.Weights and metalkv._core.Engine: the doorway the Python
// Engine (python/metalkv/engine.py) goes through. Python loads and tokenizes;
// everything per token happens here with the GIL released.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <mutex>

#include "bindings.h"
#include "bindings/args.h"
#include "engine/engine.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace mkv::bindings {
namespace {

using Bytes = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;

struct PyWeights {
  PyDevice dev;
  std::unique_ptr<model::Weights> weights;
};

struct PyEngine {
  PyDevice dev;
  std::unique_ptr<engine::Engine> engine;
  size_t weight_bytes = 0;
  std::mutex busy;  // one call at a time: the workspace is shared
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
    else if (k == "rope_tables_long") s.rope_tables_long = nb::cast<std::vector<std::vector<float>>>(value);
    else if (k == "rope_long_above") s.rope_long_above = u32();
    else throw nb::value_error(("[model] unknown spec key '" + k + "'").c_str());
  }
  return s;
}

// Before every step: run Python's signal handlers (Ctrl-C raises
// KeyboardInterrupt here on the main thread), then the caller's poll.
engine::StepPoll step_poll(const std::optional<nb::callable>& poll) {
  return [poll] {
    nb::gil_scoped_acquire acquire;
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
    return poll ? nb::cast<bool>((*poll)()) : true;
  };
}

nb::object to_numpy(std::vector<float>&& rows, size_t n, size_t width) {
  auto* data = new std::vector<float>(std::move(rows));
  nb::capsule owner(data, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  const size_t shape[2] = {n, width};
  return nb::cast(nb::ndarray<nb::numpy, float, nb::ndim<2>>(data->data(), 2, shape, owner));
}

std::map<std::string, double> stats_dict(const engine::Stats& s) {
  std::map<std::string, double> out{
      {"prompt_tokens", s.prompt_tokens},      {"generated_tokens", s.generated_tokens},
      {"prefill_steps", s.prefill_steps},      {"decode_steps", s.decode_steps},
      {"prefill_seconds", s.prefill_seconds},  {"decode_seconds", s.decode_seconds}};
  for (auto [prefix, c] : {std::pair<const char*, const gpu::Counters*>{"prefill_", &s.prefill_counters},
                           {"decode_", &s.decode_counters}})
    for (const auto& [k, v] : c->as_map()) out[prefix + k] = double(v);
  return out;
}

void bind_engine(nb::module_& m, nb::module_&) {
  m.def(
      "check_generate",
      [](nb::handle max_tokens, nb::handle temperature, nb::handle top_k, nb::handle top_p, nb::handle min_p,
         nb::handle repetition_penalty, nb::handle seed) {
        generate_options(max_tokens, temperature, top_k, top_p, min_p, repetition_penalty, seed);
      },
      nb::kw_only(), "max_tokens"_a = 256, "temperature"_a = 0.0, "top_k"_a = 0, "top_p"_a = 1.0, "min_p"_a = 0.0,
      "repetition_penalty"_a = 1.0, "seed"_a = 0,
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

  nb::class_<PyEngine>(m, "Engine", "The C++ engine: a model on a device, run over KV caches.")
      .def(
          "__init__",
          [](PyEngine* self, PyDevice& dev, const nb::dict& spec, PyWeights& weights, uint32_t prefill_chunk,
             size_t kv_memory, uint32_t kv_context) {
            if (!weights.weights) throw nb::value_error("[engine] these weights were given to an Engine already");
            if (weights.dev.device != dev.device)
              throw nb::value_error("[engine] the weights live on another device");
            const size_t bytes = weights.weights->nbytes();
            auto mdl = std::make_shared<model::Model>(dev.device, parse_spec(spec), std::move(*weights.weights));
            weights.weights.reset();
            new (self) PyEngine{dev, std::make_unique<engine::Engine>(dev.device, std::move(mdl),
                                                                      engine::EngineOptions{prefill_chunk, kv_memory,
                                                                                            kv_context}),
                                bytes, {}};
          },
          "device"_a, "spec"_a, "weights"_a, "prefill_chunk"_a = 128, "kv_memory"_a = 0, "kv_context"_a = 0,
          "Takes the weights (the Weights object is empty afterwards). kv_memory > 0: one KV pool of at most\n"
          "that many bytes shared by every cache, sized for sequences of kv_context tokens.")
      .def_prop_ro(
          "kv_pool",
          [](const PyEngine& e) -> nb::object {
            const kv::KvPool* p = e.engine->kv_pool();
            if (!p) return nb::none();
            nb::list groups;
            for (uint32_t g = 0; g < p->n_groups(); ++g) {
              nb::dict d;
              d["window"] = p->group_window(g);
              d["layers"] = p->group_layers(g);
              d["blocks"] = p->blocks(g).capacity();
              d["free_blocks"] = p->blocks(g).free_count();
              d["block_bytes"] = p->block_bytes(g);
              groups.append(d);
            }
            nb::dict r;
            r["nbytes"] = p->nbytes();
            r["block_tokens"] = kv::kBlockTokens;
            r["groups"] = groups;
            return r;
          },
          "The shared KV pool (None without kv_memory): its bytes and, per window group, blocks and free blocks.")
      .def(
          "new_cache",
          [](PyEngine& e, uint32_t capacity, const std::string& store) {
            return new PyKVCache{e.dev, e.engine->new_cache(capacity, kv::parse_store_path(store)), {}};
          },
          "capacity"_a, "store"_a = "compute", nb::rv_policy::take_ownership)
      .def(
          "prefill",
          [](PyEngine& e, PyKVCache& c, nb::handle ids, bool want_logits, std::optional<nb::callable> poll) -> nb::object {
            const uint32_t vocab = e.engine->model().spec().vocab;
            const std::vector<int32_t> fed = token_ids_arg(ids, vocab);
            const uint32_t n = uint32_t(fed.size());
            std::vector<float> logits(want_logits ? size_t(n) * vocab : 0);
            {
              nb::gil_scoped_release release;
              std::lock_guard<std::mutex> lock(e.busy);
              e.engine->prefill(*c.cache, fed.data(), n, want_logits ? logits.data() : nullptr, step_poll(poll));
            }
            if (!want_logits || e.engine->last_stats().finish_reason == "cancelled") return nb::none();
            return to_numpy(std::move(logits), n, vocab);
          },
          "cache"_a, "ids"_a, "want_logits"_a = true, "poll"_a = nb::none(),
          "Feeds ids (int64, 1-D) after what the cache holds; returns their logits (n, vocab) float32 or None. "
          "poll() -> bool runs before every step (False cancels: the cache is restored, None is returned).")
      .def(
          "generate",
          [](PyEngine& e, PyKVCache& c, nb::handle prompt, nb::handle max_tokens, nb::handle temperature,
             nb::handle top_k, nb::handle top_p, nb::handle min_p, nb::handle repetition_penalty, nb::handle seed,
             const std::vector<int32_t>& stop_ids, std::optional<uint32_t> keep,
             std::optional<std::function<bool(int32_t)>> on_token, std::optional<nb::callable> poll) {
            engine::GenerateOptions o =
                generate_options(max_tokens, temperature, top_k, top_p, min_p, repetition_penalty, seed);
            o.stop_ids = stop_ids;
            o.keep = keep;
            const std::vector<int32_t> ids = token_ids_arg(prompt, e.engine->model().spec().vocab);
            engine::TokenCallback cb;
            if (on_token)
              cb = [&](int32_t id) {
                nb::gil_scoped_acquire acquire;
                return (*on_token)(id);
              };
            nb::gil_scoped_release release;
            std::lock_guard<std::mutex> lock(e.busy);
            return e.engine->generate(*c.cache, ids.data(), uint32_t(ids.size()), o, cb, step_poll(poll));
          },
          "cache"_a, "prompt"_a, nb::kw_only(), "max_tokens"_a, "temperature"_a = 0.0, "top_k"_a = 0,
          "top_p"_a = 1.0, "min_p"_a = 0.0, "repetition_penalty"_a = 1.0, "seed"_a = 0,
          "stop_ids"_a = std::vector<int32_t>{}, "keep"_a = nb::none(), "on_token"_a = nb::none(),
          "poll"_a = nb::none(),
          "Rolls the cache back to `keep` tokens (None: keeps all), feeds the prompt (int64 ids), samples up to "
          "max_tokens ids (a stop id ends it, not returned). on_token(id) -> bool is called for each with the GIL "
          "held, False stops; poll() -> bool before every step, False cancels. Ctrl-C (on the main thread) or an "
          "exception from a callback restores the cache to what it held before the call.")
      .def_prop_ro("last_stats", [](const PyEngine& e) { return stats_dict(e.engine->last_stats()); })
      .def_prop_ro("finish_reason", [](const PyEngine& e) { return e.engine->last_stats().finish_reason; })
      .def_prop_ro("weights_nbytes", [](const PyEngine& e) { return e.weight_bytes; })
      .def_prop_ro("prefill_chunk", [](const PyEngine& e) { return e.engine->options().prefill_chunk; })
      .def_prop_ro("device", [](const PyEngine& e) { return e.dev; });
}

}  // namespace

MKV_BINDING(engine, bind_engine);

}  // namespace mkv::bindings
