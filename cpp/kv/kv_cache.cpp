// KvCache: allocation, checks, and the compute and blit store paths.
#include "kv/kv_cache.h"
#include "kv/kv_cache_errors.h"
#include "kv/kv_cache_spec.h"
#include "kv/prefix_cache.h"

#include <algorithm>

#include "ops/kv_store.h"

using mkv::ops::ceil_div;

namespace mkv::kv {
using detail::fail;
using detail::Lock;
using detail::str;
using detail::check_spec;
using detail::own_pool;

StorePath parse_store_path(const std::string& name) {
  if (name == "compute") return StorePath::compute;
  if (name == "blit") return StorePath::blit;
  fail("unknown store path '" + name + "'; expected 'compute' (kernel writes the slots) or 'blit' "
       "(kernel writes a staging buffer, a blit encoder copies it)");
}

const char* store_path_name(StorePath path) { return path == StorePath::blit ? "blit" : "compute"; }


KvCache::KvCache(gpu::DevicePtr device, KvCacheSpec spec) : device_(std::move(device)), spec_(std::move(spec)) {
  check_spec(device_, spec_);  // its argument errors as they are
  try {
    pool_ = own_pool(device_, spec_);
  } catch (const gpu::GpuError& e) {  // "[kv_pool] ...": this cache's own
    const std::string what = e.what();
    fail(what.rfind("[kv_pool] ", 0) == 0 ? what.substr(10) : what);
  }
  init_groups();
}

KvCache::KvCache(gpu::DevicePtr device, std::shared_ptr<KvPool> pool, KvCacheSpec spec)
    : device_(std::move(device)), spec_(std::move(spec)), pool_(std::move(pool)), owns_pool_(false) {
  check_spec(device_, spec_);
  if (!pool_) fail("pool is null");
  const KvPoolSpec& p = pool_->spec();
  if (p.windows != spec_.windows || p.n_kv_heads != spec_.n_kv_heads || p.head_dim != spec_.head_dim)
    fail("the shared pool is for other layers (its windows, n_kv_heads or head_dim differ from the cache's)");
  p.check_serves(spec_.k_formats, spec_.v_formats, spec_.rotate, "kv_cache");
  if (p.split_full != spec_.policy.traits().budget_per_layer)
    fail(std::string("kv_policy='") + policy_name(spec_.policy.kind) + "' and the pool disagree on budgets per "
         "layer: a policy with one keeps each layer in blocks of its own, so its caches need their own pool");
  init_groups();
}

KvCache::~KvCache() {
  Lock lock(pool_->mutex());
  groups_.clear();  // the tables give their blocks and reservations back
}

void KvCache::init_groups() {
  Lock lock(pool_->mutex());
  alloc_ = {device_.get(), pool_->budget()};
  for (uint32_t g = 0; g < pool_->n_groups(); ++g) {
    Group group;
    group.window = pool_->group_window(g);
    group.evicts = group.window == 0 && spec_.policy.evicts();
    // (a sliding group of an evicting cache goes on past the capacity, the budget, as the
    // evicting groups do: it lets go of what leaves its window however large that is)
    group.wraps = group.evicts || layer_wraps(group.window, spec_.capacity, spec_.max_chunk) ||
                  (group.window != 0 && spec_.policy.evicts());
    group.layers = pool_->group_layers(g);
    group.table = std::make_unique<BlockTable>(pool_->blocks(g), group.window, spec_.max_chunk);
    groups_.push_back(std::move(group));
  }
  lengths_.assign(spec_.n_layers, 0);
  eviction_.init(*device_, alloc_, spec_.policy, spec_.windows, spec_.n_kv_heads, spec_.head_dim, spec_.capacity);
  std::vector<LayerLayout> layouts;
  for (uint32_t l = 0; l < spec_.n_layers; ++l) layouts.push_back(layout(l));
  ring_.init(alloc_, spec_.residual, spec_.max_chunk, layouts);
  // A cache of its own pool makes all of itself now; over a shared one its
  // mirrors, staging and ring wait for its admission or first store (kv_memory
  // counts what it holds).
  if (owns_pool_) {
    for (Group& g : groups_) sync_table(g, 0);
    if (spec_.store == StorePath::blit) staging_for(spec_.max_chunk);
    ring_.ensure();
  }
}

void KvCache::check_layer(uint32_t layer) const {
  if (layer >= spec_.n_layers)
    fail("layer " + str(layer) + " is out of range; the cache has " + str(spec_.n_layers) +
         " layers (0.." + str(spec_.n_layers - 1) + ")");
}

BufferView KvCache::region(uint32_t layer) const {
  check_layer(layer);
  return pool_->region(layer);
}

LayerLayout KvCache::layout(uint32_t layer) const {
  check_layer(layer);
  return pool_->layout(layer);
}

uint32_t KvCache::slots(uint32_t layer) const { return layout(layer).slots; }

uint32_t KvCache::length(uint32_t layer) const {
  check_layer(layer);
  return lengths_[layer];
}

uint32_t KvCache::window(uint32_t layer) const {
  check_layer(layer);
  return spec_.windows[layer];
}

bool KvCache::wraps(uint32_t layer) const {
  check_layer(layer);
  return group_of(layer).wraps;
}

const BlockTable& KvCache::block_table(uint32_t layer) const {
  check_layer(layer);
  return *group_of(layer).table;
}

BufferView KvCache::table(uint32_t layer) const {
  check_layer(layer);
  return {group_of(layer).mirror, 0};
}

std::vector<int64_t> KvCache::positions(uint32_t layer) const {
  std::vector<int64_t> out(slots(layer), -1);
  const std::vector<int64_t>& blocks = block_table(layer).blocks();
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i] < 0) continue;
    for (uint32_t j = 0; j < kBlockTokens; ++j) {
      const uint64_t index = i * kBlockTokens + j;
      if (index < eviction_.count(layer) && index >= block_table(layer).first_valid())
        out[size_t(blocks[i]) * kBlockTokens + j] = eviction_.position(layer, uint32_t(index));  // (head 0's with a policy)
    }
  }
  return out;
}

void KvCache::sync_table(Group& g, size_t from_block) {
  const std::vector<int64_t>& blocks = g.table->blocks();
  const size_t have = g.mirror ? g.mirror->length() / sizeof(uint32_t) : 0;
  if (blocks.size() > have || !g.mirror) {
    // Grown buffers start over; commands already encoded keep the old one alive.
    const size_t entries = std::max<size_t>({blocks.size(), 2 * have, ceil_div(spec_.capacity, kBlockTokens)});
    g.mirror = alloc_(entries * sizeof(uint32_t), "a block table's mirror");
    from_block = 0;
  }
  if (from_block >= blocks.size()) return;
  std::vector<uint32_t> ids(blocks.size() - from_block);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = blocks[from_block + i] < 0 ? 0u : uint32_t(blocks[from_block + i]);
  g.mirror->write(from_block * sizeof(uint32_t), ids.data(), ids.size() * sizeof(uint32_t));
}

void KvCache::encode_copies(EncoderSession& enc, const Group& g, const std::vector<BlockCopy>& copies) {
  if (copies.empty()) return;
  gpu::BlitEncoder& blit = enc.blit();
  for (uint32_t l : g.layers) {
    const LayerLayout lay = layout(l);
    for (const BlockCopy& c : copies)
      for (uint32_t kv = 0; kv < 2; ++kv)
        blit.copy(region(l).buffer, lay.block_offset(kv, c.src), region(l).buffer, lay.block_offset(kv, c.dst),
                  lay.block_bytes(kv));
  }
}

BufferView KvCache::staging_for(uint32_t n_new) {
  // A full layer may take a chunk larger than max_chunk: grow. Commands already
  // encoded keep the old buffer alive through their command buffer.
  if (n_new > staging_rows_) {
    size_t most = 0;  // the layer whose formats take the most bytes a token
    for (uint32_t l = 0; l < spec_.n_layers; ++l) most = std::max(most, layout(l).nbytes() / layout(l).slots);
    staging_ = alloc_(size_t(n_new) * most, "the blit path's staging");
    staging_rows_ = n_new;
  }
  return {staging_, 0};
}

void KvCache::check_store(uint32_t layer, uint32_t n_new, const RopeSpec* rope_k) const {
  Lock lock(pool_->mutex());
  check_layer(layer);
  if (n_new == 0) fail("storing 0 tokens in layer " + str(layer) + "; n_new must be at least 1");
  const uint32_t n = eviction_.count(layer);  // (the next index; the next position without a policy)
  if (spec_.residual && ring_.has(layer) && n_new > spec_.max_chunk)
    fail("layer " + str(layer) + " keeps a residual window of " + str(spec_.residual) + " tokens in a ring of " +
         str(ring_.slots()) + " slots; storing " + str(n_new) + " tokens in one call exceeds max_chunk " +
         str(spec_.max_chunk) + " (create the cache with a larger max_chunk or store in smaller chunks)");
  if (evicts(layer) && n_new > spec_.max_chunk)
    fail("layer " + str(layer) + " evicts (kv_policy '" + policy_name(spec_.policy.kind) + "', budget " +
         str(spec_.policy.budget) + " tokens); storing " + str(n_new) + " tokens in one call exceeds max_chunk " +
         str(spec_.max_chunk) + " (create the cache with a larger max_chunk or store in smaller chunks)");
  if (spec_.windows[layer] != 0 && n_new > spec_.max_chunk)
    fail("layer " + str(layer) + " is sliding (window " + str(spec_.windows[layer]) + ", " + str(slots(layer)) +
         " slots); storing " + str(n_new) + " tokens in one call exceeds max_chunk " +
         str(spec_.max_chunk) + " (create the cache with a larger max_chunk or store in smaller chunks)");
  if (!wraps(layer) && uint64_t(n) + n_new > spec_.capacity)
    fail("layer " + str(layer) + " holds " + str(n) + " tokens; storing " + str(n_new) + " more needs " +
         str(uint64_t(n) + n_new) + " > capacity " + str(spec_.capacity) +
         " (create the cache with a larger capacity, or with an eviction policy: kv_policy)");
  if (uint64_t(lengths_[layer]) + n_new >= (uint64_t(1) << 32))
    fail("layer " + str(layer) + " would pass 2^32 - 1 positions");
  // Room in the pool (shared by every cache of an engine, or this cache's own;
  // an eviction makes its own room, or raises before encoding anything).
  const uint32_t held = group_of(layer).table->length();
  const bool evicting = evicts(layer) && n + n_new > eviction_.limit(layer, lengths_[layer]);
  if (!evicting && n + n_new > held && !group_of(layer).table->can_append(n + n_new - held)) {
    const uint32_t g = pool_->group_of(layer);
    const BlockPool& blocks = pool_->blocks(g);
    fail("the KV pool is full: layer " + str(layer) + " (window " + str(spec_.windows[layer]) + ") needs " +
         str(group_of(layer).table->blocks_needed(n + n_new - held)) + " more blocks of " + str(kBlockTokens) +
         " tokens and " + str(blocks.free_count()) + " of its group's " + str(blocks.capacity()) +
         " are free (" + str(pool_->nbytes()) + " bytes in all); free other caches or load the engine with a "
         "larger kv_memory");
  }
  // A layer behind the others of its window group stores into blocks the
  // group already holds: they, and its window, must not have been let go.
  const BlockTable& t = *group_of(layer).table;
  const uint32_t w = spec_.windows[layer];
  // (full tables never let go; positions before first_valid were never stored: a
  // table that began there, a saved cache read back, serves no window before it)
  const uint32_t first = std::max(n < w ? 0 : n - w + 1, t.first_valid());
  for (uint32_t pos = first; w != 0 && n < t.length() && pos < std::min(t.length(), n + n_new);
       pos += kBlockTokens - pos % kBlockTokens)
    if (t.blocks()[pos / kBlockTokens] < 0)
      fail("layer " + str(layer) + " holds " + str(n) + " tokens, behind the " + str(t.length()) +
           " of its window group (window " + str(w) + "), which has let go of position " + str(pos) +
           " it needs; store the layers of a window group in step");
  if (rope_k) ops::check_rope("kv_cache", *rope_k, spec_.head_dim);
}

void KvCache::store(EncoderSession& enc, uint32_t layer, const BufferView& k_new,
                    const BufferView& v_new, uint32_t n_new, const RopeSpec* rope_k,
                    const ops::QueryRope& queries, Checked checked) {
  // 1. checks, before anything is encoded or n moves
  if (checked == Checked::no) check_store(layer, n_new, rope_k);
  const uint32_t n = lengths_[layer];
  Group& g = group_of(layer);
  // 2. a full budget evicts first (the first layer of the step, for all)
  if (g.evicts && eviction_.count(layer) + n_new > eviction_.limit(layer, n)) evict(enc, g, n_new);
  const uint32_t index = eviction_.count(layer);

  // 3. room in the group's table (the first layer of a step to get here makes
  // it for all); a shared tail block is copied in every layer of the group
  const uint32_t held = g.table->length();
  if (index + n_new > held) {
    std::vector<BlockCopy> copies;
    {
      Lock lock(pool_->mutex());
      copies = g.table->append(index + n_new - held);
    }
    sync_table(g, held / kBlockTokens);
    encode_copies(enc, g, copies);
  }

  // 4. encode: the compute path writes the slots directly ...
  const LayerLayout lay = layout(layer);
  const bool with_ring = ring_.has(layer);
  if (with_ring) ring_.ensure();
  ops::KvStoreDesc d{n_new, spec_.n_kv_heads, spec_.head_dim, lay.slots, 0, n, index, rope_k, queries,
                     table(layer), lay.k_format, lay.v_format, lay.rotate, with_ring ? ring_.slots() : 0u,
                     ring_.view(layer)};
  if (spec_.store == StorePath::compute) {
    ops::kv_store(*device_, enc.compute(), k_new, v_new, region(layer), d);
  } else {
    // ... the blit path stages n_new slots (K and V sections of one unit each)
    // and copies them, per block the chunk touches one run of consecutive
    // slots: its data plane's bytes, and a quantized format's parameters.
    const BufferView staging = staging_for(n_new);
    d.dst_rows = n_new;
    d.table = {};
    ops::kv_store(*device_, enc.compute(), k_new, v_new, staging, d);
    gpu::BlitEncoder& blit = enc.blit();
    for (uint32_t t = 0; t < n_new;) {
      const uint32_t at = index + t, run = std::min(n_new - t, kBlockTokens - at % kBlockTokens);
      const uint32_t slot = g.table->slot(at);
      for (uint32_t kv = 0; kv < 2; ++kv) {
        const std::vector<LayerLayout::Range> from = LayerLayout::unit_ranges(
            lay.format(kv), spec_.n_kv_heads, spec_.head_dim, n_new, kv ? size_t(n_new) * lay.slot_bytes(0) : 0, t, run);
        const std::vector<LayerLayout::Range> to = lay.slot_ranges(kv, slot, run);
        for (size_t r = 0; r < to.size(); ++r)
          blit.copy(staging.buffer, staging.offset + from[r].offset, region(layer).buffer, to[r].offset, to[r].bytes);
      }
      t += run;
    }
  }
  if (ring_.has(layer)) store_window(enc, layer, n, n_new);
  eviction_.stored(enc, layer, k_new, n, n_new);
  lengths_[layer] = n + n_new;
}

void KvCache::write_rows(uint32_t layer, uint32_t kv, uint32_t first, uint32_t n, const uint8_t* data,
                         const uint8_t* params) {
  copy_rows(layer, kv, first, n, const_cast<uint8_t*>(data), const_cast<uint8_t*>(params), true);
  ring_.pool_written(layer, first + n);  // the queries read those rows from the pool
}

void KvCache::read_rows(uint32_t layer, uint32_t kv, uint32_t first, uint32_t n, uint8_t* data, uint8_t* params,
                        bool by_index) const {
  copy_rows(layer, kv, first, n, data, params, false, by_index);
}

void KvCache::copy_rows(uint32_t layer, uint32_t kv, uint32_t first, uint32_t n, uint8_t* data, uint8_t* params,
                        bool write, bool by_index) const {
  Lock lock(pool_->mutex());
  check_layer(layer);
  if (kv > 1) fail("section " + str(kv) + " is neither K (0) nor V (1)");
  const LayerLayout lay = layout(layer);
  const BlockTable& t = *group_of(layer).table;
  if (!by_index && uint64_t(first) + n > lengths_[layer])
    fail("layer " + str(layer) + " holds " + str(lengths_[layer]) + " positions; cannot " +
         (write ? "write" : "read") + " rows " + str(first) + ".." + str(uint64_t(first) + n - 1));
  const size_t drow = lay.data_row_bytes(kv), prow = lay.param_row_bytes(kv);
  const BufferView reg = region(layer);
  if (by_index && uint64_t(first) + n > eviction_.count(layer))
    fail("layer " + str(layer) + " holds " + str(eviction_.count(layer)) + " indices; cannot read rows " + str(first) + ".." +
         str(uint64_t(first) + n - 1));
  if (!by_index && eviction_.count(layer) != lengths_[layer])
    fail("layer " + str(layer) + " has evicted tokens (kv_policy '" + std::string(policy_name(spec_.policy.kind)) +
         "'): its rows are no longer addressed by position");
  const uint32_t sealed = lengths_[layer] / kBlockTokens * kBlockTokens;  // q2 K: full blocks only
  if (!write && lay.format(kv) == mkv_params::kKvQ2K && uint64_t(first) + n > sealed)
    fail("layer " + str(layer) + "'s q2 K rows of positions " + str(sealed) + ".." + str(lengths_[layer] - 1) +
         " are in the residual window's ring only (a q2 K block is quantized when it is full); reading them "
         "from the pool is not supported");
  for (uint32_t i = 0; i < n; ++i) {
    if (!t.holds(first + i)) fail("layer " + str(layer) + " does not hold position " + str(first + i));
    const std::vector<LayerLayout::Range> r = lay.slot_ranges(kv, t.slot(first + i), 1);
    uint8_t* rows[2] = {data + i * drow, params + i * prow};
    for (size_t p = 0; p < r.size(); ++p) {
      if (write) reg.buffer->write(reg.offset + r[p].offset, rows[p], r[p].bytes);
      else reg.buffer->read(reg.offset + r[p].offset, rows[p], r[p].bytes);
    }
  }
}

void KvCache::truncate(uint32_t n) {
  Lock lock(pool_->mutex());
  auto evicted = [&](uint32_t l) { return eviction_.count(l) != lengths_[l]; };
  for (uint32_t l = 0; l < spec_.n_layers; ++l) {
    if (n > lengths_[l])
      fail("cannot truncate layer " + str(l) + " to " + str(n) + " tokens: it holds only " + str(lengths_[l]));
    if (evicted(l) && lengths_[l] - n > eviction_.since_eviction(l))
      fail("cannot truncate layer " + str(l) + " to " + str(n) + " tokens: it has evicted " +
           str(lengths_[l] - eviction_.count(l)) + " of its " + str(lengths_[l]) + " (kv_policy '" +
           policy_name(spec_.policy.kind) + "'), last " + str(eviction_.since_eviction(l)) +
           " tokens ago, so what it held at " + str(n) + " is gone; reset() it instead");
  }
  // (a layer that has evicted holds its count in its table: it goes back as
  // many indices as positions; the others' index is their position)
  auto table_length = [&](const Group& g) { return eviction_.count(g.layers[0]) - (lengths_[g.layers[0]] - n); };
  for (const Group& g : groups_) {
    try {
      g.table->check_truncate(table_length(g));
    } catch (const gpu::GpuError& e) {
      fail("cannot truncate layer " + str(g.layers[0]) + " (window " + str(g.window) + ") to " + str(n) +
           " tokens: " + e.what());
    }
  }
  for (Group& g : groups_) g.table->truncate(table_length(g));  // entries past it are never read: no sync
  eviction_.truncated(n, lengths_);
  std::fill(lengths_.begin(), lengths_.end(), n);
  ring_.truncated(n);
  record_.truncate(n);
}

void KvCache::reset() {
  Lock lock(pool_->mutex());
  for (uint32_t g = 0; g < groups_.size(); ++g) {
    groups_[g].table.reset();  // its blocks go back first
    groups_[g].table = std::make_unique<BlockTable>(pool_->blocks(g), groups_[g].window, spec_.max_chunk);
  }
  std::fill(lengths_.begin(), lengths_.end(), 0u);
  eviction_.reset();
  ring_.start_all_at(0);
  if (!owns_pool_) {  // over a shared pool an empty cache holds no buffer of its own but its policy's scores
    ring_.release();
    staging_.reset();
    staging_rows_ = 0;
    for (Group& g : groups_) g.mirror.reset(), g.moves.reset(), g.move_table.reset();
  }
  record_.reset();
}

void KvCache::begin_at(const std::vector<uint32_t>& first) {
  Lock lock(pool_->mutex());
  if (first.size() != spec_.n_layers)
    fail("begin_at has " + str(first.size()) + " positions; expected one per layer (" + str(spec_.n_layers) + ")");
  for (uint32_t l = 0; l < spec_.n_layers; ++l)
    if (lengths_[l] != 0) fail("begin_at needs an empty cache; layer " + str(l) + " holds " + str(lengths_[l]));
  for (const Group& g : groups_)
    for (uint32_t l : g.layers) {
      if (first[l] != first[g.layers[0]])
        fail("layers " + str(g.layers[0]) + " and " + str(l) + " share a window (" + str(g.window) +
             ") and must start together, not at " + str(first[g.layers[0]]) + " and " + str(first[l]));
      if (g.window == 0 && first[l] != 0)
        fail("layer " + str(l) + " is a full layer; it starts at 0, not " + str(first[l]));
    }
  for (Group& g : groups_) {
    g.table->skip_to(first[g.layers[0]]);
    sync_table(g, 0);
  }
  lengths_ = first;
  eviction_.start_at(first);
  ring_.start_at(first);
}

void KvCache::write_ring(uint32_t layer, uint32_t first, uint32_t n, const uint8_t* k, const uint8_t* v) {
  check_layer(layer);
  ring_.write(layer, first, n, lengths_[layer], k, v);
}

void KvCache::commit(const int32_t* ids, uint32_t n, bool publish, bool decode_rows) {
  record_.record(ids, n);
  if (!decode_rows) record_.stored(lengths_[0] - n, n);
  if (publish && !owns_pool_) prefix::publish(*this);
}

void KvCache::adopt_prefix(const std::vector<std::vector<int64_t>>& blocks, const int32_t* ids, uint32_t n,
                           const std::vector<uint64_t>& hashes, const std::vector<PrefixRows::Rows>& rows) {
  Lock lock(pool_->mutex());
  for (uint32_t l = 0; l < spec_.n_layers; ++l)
    if (lengths_[l] != 0) fail("adopting a prefix needs an empty cache; layer " + str(l) + " holds " + str(lengths_[l]));
  if (blocks.size() != groups_.size()) fail("adopt_prefix: one block list per window group is needed");
  for (size_t g = 0; g < groups_.size(); ++g) {
    groups_[g].table->adopt(blocks[g], n);
    sync_table(groups_[g], 0);
  }
  std::fill(lengths_.begin(), lengths_.end(), n);
  eviction_.start_at(lengths_);
  ring_.start_all_at(n);  // the prefix's rows are the pool's only, but for its window's:
  if (!rows.empty()) {
    const size_t per = size_t(kBlockTokens) * spec_.n_kv_heads * spec_.head_dim * 2;  // one block's f16 rows
    const uint32_t first = n - uint32_t(rows.size()) * kBlockTokens;
    std::vector<uint8_t> k(rows.size() * per), v(rows.size() * per);
    size_t at = 0;  // the layer's place in each block's rows (PrefixRows' layout)
    for (uint32_t l = 0; l < spec_.n_layers; ++l) {
      if (!ring_.has(l)) continue;
      for (size_t b = 0; b < rows.size(); ++b) {
        std::copy_n(rows[b]->data() + at, per, k.data() + b * per);
        std::copy_n(rows[b]->data() + at + per, per, v.data() + b * per);
      }
      ring_.write(l, first, uint32_t(rows.size()) * kBlockTokens, n, k.data(), v.data());
      at += 2 * per;
    }
  }
  record_.adopt(ids, n, hashes);
}

}  // namespace mkv::kv
