// metalkv._core.ops.select_kept: an eviction policy's rule (cpp/kv/kv_policy.h)
// on one KV head's tokens, bound for the tests' numpy reference.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "kv/kv_policy.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace mkv::bindings {
namespace {

using Positions = nb::ndarray<const uint32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Scores = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

void bind_policy(nb::module_& m, nb::module_& ops_m) {
  ops_m.def(
      "select_kept",
      [](const nb::dict& policy, Positions positions, std::optional<Scores> scores, uint32_t n_keep) {
        const kv::KvPolicySpec p = kv_policy_arg(policy);
        const size_t n = positions.shape(0);
        if (scores && scores->shape(0) != n) throw nb::value_error("[kv_policy] scores and positions differ in length");
        if (n_keep > n) throw nb::value_error("[kv_policy] n_keep is more than the tokens given");
        return kv::select_kept(p, positions.data(), scores ? scores->data() : nullptr, uint32_t(n), n_keep);
      },
      "policy"_a, "positions"_a, "scores"_a = nb::none(), "n_keep"_a,
      "The indices (ascending) that policy (KVCache's kv_policy dict) keeps of one KV head's tokens: positions\n"
      "uint32 and scores float32 per index (None for streaming).");
  m.attr("KV_POLICIES") = nb::tuple(nb::cast(kv::policy_names()));  // the CLI's choices
}

}  // namespace
}  // namespace mkv::bindings

MKV_BINDING(policy, mkv::bindings::bind_policy);
