// Python view of the KV cache (metalkv.KVCache).
// KVCache.append runs one command buffer per call: it is for tests and tools;
// the engine encodes stores into its own step with kv::KvCache::store.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <memory>
#include <optional>

#include "bindings.h"
#include "kv/kv_cache.h"
#include "ops/rope.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace mkv::bindings {
namespace {

using Array = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;


std::string dtype_name(nb::dlpack::dtype t) {
  const char* kind = t.code == uint8_t(nb::dlpack::dtype_code::Float) ? "float"
                     : t.code == uint8_t(nb::dlpack::dtype_code::Int) ? "int"
                     : t.code == uint8_t(nb::dlpack::dtype_code::UInt) ? "uint"
                     : t.code == uint8_t(nb::dlpack::dtype_code::Bool) ? "bool" : "other";
  return kind + std::to_string(t.bits);
}

std::string shape_str(const Array& a) {
  std::string s = "(";
  for (size_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

void require_float32(const char* op, const char* name, const Array& a) {
  if (a.dtype() != nb::dtype<float>())
    throw nb::value_error((std::string("[") + op + "] " + name + " has dtype " + dtype_name(a.dtype()) +
                           "; expected float32 (use .astype(np.float32))").c_str());
}

gpu::BufferPtr upload(PyDevice& dev, const Array& a) {
  auto b = dev.device->new_buffer(a.nbytes() ? a.nbytes() : 1);
  b->write(0, a.data(), a.nbytes());
  return b;
}

// rope=None or dict(style=..., inv_freq=np.ndarray float32, rotary_dim=2*len(inv_freq)).
std::optional<ops::RopeSpec> parse_rope(PyDevice& dev, nb::handle rope) {
  if (rope.is_none()) return std::nullopt;
  if (!nb::isinstance<nb::dict>(rope))
    throw nb::value_error("[kv_cache] rope must be None or a dict(style=..., inv_freq=..., rotary_dim=...)");
  nb::dict d = nb::borrow<nb::dict>(rope);
  for (auto [key, value] : d) {
    const std::string k = nb::cast<std::string>(key);
    if (k != "style" && k != "inv_freq" && k != "rotary_dim")
      throw nb::value_error(("[kv_cache] unknown rope key '" + k + "'; expected style, inv_freq, rotary_dim").c_str());
  }
  if (!d.contains("style") || !d.contains("inv_freq"))
    throw nb::value_error("[kv_cache] rope needs 'style' ('neox' or 'interleaved') and 'inv_freq'");
  ops::RopeSpec spec;
  try {
    spec.style = ops::parse_rope_style(nb::cast<std::string>(d["style"]));
  } catch (const gpu::GpuError& e) {
    throw nb::value_error(e.what());
  }
  const Array inv = nb::cast<Array>(d["inv_freq"]);
  require_float32("kv_cache", "rope inv_freq", inv);
  if (inv.ndim() != 1) throw nb::value_error("[kv_cache] rope inv_freq must be 1-D (rotary_dim/2,)");
  spec.rotary_dim = d.contains("rotary_dim") ? nb::cast<uint32_t>(d["rotary_dim"]) : uint32_t(2 * inv.shape(0));
  if (spec.rotary_dim % 2 == 0 && inv.shape(0) != spec.rotary_dim / 2)
    throw nb::value_error(("[kv_cache] rope inv_freq has " + std::to_string(inv.shape(0)) +
                           " frequencies; rotary_dim " + std::to_string(spec.rotary_dim) + " needs " +
                           std::to_string(spec.rotary_dim / 2)).c_str());
  spec.inv_freq = {upload(dev, inv), 0};
  return spec;
}

// Checks k and v: float32 (lead..., n, n_kv_heads, head_dim) with n >= 1, where
// lead is () for append and (n_layers,) for append_all_layers. Returns n.
uint32_t check_rows(const kv::KvCacheSpec& s, const Array& k, const Array& v, bool all_layers) {
  const size_t nd = all_layers ? 4 : 3;
  const std::string want = std::string("; expected (") + (all_layers ? "n_layers=" + std::to_string(s.n_layers) + ", " : "") +
                           "n, n_kv_heads=" + std::to_string(s.n_kv_heads) + ", head_dim=" +
                           std::to_string(s.head_dim) + ") with n >= 1";
  for (auto [name, a] : {std::pair<const char*, const Array*>{"k", &k}, {"v", &v}}) {
    require_float32("kv_cache", name, *a);
    if (a->ndim() != nd || a->shape(nd - 3) == 0 || a->shape(nd - 2) != s.n_kv_heads ||
        a->shape(nd - 1) != s.head_dim || (all_layers && a->shape(0) != s.n_layers))
      throw nb::value_error((std::string("[kv_cache] ") + name + " has shape " + shape_str(*a) + want).c_str());
  }
  if (k.shape(nd - 3) != v.shape(nd - 3))
    throw nb::value_error(("[kv_cache] k has " + std::to_string(k.shape(nd - 3)) + " tokens but v has " +
                           std::to_string(v.shape(nd - 3))).c_str());
  return uint32_t(k.shape(nd - 3));
}

// The cache, after its GpuError for a layer out of range.
const kv::KvCache& in_range(const PyKVCache& c, uint32_t layer) {
  c.cache->length(layer);
  return *c.cache;
}

// One command buffer storing into `layers` (all of them for append_all_layers)
// through one EncoderSession, as a model step would.
// queries: the step's Q rows (append's q=), rotated by the first store.
void run_stores(PyKVCache& c, const std::vector<uint32_t>& layers, const Array& k, const Array& v,
                uint32_t n, nb::handle rope, const ops::QueryRope& queries = {}) {
  const std::optional<ops::RopeSpec> spec = parse_rope(c.dev, rope);
  if (queries.n_heads && !spec) throw nb::value_error("[kv_cache] q= is rotated with k's rope; pass rope= too");
  const gpu::BufferPtr kb = upload(c.dev, k), vb = upload(c.dev, v);
  const size_t layer_bytes = size_t(n) * c.cache->spec().n_kv_heads * c.cache->spec().head_dim * 4;
  for (uint32_t layer : layers) c.cache->check_store(layer, n, spec ? &*spec : nullptr);  // all or nothing
  nb::gil_scoped_release release;
  auto cb = c.dev.queue->command_buffer();
  {
    kv::EncoderSession session(*cb);
    for (size_t i = 0; i < layers.size(); ++i)
      c.cache->store(session, layers[i], {kb, i * layer_bytes}, {vb, i * layer_bytes}, n,
                     spec ? &*spec : nullptr, i == 0 ? queries : ops::QueryRope{},
                     kv::KvCache::Checked::yes);  // (every layer checked above, before any store)
    session.end();
  }
  cb->commit();
  cb->wait();
  c.last = cb->counters();
}

// Returns q rotated by the store's dispatch (None without q).
nb::object append(PyKVCache& c, uint32_t layer, const Array& k, const Array& v, nb::handle rope,
                  std::optional<Array> q) {
  const uint32_t n = check_rows(c.cache->spec(), k, v, false);
  if (!q) {
    run_stores(c, {layer}, k, v, n, rope);
    return nb::none();
  }
  require_float32("kv_cache", "q", *q);
  if (q->ndim() != 3 || q->shape(0) != n || q->shape(1) == 0 || q->shape(2) != c.cache->spec().head_dim)
    throw nb::value_error(("[kv_cache] q has shape " + shape_str(*q) + "; expected (n=" + std::to_string(n) +
                           ", n_heads >= 1, head_dim=" + std::to_string(c.cache->spec().head_dim) + ")").c_str());
  const gpu::BufferPtr qb = upload(c.dev, *q);
  run_stores(c, {layer}, k, v, n, rope, ops::QueryRope{{qb, 0}, uint32_t(q->shape(1))});
  auto* out = new float[q->size()];
  qb->read(0, out, q->nbytes());
  nb::capsule owner(out, [](void* p) noexcept { delete[] static_cast<float*>(p); });
  const size_t shape[3] = {q->shape(0), q->shape(1), q->shape(2)};
  return nb::cast(nb::ndarray<nb::numpy, float, nb::ndim<3>>(out, 3, shape, owner));
}

void append_all_layers(PyKVCache& c, const Array& k, const Array& v, nb::handle rope) {
  const uint32_t n = check_rows(c.cache->spec(), k, v, true);
  std::vector<uint32_t> layers(c.cache->n_layers());
  for (uint32_t l = 0; l < layers.size(); ++l) layers[l] = l;
  run_stores(c, layers, k, v, n, rope);
}

// A float16 (slots, n_kv_heads, head_dim) view of section kv (0 = K, 1 = V),
// which must be f16.
nb::ndarray<nb::numpy> block_view(nb::handle self, uint32_t layer, uint32_t kv) {
  auto& c = nb::cast<PyKVCache&>(self);
  const kv::LayerLayout lay = c.cache->layout(layer);
  if (lay.format(kv) != mkv_params::kKvF16)
    throw nb::value_error(("[kv_cache] layer " + std::to_string(layer) + " stores " + (kv ? "V" : "K") + " as " +
                           kv::kv_format_name(lay.format(kv)) + "; keys()/values() view f16 sections (section_bytes() "
                           "gives the raw bytes, laid out as docs/KV_QUANT.md says)").c_str());
  const kv::BufferView r = c.cache->region(layer);
  const nb::dlpack::dtype f16{uint8_t(nb::dlpack::dtype_code::Float), 16, 1};
  // No copy where the CPU sees the memory: the array aliases the layer's buffer
  // and keeps the cache object alive. A copy on a discrete GPU.
  return host_array(self, *r.buffer, r.offset + lay.section_offset(kv), {lay.slots, lay.n_kv_heads, lay.head_dim},
                    f16);
}

// The raw bytes of section kv: (blocks, block_bytes) uint8, each row one
// block in its format's layout (metal/kv_format.h).
nb::ndarray<nb::numpy> section_view(nb::handle self, uint32_t layer, uint32_t kv) {
  auto& c = nb::cast<PyKVCache&>(self);
  const kv::LayerLayout lay = c.cache->layout(layer);
  const kv::BufferView r = c.cache->region(layer);
  return host_array(self, *r.buffer, r.offset + lay.section_offset(kv),
                    {lay.slots / kv::kBlockTokens, lay.block_bytes(kv)});
}

nb::ndarray<nb::numpy, int64_t, nb::ndim<1>> positions(const PyKVCache& c, uint32_t layer) {
  const std::vector<int64_t> held = c.cache->positions(layer);
  auto* data = new int64_t[held.size()];
  std::copy(held.begin(), held.end(), data);
  nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<int64_t*>(p); });
  const size_t shape[1] = {held.size()};
  return nb::ndarray<nb::numpy, int64_t, nb::ndim<1>>(data, 1, shape, owner);
}

}  // namespace

void bind_kv(nb::module_& m, nb::module_&) {
  nb::class_<PyKVCache>(m, "KVCache",
                        "One sequence's K/V: per layer a pool (its K section, then its V section, f16 (slots, n_kv_heads, "
                        "head_dim) or quantized: docs/KV_QUANT.md) cut into blocks of "
                        "BLOCK_TOKENS slots, and a block table per window group.")
      .def(
          "__init__",
          [](PyKVCache* self, PyDevice& dev, uint32_t n_layers, uint32_t n_kv_heads, uint32_t head_dim,
             uint32_t capacity, std::optional<std::vector<uint32_t>> windows, uint32_t max_chunk,
             const std::string& store, const std::optional<std::vector<std::string>>& kv_k,
             const std::optional<std::vector<std::string>>& kv_v, bool kv_rotate, uint32_t kv_residual,
             const std::optional<nb::dict>& kv_policy) {
            kv::KvCacheSpec spec{n_layers, n_kv_heads, head_dim, capacity, windows.value_or(std::vector<uint32_t>{}),
                                 max_chunk, kv::StorePath::compute, kv_formats_arg(kv_k, "kv_k"),
                                 kv_formats_arg(kv_v, "kv_v"), kv_rotate, kv_residual, kv_policy_arg(kv_policy)};
            try {
              spec.store = kv::parse_store_path(store);
            } catch (const gpu::GpuError& e) {
              throw nb::value_error(e.what());
            }
            new (self) PyKVCache{dev, std::make_unique<kv::KvCache>(dev.device, std::move(spec)), {}};
          },
          "device"_a, "n_layers"_a, "n_kv_heads"_a, "head_dim"_a, "capacity"_a, nb::kw_only(),
          "windows"_a = nb::none(), "max_chunk"_a = 1, "store"_a = "compute", "kv_k"_a = nb::none(),
          "kv_v"_a = nb::none(), "kv_rotate"_a = false, "kv_residual"_a = 0, "kv_policy"_a = nb::none(),
          "windows: per layer 0 (full) or a sliding window W; None: all full. max_chunk: most tokens "
          "one append puts in a sliding layer, and how far before its last append it can truncate (its pool holds about "
          "W + 2 * max_chunk slots). store: 'compute' or 'blit'. kv_k, kv_v: per layer 'f16', 'q8', 'q4' or 'q2' "
          "(docs/KV_QUANT.md); None: all f16. kv_rotate: Hadamard-rotate the quantized layers' K (after rope), V "
          "and queries before storing (append's k and v are scratch then; attention's output needs ops.hadamard). "
          "kv_residual: a residual window of that many recent tokens (a multiple of 32) kept in f16 beside the "
          "quantized layers (q2 needs one); appends then take at most max_chunk tokens. kv_policy: "
          "dict(policy='streaming'|'keynorm'|'h2o'|'snapkv'|'pyramidkv', budget=capacity, sinks=4, recent=-1, "
          "window=32, pool=7, prompt=None): the full layers then keep at most `budget` tokens (pyramidkv: a "
          "budget per layer, `budget` on average; prompt='whole': more while a prompt is open, up to capacity), "
          "evicting by that rule (docs/KV_POLICIES.md); appends take at most max_chunk tokens.")
      .def("append", &append, "layer"_a, "k"_a, "v"_a, nb::kw_only(), "rope"_a = nb::none(), "q"_a = nb::none(),
           "Stores k, v (n, n_kv_heads, head_dim) float32 at positions length(layer)...; "
           "rope=dict(style='neox'|'interleaved', inv_freq=float32 (rotary_dim/2,), rotary_dim=...) "
           "rotates k. q (n, n_heads, head_dim) float32 (needs rope): rotated at the same positions by the "
           "same dispatch, as a model step does, and returned. Runs and waits for one command buffer.")
      .def("append_all_layers", &append_all_layers, "k"_a, "v"_a, nb::kw_only(), "rope"_a = nb::none(),
           "One step: k, v (n_layers, n, n_kv_heads, head_dim) float32 stored into every layer in ONE "
           "command buffer through one encoder session, as the model will (see last_append_counters).")
      .def("keys", [](nb::handle self, uint32_t layer) { return block_view(self, layer, 0); }, "layer"_a,
           "The layer's K block as float16 (slots, n_kv_heads, head_dim): a writable zero-copy view where the CPU "
           "sees the memory (host, metal), a copy on a discrete GPU (cuda). Over a shared pool it is the whole "
           "pool (other caches' rows included); positions() marks the slots this cache holds.")
      .def("values", [](nb::handle self, uint32_t layer) { return block_view(self, layer, 1); }, "layer"_a,
           "The layer's V block, as keys().")
      .def("section_bytes", [](nb::handle self, uint32_t layer, uint32_t kv) { return section_view(self, layer, kv); },
           "layer"_a, "kv"_a,
           "The raw bytes of the layer's K (kv=0) or V (kv=1) section as uint8 (blocks, block_bytes): each row one "
           "block of BLOCK_TOKENS slots in its format's layout (docs/KV_QUANT.md); a view or a copy as keys().")
      .def("formats", [](const PyKVCache& c, uint32_t layer) {
             const kv::LayerLayout lay = c.cache->layout(layer);
             return std::make_pair(std::string(kv::kv_format_name(lay.k_format)),
                                   std::string(kv::kv_format_name(lay.v_format)));
           }, "layer"_a, "The layer's (K format, V format): 'f16', 'q8', 'q4' or 'q2'.")
      .def("row_bytes", [](const PyKVCache& c, uint32_t layer, uint32_t kv) {
             const kv::LayerLayout lay = c.cache->layout(layer);
             return std::make_pair(lay.data_row_bytes(kv), lay.param_row_bytes(kv));
           }, "layer"_a, "kv"_a,
           "(data row bytes, parameter row bytes) of one position of the layer's K (kv=0) or V (kv=1) section as "
           "read_rows()/write_rows() take them: every head's codes (or halfs) in element order, then every head's "
           "group parameters (docs/KV_QUANT.md).")
      .def("read_rows",
           [](PyKVCache& c, uint32_t layer, uint32_t kv, uint32_t first, uint32_t n, bool by_index) {
             const kv::LayerLayout lay = c.cache->layout(layer);
             const size_t drow = lay.data_row_bytes(kv & 1), prow = lay.param_row_bytes(kv & 1);
             auto* data = new uint8_t[std::max<size_t>(1, n * drow)];
             auto* params = new uint8_t[std::max<size_t>(1, n * prow)];
             nb::capsule own_d(data, [](void* p) noexcept { delete[] static_cast<uint8_t*>(p); });
             nb::capsule own_p(params, [](void* p) noexcept { delete[] static_cast<uint8_t*>(p); });
             c.cache->read_rows(layer, kv, first, n, data, params, by_index);
             const size_t ds[2] = {n, drow}, ps[2] = {n, prow};
             return std::make_pair(nb::ndarray<nb::numpy, uint8_t, nb::ndim<2>>(data, 2, ds, own_d),
                                   nb::ndarray<nb::numpy, uint8_t, nb::ndim<2>>(params, 2, ps, own_p));
           },
           "layer"_a, "kv"_a, "first"_a, "n"_a, "by_index"_a = false,
           "The stored bytes of positions first .. first+n-1 (which the layer holds) of its K (kv=0) or V (kv=1) "
           "section: (data (n, data row bytes), params (n, parameter row bytes)) uint8, rows as row_bytes() says. "
           "by_index: of indices first.. instead (an evicting layer's; kept_positions() gives their positions).")
      .def("write_rows",
           [](PyKVCache& c, uint32_t layer, uint32_t kv, uint32_t first,
              const nb::ndarray<const uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>& data,
              const nb::ndarray<const uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>& params) {
             const kv::LayerLayout lay = c.cache->layout(layer < c.cache->n_layers() ? layer : 0);
             const size_t n = data.shape(0);
             if (kv > 1 || data.shape(1) != lay.data_row_bytes(kv) || params.shape(0) != n ||
                 params.shape(1) != lay.param_row_bytes(kv))
               throw nb::value_error(("[kv_cache] write_rows wants data (n, " + std::to_string(lay.data_row_bytes(kv & 1)) +
                                      ") and params (n, " + std::to_string(lay.param_row_bytes(kv & 1)) +
                                      ") uint8 for section kv=0 (K) or 1 (V)").c_str());
             c.cache->write_rows(layer, kv, first, uint32_t(n), data.data(), params.data());
           },
           "layer"_a, "kv"_a, "first"_a, "data"_a, "params"_a,
           "Writes the stored bytes of positions first.. (which the layer holds) of its K (kv=0) or V (kv=1) "
           "section: data (n, data row bytes) and params (n, parameter row bytes) uint8 (row_bytes()).")
      .def("rotated", [](const PyKVCache& c, uint32_t layer) { return c.cache->layout(layer).rotate; }, "layer"_a,
           "Whether the layer stores K, V and the queries Hadamard-rotated (kv_rotate and a quantized format).")
      .def("positions", &positions, "layer"_a, "Position held by each slot (int64), -1 where empty.")
      .def("length", [](const PyKVCache& c, uint32_t l) { return c.cache->length(l); }, "layer"_a,
           "Tokens ever stored in the layer = position of its next token.")
      .def("count", [](const PyKVCache& c, uint32_t l) { return c.cache->count(l); }, "layer"_a,
           "Tokens the layer holds (attention's keys): its length less what an eviction policy dropped.")
      .def("evicts", [](const PyKVCache& c, uint32_t l) { return c.cache->evicts(l); }, "layer"_a,
           "Whether the layer keeps a budget by eviction (a full layer of a cache with kv_policy).")
      .def("kept_positions", [](const PyKVCache& c, uint32_t l, uint32_t h) { return c.cache->kept_positions(l, h); },
           "layer"_a, "head"_a = 0, "The position of each of the layer's count() indices for KV head `head`.")
      .def("scores",
           [](nb::handle self, uint32_t l) -> nb::object {
             const PyKVCache& c = nb::cast<const PyKVCache&>(self);
             const ops::BufferView v = c.cache->scores(l);
             if (!v.buffer) return nb::none();
             const kv::KvCacheSpec& s = c.cache->spec();
             return nb::cast(host_array(self, *v.buffer, v.offset, {s.n_kv_heads, s.capacity}, nb::dtype<float>()));
           },
           "layer"_a, "The policy's score per (KV head, index) as float32 (n_kv_heads, capacity); None without one.")
      .def(
          "set_kept",
          [](PyKVCache& c, uint32_t layer, uint32_t length,
             const nb::ndarray<const uint32_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>& positions,
             const std::optional<nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>>& scores) {
            const size_t n = positions.shape(0) * positions.shape(1);
            if (scores && scores->shape(0) * scores->shape(1) != n)
              throw nb::value_error("[kv_cache] set_kept: scores and positions differ in shape");
            c.cache->set_kept(layer, length, std::vector<uint32_t>(positions.data(), positions.data() + n),
                              scores ? scores->data() : nullptr);
          },
          "layer"_a, "length"_a, "positions"_a, "scores"_a = nb::none(),
          "A saved evicting layer put back (metalkv.cache_file): the count() rows it holds at indices 0.. become "
          "those of positions (n_kv_heads, count) uint32 (scores: float32 of that shape), and its length `length`.")
      .def_prop_ro("evicted", [](const PyKVCache& c) { return c.cache->evicted(); },
                   "Tokens each full layer has dropped by eviction so far.")
      .def_prop_ro("policy", [](const PyKVCache& c) { return kv::policy_name(c.cache->spec().policy.kind); },
                   "The eviction policy ('none' without one).")
      .def_prop_ro(
          "policy_options",
          [](const PyKVCache& c) -> nb::object {
            const kv::KvPolicySpec& p = c.cache->spec().policy;
            if (p.kind == kv::PolicyKind::none) return nb::none();
            nb::dict d;
            d["policy"] = kv::policy_name(p.kind);
            d["sinks"] = p.sinks;
            d["recent"] = p.recent;
            d["window"] = p.window;
            d["pool"] = p.pool;
            d["budget"] = c.cache->budget();
            d["prompt"] = p.holds_prompts() ? "whole" : "stream";
            return d;
          },
          "The eviction policy as KVCache's kv_policy dict (None without one).")
      .def_prop_ro("budget", [](const PyKVCache& c) { return c.cache->budget(); },
                   "Tokens a full layer keeps after an eviction (kv_budget; the capacity without a policy).")
      .def("layer_budget", [](const PyKVCache& c, uint32_t l) { return c.cache->budget(l); }, "layer"_a,
           "A full layer's own budget (pyramidkv's fall from the first layer to the last; the others: budget).")
      .def(
          "open_prompt", [](PyKVCache& c, uint32_t n) { c.cache->open_prompt(n); }, "n"_a,
          "The next n tokens stored are one prompt: a policy that holds prompts whole (kv_prompt='whole') "
          "keeps it all, up to capacity, and compresses to the budget at the first store after it. The engine "
          "calls it for every call's prompt.")
      .def("slots", [](const PyKVCache& c, uint32_t l) { return c.cache->slots(l); }, "layer"_a)
      .def("window", [](const PyKVCache& c, uint32_t l) { return c.cache->window(l); }, "layer"_a)
      .def("wraps", [](const PyKVCache& c, uint32_t l) { return c.cache->wraps(l); }, "layer"_a,
           "True for a layer that never overflows (a sliding layer whose pool is smaller than capacity, or a "
           "full layer that evicts), False for one that overflows at capacity.")
      .def("block_table", [](const PyKVCache& c, uint32_t l) { return c.cache->block_table(l).blocks(); }, "layer"_a,
           "The physical block of each logical block of BLOCK_TOKENS positions (-1: let go); position p is "
           "slot table[p // BLOCK_TOKENS] * BLOCK_TOKENS + p % BLOCK_TOKENS of keys()/values().")
      .def("layer_nbytes", [](const PyKVCache& c, uint32_t l) { return c.cache->layer_nbytes(l); }, "layer"_a)
      .def_prop_ro("nbytes", [](const PyKVCache& c) { return c.cache->nbytes(); },
                   "Device memory the cache holds: its own pool, or over an engine's shared pool "
                   "(Engine.load(kv_memory=)) the blocks it holds (held_nbytes); its blit staging, the tables' "
                   "mirrors, the residual window's ring and an eviction policy's scores. The shared pool's own "
                   "accounting: Engine.kv_pool.")
      .def_prop_ro("held_nbytes", [](const PyKVCache& c) { return c.cache->held_nbytes(); },
                   "Bytes of the blocks its tables hold (K and V rows of every layer), shared pool or not.")
      .def_prop_ro("shares_pool", [](const PyKVCache& c) { return !c.cache->owns_pool(); },
                   "True when the cache draws its blocks from an engine's shared pool.")
      .def_prop_ro("staging_nbytes", [](const PyKVCache& c) { return c.cache->staging_nbytes(); })
      .def_prop_ro("ring_nbytes", [](const PyKVCache& c) { return c.cache->ring_nbytes(); },
                   "The residual window's ring (kv_residual), every layer's that has one.")
      .def_prop_ro("residual", [](const PyKVCache& c) { return c.cache->spec().residual; },
                   "The residual window in tokens (kv_residual; 0: none).")
      .def_prop_ro("ring_slots", [](const PyKVCache& c) { return c.cache->ring().slots(); },
                   "Slots of each layer's ring: max_chunk + residual + 31 rounded up to a block (0: none).")
      .def("ring_lo", [](const PyKVCache& c, uint32_t l) { return in_range(c, l).ring().lo(l); }, "layer"_a,
           "The first position whose f16 row the layer's ring holds; the queries read the pool below it.")
      .def("has_ring", [](const PyKVCache& c, uint32_t l) { return in_range(c, l).ring().has(l); }, "layer"_a,
           "Whether the layer keeps a residual window (kv_residual and a quantized K or V).")
      .def("read_ring",
           [](const PyKVCache& c, uint32_t layer, uint32_t first, uint32_t n) {
             const size_t row = size_t(c.cache->spec().n_kv_heads) * c.cache->spec().head_dim;
             auto* k = new uint16_t[std::max<size_t>(1, n * row)];
             auto* v = new uint16_t[std::max<size_t>(1, n * row)];
             nb::capsule own_k(k, [](void* p) noexcept { delete[] static_cast<uint16_t*>(p); });
             nb::capsule own_v(v, [](void* p) noexcept { delete[] static_cast<uint16_t*>(p); });
             c.cache->ring().read(layer, first, n, c.cache->length(layer), reinterpret_cast<uint8_t*>(k),
                                  reinterpret_cast<uint8_t*>(v));
             const size_t shape[3] = {n, c.cache->spec().n_kv_heads, c.cache->spec().head_dim};
             return std::make_pair(nb::ndarray<nb::numpy, uint16_t, nb::ndim<3>>(k, 3, shape, own_k),
                                   nb::ndarray<nb::numpy, uint16_t, nb::ndim<3>>(v, 3, shape, own_v));
           },
           "layer"_a, "first"_a, "n"_a,
           "The ring's f16 rows of positions first..first+n-1 (ring_lo(layer) <= first, first + n <= length) "
           "as (k, v) uint16 (n, n_kv_heads, head_dim) half bits: what a saved cache keeps of its window.")
      .def("write_ring",
           [](PyKVCache& c, uint32_t layer, uint32_t first,
              const nb::ndarray<const uint16_t, nb::ndim<3>, nb::c_contig, nb::device::cpu>& k,
              const nb::ndarray<const uint16_t, nb::ndim<3>, nb::c_contig, nb::device::cpu>& v) {
             const kv::KvCacheSpec& s = c.cache->spec();
             if (k.shape(1) != s.n_kv_heads || k.shape(2) != s.head_dim || v.shape(0) != k.shape(0) ||
                 v.shape(1) != s.n_kv_heads || v.shape(2) != s.head_dim)
               throw nb::value_error("[kv_cache] write_ring wants k and v uint16 (n, n_kv_heads, head_dim)");
             c.cache->write_ring(layer, first, uint32_t(k.shape(0)), reinterpret_cast<const uint8_t*>(k.data()),
                                 reinterpret_cast<const uint8_t*>(v.data()));
           },
           "layer"_a, "first"_a, "k"_a, "v"_a,
           "Puts back the ring's rows of the layer's last positions first..length-1 (read_ring's) and makes "
           "first its ring_lo: a saved cache read back with its window.")
      .def_prop_ro("table_nbytes", [](const PyKVCache& c) { return c.cache->table_nbytes(); })
      .def_prop_ro("bytes_per_token", [](const PyKVCache& c) { return c.cache->bytes_per_token(); },
                   "Bytes one more context token costs: a K and a V row in every non-wrapping layer.")
      .def_prop_ro("n_layers", [](const PyKVCache& c) { return c.cache->spec().n_layers; })
      .def_prop_ro("n_kv_heads", [](const PyKVCache& c) { return c.cache->spec().n_kv_heads; })
      .def_prop_ro("head_dim", [](const PyKVCache& c) { return c.cache->spec().head_dim; })
      .def_prop_ro("capacity", [](const PyKVCache& c) { return c.cache->spec().capacity; })
      .def_prop_ro("max_chunk", [](const PyKVCache& c) { return c.cache->spec().max_chunk; })
      .def_prop_ro("windows", [](const PyKVCache& c) { return c.cache->spec().windows; })
      .def_prop_ro("store", [](const PyKVCache& c) { return std::string(kv::store_path_name(c.cache->spec().store)); })
      .def_prop_ro("last_append_counters", [](const PyKVCache& c) { return c.last.as_map(); },
                   "Counters (encoders, dispatches, blit bytes) of the last append's command buffer.")
      .def_prop_ro("tokens", [](const PyKVCache& c) { return c.cache->record().tokens(); },
                   "Token ids an Engine fed into this cache, in order (empty when filled by append).")
      .def_prop_rw(
          "messages",
          [](const PyKVCache& c) {
            nb::list out;
            for (const kv::ChatMessage& m : c.cache->record().messages()) {
              nb::dict d;
              d["role"] = m.role;
              d["content"] = m.content;
              out.append(d);
            }
            return out;
          },
          [](PyKVCache& c, const std::vector<std::map<std::string, std::string>>& messages) {
            std::vector<kv::ChatMessage> ms;
            for (const auto& m : messages) {
              if (m.size() != 2 || !m.count("role") || !m.count("content"))
                throw nb::value_error("[kv_cache] a message is a dict with exactly 'role' and 'content'");
              ms.push_back({m.at("role"), m.at("content")});
            }
            c.cache->record().set_messages(std::move(ms));
          },
          "The chat (a list of {'role', 'content'}) whose rendering the tokens are; empty when the cache holds "
          "plain text. A truncate() that drops tokens clears it.")
      .def("truncate", [](PyKVCache& c, uint32_t n) { c.cache->truncate(n); }, "n"_a,
           "Forgets every token from position n on (all layers), so the next token goes to position n. "
           "A sliding layer can always go back to max_chunk positions before the start of its last append "
           "(more while its oldest block is held); raises GpuError when the window at n needs positions it let go.")
      .def("reset", [](PyKVCache& c) { c.cache->reset(); }, "Every layer back to length 0, no tokens, no messages.")
      .def("begin_at", [](PyKVCache& c, const std::vector<uint32_t>& first) { c.cache->begin_at(first); }, "first"_a,
           "An empty cache whose layer l starts at position first[l] (layers of a window together, full layers at "
           "0): how a saved cache is read back.")
      .def("record_tokens",
           [](PyKVCache& c, const std::vector<int32_t>& ids) { c.cache->record().record(ids.data(), uint32_t(ids.size())); },
           "ids"_a, "Appends to tokens (what an engine fed); for reading a saved cache back.")
      .def_prop_rw(
          "model_fingerprint", [](const PyKVCache& c) { return c.cache->record().fingerprint(); },
          [](PyKVCache& c, const std::string& f) { c.cache->record().set_fingerprint(f); },
          "The model whose rows the cache holds (set by the Engine that made it; '' otherwise).")
      .def(
          "save",
          [](nb::handle self, nb::object path) { nb::module_::import_("metalkv.cache_file").attr("save_cache")(self, path); },
          "path"_a,
          "Writes the cache to one safetensors file, atomically: its rows, token ids, chat, the model's "
          "fingerprint, the KV format and a format version (metalkv.cache_file; Engine.load_cache reads it).");

}

MKV_BINDING(kv, bind_kv);

}  // namespace mkv::bindings
