// metalkv._core.Siglip: Gemma 3's vision tower and projector on a device
// (cpp/towers/siglip.h); python/metalkv/models/vision.py loads and drives it.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include "bindings.h"
#include "towers/siglip.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace mkv::bindings {
namespace {

using Patches = nb::ndarray<nb::ro, float, nb::ndim<3>, nb::c_contig, nb::device::cpu>;

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
    else if (k == "patch_dim") s.patch_dim = u32();
    else if (k == "grid") s.grid = u32();
    else if (k == "pool") s.pool = u32();
    else if (k == "text_hidden") s.text_hidden = u32();
    else if (k == "eps") s.eps = nb::cast<float>(value);
    else if (k == "mm_eps") s.mm_eps = nb::cast<float>(value);
    else if (k == "scale") s.scale = nb::cast<float>(value);
    else throw nb::value_error(("[siglip] unknown spec key '" + k + "'").c_str());
  }
  return s;
}

struct PySiglip {
  std::unique_ptr<towers::Siglip> tower;
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
          "spec: n_layers, hidden, n_heads, head_dim (stored), ffn, patch_dim, grid, pool, text_hidden,\n"
          "eps, mm_eps, scale. Takes the weights (the Weights object is empty afterwards).")
      .def_prop_ro("tokens_per_image", [](const PySiglip& s) { return s.tower->spec().tokens_per_image(); })
      .def_prop_ro("n_patches", [](const PySiglip& s) { return s.tower->spec().n_patches(); })
      .def_prop_ro("weights_nbytes", [](const PySiglip& s) { return s.tower->weights_nbytes(); })
      .def(
          "encode",
          [](PySiglip& s, const Patches& patches) {
            const towers::SiglipSpec& sp = s.tower->spec();
            if (patches.shape(1) != sp.n_patches() || patches.shape(2) != sp.patch_dim)
              throw nb::value_error(("[siglip] patches must be (n_images, " + std::to_string(sp.n_patches()) + ", " +
                                     std::to_string(sp.patch_dim) + ") float32")
                                        .c_str());
            const uint32_t n = uint32_t(patches.shape(0));
            std::vector<float>* out;
            {
              nb::gil_scoped_release release;
              out = new std::vector<float>(s.tower->encode(patches.data(), n));
            }
            nb::capsule keep(out, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
            const size_t shape[3] = {n, sp.tokens_per_image(), sp.text_hidden};
            return nb::ndarray<nb::numpy, float>(out->data(), 3, shape, keep);
          },
          "patches"_a,
          "patches (n_images, n_patches, patch_dim) float32, each patch's (channel, y, x) values ->\n"
          "(n_images, tokens_per_image, text_hidden) float32, the images' soft tokens.");
}

}  // namespace

MKV_BINDING(towers, bind_towers);

}  // namespace mkv::bindings
