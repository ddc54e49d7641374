// metalkv._core.BlockPool / BlockTable: the paged cache's block bookkeeping
// (cpp/kv/block_pool.h), bound for tests and tools; no device memory.
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <tuple>
#include <utility>

#include "bindings.h"
#include "kv/block_pool.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace mkv::bindings {
namespace {

void bind_blocks(nb::module_& m, nb::module_&) {
  m.attr("BLOCK_TOKENS") = kv::kBlockTokens;
  nb::class_<kv::BlockPool>(m, "BlockPool",
                            "Block ids of a paged KV cache with owner counts and a free list (host bookkeeping).")
      .def(nb::init<uint32_t>(), "n_blocks"_a)
      .def_prop_ro("capacity", &kv::BlockPool::capacity)
      .def_prop_ro("free_count", &kv::BlockPool::free_count)
      .def_prop_ro("used_count", &kv::BlockPool::used_count)
      .def_prop_ro("reserved_count", &kv::BlockPool::reserved_count)
      .def_prop_ro("available", &kv::BlockPool::available, "Free or evictable blocks less the reserved ones.")
      .def_prop_ro("cached_count", &kv::BlockPool::cached_count)
      .def_prop_ro("evictable_count", &kv::BlockPool::evictable_count)
      .def("allocate", &kv::BlockPool::allocate, "n"_a, "reserved"_a = 0,
           "n block ids (one owner each), `reserved` of them from reservations: free ones first (the most\n"
           "recently freed first), then the least recently used evictable ones; raises (taking none) if short.")
      .def("retain", &kv::BlockPool::retain, "id"_a)
      .def("release", &kv::BlockPool::release, "id"_a)
      .def("owners", &kv::BlockPool::owners, "id"_a)
      .def("try_reserve", &kv::BlockPool::try_reserve, "n"_a)
      .def("unreserve", &kv::BlockPool::unreserve, "n"_a)
      .def(
          "register_block",
          [](kv::BlockPool& p, uint32_t id, uint64_t hash, uint64_t parent, const std::vector<int32_t>& tokens) {
            return p.register_block(id, {hash, parent, tokens});
          },
          "id"_a, "hash"_a, "parent"_a, "tokens"_a,
          "Marks a held block as holding the rows of this key (False: the key or the block has one already).")
      .def(
          "find",
          [](const kv::BlockPool& p, uint64_t hash, uint64_t parent, const std::vector<int32_t>& tokens) {
            return p.find({hash, parent, tokens});
          },
          "hash"_a, "parent"_a, "tokens"_a, "The block holding this key's rows (tokens and parent verified), or -1.")
      .def("cached", &kv::BlockPool::cached, "id"_a);

  nb::class_<kv::BlockTable>(m, "BlockTable",
                             "One sequence's blocks in one window group: position p is slot "
                             "blocks[p // BLOCK_TOKENS] * BLOCK_TOKENS + p % BLOCK_TOKENS.")
      .def(nb::init<kv::BlockPool&, uint32_t, uint32_t>(), "pool"_a, "window"_a = 0, "history"_a = 0,
           nb::keep_alive<1, 2>(),
           "window 0: a full layer; W: a sliding layer, whose blocks leave as positions advance, keeping "
           "`history` positions more than the window.")
      .def_prop_ro("length", &kv::BlockTable::length)
      .def_prop_ro("window", &kv::BlockTable::window)
      .def_prop_ro("history", &kv::BlockTable::history)
      .def_prop_ro("first_valid", &kv::BlockTable::first_valid,
                   "Lowest position whose row was stored (after skip_to, or a window of 1 truncated into a let-go block).")
      .def("can_append", &kv::BlockTable::can_append, "n"_a, "Whether append(n) would find its blocks.")
      .def("skip_to", &kv::BlockTable::skip_to, "n"_a, "An empty sliding table starts at position n.")
      .def("state", [](const kv::BlockTable& t) {
             const kv::BlockTable::State st = t.state();
             return std::make_tuple(st.length, st.valid_from, st.blocks);
           }, "(length, first_valid, blocks): the table as data.")
      .def("restore", [](kv::BlockTable& t, uint32_t length, uint32_t valid_from, const std::vector<int64_t>& blocks) {
             t.restore({length, valid_from, blocks});
           }, "length"_a, "first_valid"_a, "blocks"_a,
           "Lets go of what it holds, then takes exactly those block ids again (raises if one is not free).")
      .def_prop_ro("blocks", &kv::BlockTable::blocks, "Physical block per logical block; -1 where it left.")
      .def_prop_ro("held_blocks", &kv::BlockTable::held_blocks)
      .def("slot", &kv::BlockTable::slot, "pos"_a)
      .def("blocks_needed", &kv::BlockTable::blocks_needed, "n"_a)
      .def(
          "append",
          [](kv::BlockTable& t, uint32_t n) {
            std::vector<std::pair<uint32_t, uint32_t>> out;
            for (const kv::BlockCopy& c : t.append(n)) out.emplace_back(c.src, c.dst);
            return out;
          },
          "n"_a, "Room for n more positions; returns the (src, dst) block copies to make first (copy-on-write).")
      .def("truncate", &kv::BlockTable::truncate, "n"_a)
      .def("share_prefix", &kv::BlockTable::share_prefix, "other"_a, "n"_a,
           "This (empty) table takes the first n positions of other, sharing its blocks.")
      .def("adopt", &kv::BlockTable::adopt, "ids"_a, "n"_a,
           "This (empty) table takes n positions held in these blocks (one per logical block, -1 where a sliding\n"
           "window needs none), an owner on each.")
      .def("reserve", &kv::BlockTable::reserve, "n"_a)
      .def("unreserve", &kv::BlockTable::unreserve)
      .def_prop_ro("reserved", &kv::BlockTable::reserved);
}

}  // namespace
}  // namespace mkv::bindings

MKV_BINDING(blocks, mkv::bindings::bind_blocks);
