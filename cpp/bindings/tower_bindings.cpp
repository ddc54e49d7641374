// metalkv._core.Siglip, Conformer and MobileNet: Gemma 3's vision tower and
// projector, Gemma 3n's audio tower and its vision tower, with their embedders, on
// a device (cpp/towers/); python/metalkv/models/vision.py, audio.py and
// vision3n.py load and drive them.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "towers/conformer.h"
#include "towers/mobilenet.h"
#include "towers/siglip.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace mkv::bindings {
namespace {

using Frames = nb::ndarray<nb::ro, float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using Pixels = nb::ndarray<nb::ro, float, nb::ndim<4>, nb::c_contig, nb::device::cpu>;

// A float vector the returned array owns, shaped (rows, cols).
nb::ndarray<nb::numpy, float> owned(std::vector<float>&& v, size_t rows, size_t cols) {
  auto* out = new std::vector<float>(std::move(v));
  nb::capsule keep(out, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  const size_t shape[2] = {rows, cols};
  return nb::ndarray<nb::numpy, float>(out->data(), 2, shape, keep);
}

towers::SiglipSpec siglip_spec(const nb::dict& d) {
  towers::SiglipSpec s;
  for (auto [key, value] : d) {
    const std::string k = nb::cast<std::string>(key);
    auto u32 = [&] { return nb::cast<uint32_t>(value); };
    if (k == "n_layers") s.n_layers = u32();
    else if (k == "hidden") s.hidden = u32();
    else if (k == "n_heads") s.n_heads = u32();
    else if (k == "head_dim") s.head_dim = u32();
    else if (k == "ffn") s.ffn = u32();
    else if (k == "channels") s.channels = u32();
    else if (k == "patch") s.patch = u32();
    else if (k == "patch_dim") s.patch_dim = u32();
    else if (k == "grid") s.grid = u32();
    else if (k == "pool") s.pool = u32();
    else if (k == "text_hidden") s.text_hidden = u32();
    else if (k == "eps") s.eps = nb::cast<float>(value);
    else if (k == "mm_eps") s.mm_eps = nb::cast<float>(value);
    else if (k == "mm_norm_offset") s.mm_norm_offset = nb::cast<float>(value);
    else if (k == "scale") s.scale = nb::cast<float>(value);
    else if (k == "operands_16bit") s.operands_16bit = nb::cast<bool>(value);
    else throw nb::value_error(("[siglip] unknown spec key '" + k + "'").c_str());
  }
  return s;
}

struct PySiglip {
  std::unique_ptr<towers::Siglip> tower;
};

towers::ConformerSpec conformer_spec(const nb::dict& d) {
  towers::ConformerSpec s;
  for (auto [key, value] : d) {
    const std::string k = nb::cast<std::string>(key);
    auto u32 = [&] { return nb::cast<uint32_t>(value); };
    auto f32 = [&] { return nb::cast<float>(value); };
    if (k == "n_layers") s.n_layers = u32();
    else if (k == "hidden") s.hidden = u32();
    else if (k == "n_heads") s.n_heads = u32();
    else if (k == "ffn") s.ffn = u32();
    else if (k == "n_mels") s.n_mels = u32();
    else if (k == "conv") {
      const auto stages = nb::cast<std::vector<std::vector<uint32_t>>>(value);
      if (stages.size() != 2 || stages[0].size() != 5 || stages[1].size() != 5)
        throw nb::value_error("[conformer] conv must be two stages of [channels, kt, kf, st, sf]");
      for (int i = 0; i < 2; ++i)
        s.conv[i] = {stages[i][0], stages[i][1], stages[i][2], stages[i][3], stages[i][4]};
    } else if (k == "left") s.left = u32();
    else if (k == "right") s.right = u32();
    else if (k == "taps") s.taps = u32();
    else if (k == "reduction") s.reduction = u32();
    else if (k == "vocab") s.vocab = u32();
    else if (k == "text_hidden") s.text_hidden = u32();
    else if (k == "softcap") s.softcap = f32();
    else if (k == "residual_weight") s.residual_weight = f32();
    else if (k == "eps") s.eps = f32();
    else if (k == "group_eps") s.group_eps = f32();
    else if (k == "mm_eps") s.mm_eps = f32();
    else throw nb::value_error(("[conformer] unknown spec key '" + k + "'").c_str());
  }
  return s;
}

towers::MobileBlock mobile_block(const nb::dict& d) {
  towers::MobileBlock b;
  for (auto [key, value] : d) {
    const std::string k = nb::cast<std::string>(key);
    auto u32 = [&] { return nb::cast<uint32_t>(value); };
    if (k == "kind") {
      const std::string kind = nb::cast<std::string>(value);
      if (kind == "edge") b.kind = towers::MobileBlock::edge;
      else if (kind == "inverted") b.kind = towers::MobileBlock::inverted;
      else if (kind == "attention") b.kind = towers::MobileBlock::attention;
      else throw nb::value_error(("[mobilenet] unknown block kind '" + kind + "'").c_str());
    } else if (k == "in") b.in = u32();
    else if (k == "out") b.out = u32();
    else if (k == "mid") b.mid = u32();
    else if (k == "k") b.k = u32();
    else if (k == "k_start") b.k_start = u32();
    else if (k == "k_mid") b.k_mid = u32();
    else if (k == "stride") b.stride = u32();
    else if (k == "heads") b.heads = u32();
    else if (k == "key_dim") b.key_dim = u32();
    else if (k == "kv_stride") b.kv_stride = u32();
    else if (k == "kv_kernel") b.kv_kernel = u32();
    else throw nb::value_error(("[mobilenet] unknown block key '" + k + "'").c_str());
  }
  return b;
}

towers::MobileNetSpec mobilenet_spec(const nb::dict& d) {
  towers::MobileNetSpec s;
  for (auto [key, value] : d) {
    const std::string k = nb::cast<std::string>(key);
    auto u32 = [&] { return nb::cast<uint32_t>(value); };
    if (k == "image") s.image = u32();
    else if (k == "stem") s.stem = u32();
    else if (k == "blocks") {
      for (nb::handle b : nb::cast<nb::list>(value)) s.blocks.push_back(mobile_block(nb::cast<nb::dict>(b)));
    } else if (k == "fuse") {
      const auto f = nb::cast<std::vector<uint32_t>>(value);
      if (f.size() != 2) throw nb::value_error("[mobilenet] fuse must be two block indices");
      s.fuse[0] = f[0];
      s.fuse[1] = f[1];
    } else if (k == "fusion_mid") s.fusion_mid = u32();
    else if (k == "hidden") s.hidden = u32();
    else if (k == "resolution") s.resolution = u32();
    else if (k == "vocab") s.vocab = u32();
    else if (k == "text_hidden") s.text_hidden = u32();
    else if (k == "eps") s.eps = nb::cast<float>(value);
    else if (k == "mm_eps") s.mm_eps = nb::cast<float>(value);
    else throw nb::value_error(("[mobilenet] unknown spec key '" + k + "'").c_str());
  }
  return s;
}

struct PyMobileNet {
  std::unique_ptr<towers::MobileNet> tower;
};

struct PyConformer {
  std::unique_ptr<towers::Conformer> tower;
};

void bind_towers(nb::module_& m, nb::module_& /*ops*/) {
  nb::class_<PySiglip>(m, "Siglip", "Gemma 3's vision tower and projector (SigLIP), on a device.")
      .def(
          "__init__",
          [](PySiglip* self, PyDevice& dev, const nb::dict& spec, PyWeights& weights) {
            if (!weights.weights) throw nb::value_error("[siglip] the weights were given away already");
            new (self) PySiglip{std::make_unique<towers::Siglip>(dev.device, siglip_spec(spec),
                                                                 std::move(*weights.weights))};
            weights.weights.reset();
          },
          "device"_a, "spec"_a, "weights"_a,
          "spec: n_layers, hidden, n_heads, head_dim (stored), ffn, channels, patch, patch_dim, grid, pool, text_hidden,\n"
          "eps, mm_eps, mm_norm_offset (1: Gemma's 1 + w, 0: w as stored), scale. Takes the weights (the Weights object is empty afterwards).")
      .def_prop_ro("tokens_per_image", [](const PySiglip& s) { return s.tower->spec().tokens_per_image(); })
      .def_prop_ro("n_patches", [](const PySiglip& s) { return s.tower->spec().n_patches(); })
      .def_prop_ro("weights_nbytes", [](const PySiglip& s) { return s.tower->weights_nbytes(); })
      .def(
          "encode",
          [](PySiglip& s, const Pixels& pixels) {
            const towers::SiglipSpec& sp = s.tower->spec();
            const std::string side = std::to_string(sp.image_size());
            if (pixels.shape(1) != sp.channels || pixels.shape(2) != sp.image_size() ||
                pixels.shape(3) != sp.image_size())
              throw nb::value_error(("[siglip] pixels must be (n_images, " + std::to_string(sp.channels) + ", " +
                                     side + ", " + side + ") float32")
                                        .c_str());
            const uint32_t n = uint32_t(pixels.shape(0));
            std::vector<float>* out;
            {
              nb::gil_scoped_release release;
              out = new std::vector<float>(s.tower->encode(pixels.data(), n));
            }
            nb::capsule keep(out, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
            const size_t shape[3] = {n, sp.tokens_per_image(), sp.text_hidden};
            return nb::ndarray<nb::numpy, float>(out->data(), 3, shape, keep);
          },
          "pixels"_a,
          "pixels (n_images, channels, image_size, image_size) float32, as the processor prepares them ->\n"
          "(n_images, tokens_per_image, text_hidden) float32, the images' soft tokens.");

  nb::class_<PyConformer>(m, "Conformer", "Gemma 3n's audio tower and its embedder, on a device.")
      .def(
          "__init__",
          [](PyConformer* self, PyDevice& dev, const nb::dict& spec, PyWeights& weights) {
            if (!weights.weights) throw nb::value_error("[conformer] the weights were given away already");
            new (self) PyConformer{std::make_unique<towers::Conformer>(dev.device, conformer_spec(spec),
                                                                       std::move(*weights.weights))};
            weights.weights.reset();
          },
          "device"_a, "spec"_a, "weights"_a,
          "spec: n_layers, hidden, n_heads, ffn, n_mels, conv ([channels, kt, kf, st, sf] x 2), left,\n"
          "right, taps, reduction, vocab, text_hidden, softcap, residual_weight, eps, group_eps, mm_eps.\n"
          "Takes the weights (the Weights object is empty afterwards).")
      .def_prop_ro("weights_nbytes", [](const PyConformer& c) { return c.tower->weights_nbytes(); })
      .def("tokens_for", [](const PyConformer& c, uint32_t n_frames) { return c.tower->tokens_for(n_frames); },
           "n_frames"_a, "Soft tokens a clip of n_frames feature frames yields before padding.")
      .def(
          "encode",
          [](PyConformer& c, const Frames& features, uint32_t n_valid, uint32_t n_tokens) {
            const towers::ConformerSpec& sp = c.tower->spec();
            if (features.shape(1) != sp.n_mels)
              throw nb::value_error(
                  ("[conformer] features must be (n_frames, " + std::to_string(sp.n_mels) + ") float32").c_str());
            std::vector<float> rows;
            {
              nb::gil_scoped_release release;
              rows = c.tower->encode(features.data(), uint32_t(features.shape(0)), n_valid, n_tokens);
            }
            return owned(std::move(rows), n_tokens, sp.text_hidden);
          },
          "features"_a, "n_valid"_a, "n_tokens"_a,
          "features (n_frames, n_mels) float32 log-mel, the first n_valid the clip's ->\n"
          "(n_tokens, text_hidden) float32: the clip's soft tokens, padding rows after.")
      .def("hard_rows", [](const PyConformer& c) {
        const towers::ConformerSpec& sp = c.tower->spec();
        return owned(std::vector<float>(c.tower->hard_rows()), sp.vocab, sp.text_hidden);
      }, "(vocab, text_hidden) float32, a copy: the embedder's rows of its hard tokens.");

  nb::class_<PyMobileNet>(m, "MobileNet", "Gemma 3n's vision tower (MobileNet-V5) and its embedder, on a device.")
      .def(
          "__init__",
          [](PyMobileNet* self, PyDevice& dev, const nb::dict& spec, PyWeights& weights) {
            if (!weights.weights) throw nb::value_error("[mobilenet] the weights were given away already");
            new (self) PyMobileNet{std::make_unique<towers::MobileNet>(dev.device, mobilenet_spec(spec),
                                                                       std::move(*weights.weights))};
            weights.weights.reset();
          },
          "device"_a, "spec"_a, "weights"_a,
          "spec: image, stem, blocks (dicts: kind 'edge' | 'inverted' | 'attention', in, out, mid, k,\n"
          "k_start, k_mid, stride, heads, key_dim, kv_stride, kv_kernel), fuse ([finer block, last block]),\n"
          "fusion_mid, hidden, resolution, vocab, text_hidden, eps, mm_eps. Takes the weights.")
      .def_prop_ro("weights_nbytes", [](const PyMobileNet& t) { return t.tower->weights_nbytes(); })
      .def_prop_ro("tokens_per_image", [](const PyMobileNet& t) { return t.tower->spec().tokens_per_image(); })
      .def(
          "encode",
          [](PyMobileNet& t, const Pixels& pixels) {
            const towers::MobileNetSpec& sp = t.tower->spec();
            if (pixels.shape(1) != sp.image || pixels.shape(2) != sp.image || pixels.shape(3) != 3)
              throw nb::value_error(("[mobilenet] pixels must be (n, " + std::to_string(sp.image) + ", " +
                                     std::to_string(sp.image) + ", 3) float32").c_str());
            const size_t n = pixels.shape(0);
            std::vector<float> rows;
            {
              nb::gil_scoped_release release;
              rows = t.tower->encode(pixels.data(), uint32_t(n));
            }
            return owned(std::move(rows), n * sp.tokens_per_image(), sp.text_hidden);
          },
          "pixels"_a,
          "pixels (n_images, image, image, 3) float32, channels last ->\n"
          "(n_images tokens_per_image, text_hidden) float32, the images' soft tokens.")
      .def("hard_rows", [](const PyMobileNet& t) {
        const towers::MobileNetSpec& sp = t.tower->spec();
        return owned(std::vector<float>(t.tower->hard_rows()), sp.vocab, sp.text_hidden);
      }, "(vocab, text_hidden) float32, a copy: the embedder's rows of its hard tokens.");
}

}  // namespace

MKV_BINDING(towers, bind_towers);

}  // namespace mkv::bindings
