// KvCache: one sequence's K/V on the device — a block table per window group
// over a KvPool (kv/kv_pool.h: per-layer pools cut into blocks, a BlockPool of
// ids per group), per-layer lengths, and the two store paths.
//
// Layers of one window (0 = full) form a group: the sequence's BlockTable
// there, mirrored in a device buffer of uint32 block ids that the store and
// attention kernels read. The pool is either the cache's own, sized at
// construction for one sequence (kv_layout.h, group_blocks), or shared by
// every cache of an engine (sized by a memory budget): then the cache holds
// only the blocks its tables name. Full layers hold capacity tokens and raise
// on overflow (or, with an eviction policy, evict: kv_evict.cpp); a sliding layer's table lets blocks go
// as its window moves, so it needs about W + 2 * max_chunk slots. Only the
// blit path's staging buffer and a sliding group's table mirror may grow.
//
// store() encodes one layer's new K/V rows through an EncoderSession:
//   StorePath::compute  kv_store kernel into the open compute encoder; adds no encoder.
//   StorePath::blit     the same kernel into a staging buffer, then one blit encoder
//                       copies the rows (2 copies, K and V, per block the chunk touches);
//                       the session's next compute() opens a new compute encoder.
// Both paths produce bit-identical caches.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <memory>

#include "gpu/device.h"
#include "kv/block_pool.h"
#include "kv/encoder_session.h"
#include "kv/eviction_state.h"
#include "kv/kv_pool.h"
#include "kv/kv_layout.h"
#include "kv/kv_policy.h"
#include "kv/residual_ring.h"
#include "kv/sequence_record.h"
#include "ops/attention.h"
#include "ops/ops.h"
#include "ops/kv_store.h"
#include "ops/rope.h"

namespace mkv::kv {

using ops::BufferView;
using ops::RopeSpec;

enum class StorePath { compute, blit };
StorePath parse_store_path(const std::string& name);  // "compute" | "blit"
const char* store_path_name(StorePath path);

struct KvCacheSpec {
  uint32_t n_layers = 0;
  uint32_t n_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t capacity = 0;          // tokens a full layer holds
  std::vector<uint32_t> windows;  // per layer: 0 = full, W = sliding window; empty = all full
  uint32_t max_chunk = 1;         // most tokens one store() may put in a sliding layer, and
                                  // how far before its last store a sliding layer can truncate()
  StorePath store = StorePath::compute;
  std::vector<uint32_t> k_formats;  // per layer: mkv_params::kKvF16, kKvQ8, kKvQ4, kKvQ2K (V: kKvQ2V); empty = all f16
  std::vector<uint32_t> v_formats;
  bool rotate = false;              // Hadamard-rotate the quantized layers (LayerLayout::rotate)
  // The residual window (kv_residual; 0: none), a multiple of kBlockTokens.
  // A layer with a quantized K or V then also keeps its recent rows as f16 in
  // a ring (ring(), kv/residual_ring.h), and the query at position p reads
  // the keys from S(p) = floor((p + 1 - residual) / B) * B on from it (its
  // last `residual` positions and the block they start in), the rest from the
  // pool. A q2 layer needs one: its K is quantized per channel when a block
  // is full (ops::kv_seal_q2k). Stores into such a layer take at most
  // max_chunk tokens.
  uint32_t residual = 0;
  // An eviction policy (kv_policy.h; kind none: off). The full layers then
  // hold at most `capacity` tokens (the budget) at any position: a store that
  // would pass it first evicts, in every full layer and head, the tokens the
  // policy drops (at least enough for the store, and down to a whole block),
  // and moves kept rows from past the new count into the evicted ones (kept
  // tokens keep their RoPE: it was applied at store). A token's index in the
  // layer (its slot through the block table) is then no longer its position:
  // count() is how many the layer holds, length() the next position, and
  // kept_positions() the position of each index per KV head. Attention reads
  // indices 0 .. count - 1 (all before the new tokens: the causal mask holds).
  // Not with a residual window, nor a q2 K (its rows share a block's
  // parameters), nor the prefix cache.
  KvPolicySpec policy;
};

class KvCache {
 public:
  KvCache(gpu::DevicePtr device, KvCacheSpec spec);  // its own pool; raises GpuError "[kv_cache] ..."
  // A sequence over a shared pool (same windows, heads and head_dim).
  KvCache(gpu::DevicePtr device, std::shared_ptr<KvPool> pool, KvCacheSpec spec);
  ~KvCache();  // its blocks go back to the pool (under the pool's mutex)
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvCacheSpec& spec() const { return spec_; }
  uint32_t n_layers() const { return spec_.n_layers; }

  // Layer l's pool: its K section, then its V section, each in the layer's
  // format (kv_layout.h; f16: (slots, n_kv_heads, head_dim) half).
  BufferView region(uint32_t layer) const;
  LayerLayout layout(uint32_t layer) const;
  uint32_t slots(uint32_t layer) const;   // R = blocks of its pool * kBlockTokens
  uint32_t length(uint32_t layer) const;  // n: tokens ever stored = position of the next token
  // Tokens the layer holds (the attention's n_tokens): its length, less what
  // an eviction policy has dropped.
  uint32_t count(uint32_t layer) const;
  uint32_t window(uint32_t layer) const;  // 0 = full
  bool wraps(uint32_t layer) const;       // sliding with a pool smaller than capacity: no overflow
  // Position held by each of the layer's slots; -1 where none.
  std::vector<int64_t> positions(uint32_t layer) const;
  // The layer's group's block table, and its device mirror: uint32 per logical
  // block (entries the table let go hold 0 and are never read).
  const BlockTable& block_table(uint32_t layer) const;
  BufferView table(uint32_t layer) const;

  // Appends n_new tokens to `layer` at positions n .. n+n_new-1 and advances n
  // (at encode time: the rows are there once the command buffer completes).
  // k_new, v_new: (n_new, n_kv_heads, head_dim) float. rope_k: rotate K at
  // those positions (nullptr: store K as is); queries (with rope_k): the
  // step's Q rows, rotated in place by the same dispatch. Raises GpuError before encoding
  // anything when the layer is out of range, a full layer would overflow, or a
  // sliding layer gets more than max_chunk tokens. Checked::yes: the caller
  // ran check_store(layer, n_new, rope_k) for every layer it stores before
  // encoding any (a model step does), so store() does not run it again.
  enum class Checked { no, yes };
  void store(EncoderSession& enc, uint32_t layer, const BufferView& k_new, const BufferView& v_new,
             uint32_t n_new, const RopeSpec* rope_k = nullptr, const ops::QueryRope& queries = {},
             Checked checked = Checked::no);
  // Writes the stored bytes of positions first .. first + n - 1 of section kv
  // (0 = K, 1 = V) of `layer`, which must hold them: n rows of
  // layout(layer).data_row_bytes(kv) at data, and of param_row_bytes(kv) at
  // params (none for f16). A saved cache read back as its formats' bytes
  // (nothing requantized). Raises GpuError for a position the layer does not hold.
  void write_rows(uint32_t layer, uint32_t kv, uint32_t first, uint32_t n, const uint8_t* data, const uint8_t* params);
  // The same rows read back (what a saved cache stores). by_index: rows of
  // indices first.. (an evicting layer's, whose index is not its position).
  void read_rows(uint32_t layer, uint32_t kv, uint32_t first, uint32_t n, uint8_t* data, uint8_t* params,
                 bool by_index = false) const;

  // The residual window (KvCacheSpec::residual): its ring, lo and view per
  // layer (kv/residual_ring.h; attention reads them through ring().describe).
  // write_ring puts back the rows a saved cache kept of a layer's window
  // (ring().read's) as the rows of its last positions.
  const ResidualRing& ring() const { return ring_; }
  void write_ring(uint32_t layer, uint32_t first, uint32_t n, const uint8_t* k, const uint8_t* v);

  // The eviction policy (KvCacheSpec::policy; its part, eviction(), is
  // kv/eviction_state.h; these check the layer). evicts: the layer is a full
  // layer of a cache with a policy. kept_positions: the position of each of
  // its count() indices for one KV head. scores: (n_kv_heads, capacity) float,
  // the policy's score per index (keynorm: written by the store; h2o, snapkv:
  // added by the attention), a null view for a policy without. evicted: tokens
  // dropped so far, per layer.
  bool evicts(uint32_t layer) const;
  std::vector<uint32_t> kept_positions(uint32_t layer, uint32_t head) const;
  // A saved evicting layer put back: the layer holds count() rows stored (and
  // written) at indices 0.. as positions 0..; they become the rows of these
  // positions ((n_kv_heads, count) uint32, each below length and distinct per
  // head) with these scores ((n_kv_heads, count) float; null: zero), and its
  // length becomes `length`. Raises GpuError before changing anything.
  void set_kept(uint32_t layer, uint32_t length, const std::vector<uint32_t>& positions, const float* scores);
  BufferView scores(uint32_t layer) const;
  uint64_t evicted() const { return eviction_.evicted(); }
  // Whether the attention over the layer adds to its scores (h2o, snapkv),
  // and the first of a step's n_queries query rows (the last stored) that do:
  // h2o every row; snapkv the rows at the last `window` indices before the
  // budget (its observation window; an eviction starts it over).
  bool scores_attention(uint32_t layer) const { return evicts(layer) && eviction_.scores_attention(layer); }
  uint32_t score_rows_from(uint32_t layer, uint32_t n_queries) const;
  // Tokens a full layer keeps after an eviction (kv_budget; the capacity
  // without a policy or when none was given).
  uint32_t budget() const { return eviction_.budget(); }
  // A full layer's own (pyramidkv: kv_policy.h layer_budgets; the others: budget()).
  uint32_t budget(uint32_t layer) const;
  // The next n tokens stored are one prompt (the engine says so for each
  // call's prompt). With a policy that holds prompts (KvPolicySpec::
  // holds_prompts) the full layers then hold it whole, up to capacity, and the
  // first store after it (or a prompt opened while they hold more than the
  // budget) compresses them to the budget, chosen by scores that saw the
  // whole prompt (snapkv: by its last `window` queries). Otherwise a no-op.
  void open_prompt(uint32_t n);
  // Tokens every layer takes before a store evicts (0: the next store does;
  // the most a uint32 holds without a policy): what a verified segment may
  // store (speculative decoding stores none where an eviction is due).
  uint32_t room_before_eviction() const;
  // Speculative verification over a layer that scores by attention: row
  // `row` of a verified segment of n_rows (stored) writes its share of the
  // scores here (attention_scores, accumulate false; share_stride() floats a
  // KV head), or nowhere (a null view: decoding it alone adds none). After
  // the step, truncate() to the kept rows, then apply_verified_shares(rows):
  // the kept rows' shares are added in row order, the bits decoding them one
  // step at a time gives.
  BufferView verify_share(uint32_t layer, uint32_t row, uint32_t n_rows);
  uint32_t share_stride() const { return eviction_.share_stride(); }
  void apply_verified_shares(EncoderSession& enc, uint32_t rows) { eviction_.apply_shares(enc, rows); }

  // The checks store() makes, without encoding: call it for every layer before
  // a multi-layer step to fail before any layer's n has moved.
  void check_store(uint32_t layer, uint32_t n_new, const RopeSpec* rope_k = nullptr) const;

  // Forgets every token from position n on, in every layer, so the next
  // store continues at n (a conversation rolled back to a common prefix). A
  // sliding layer keeps max_chunk positions of history beyond its window, so
  // it can always go back to max_chunk positions before the start of its last
  // store (after one-token steps: its last max_chunk + 1 tokens; more while
  // its oldest block is not yet let go) and still hold the window n needs.
  // A layer that has evicted (kv_policy) goes back over the tokens stored
  // since its last eviction, no further. Raises GpuError before changing
  // anything when a layer cannot.
  void truncate(uint32_t n);

  void reset();  // every layer back to n = 0, no tokens, no messages

  // An empty cache whose layer l starts at position first[l] (a saved cache
  // read back: its sliding layers held only their last positions). Layers of
  // one window group start together; full layers start at 0.
  void begin_at(const std::vector<uint32_t>& first);

  // The sequence's record (kv/sequence_record.h): its token ids, chat, model
  // fingerprint and prefix-cache state; truncate() and reset() keep it in step
  // with the layers.
  const SequenceRecord& record() const { return record_; }
  const EvictionState& eviction() const { return eviction_; }
  SequenceRecord& record() { return record_; }

  // Everything a call may change, so that a call that fails part-way can put
  // the cache back exactly (kv_checkpoint.cpp): host state and each table as
  // data, and the blocks the call may overwrite or free. A pool of the cache's
  // own has no other user: those blocks are copied aside (full group: its
  // truncated positions it stores again; sliding group: every held block) and
  // come back under the same ids. A shared pool's other sequences may take
  // any id set free, so there the checkpoint keeps an owner on every held
  // block instead (no copies; a write into a block it holds copies it first,
  // as for any shared block), given back when the checkpoint goes away.
  struct SavedBlocks {
    std::vector<uint32_t> ids;  // block ids of the group, saved in every layer of it
    std::vector<gpu::BufferPtr> copies;  // per layer of the group: its K blocks, then its V blocks
  };
  // Owners held on blocks of a shared pool, released on destruction.
  struct RetainedBlocks {
    RetainedBlocks() = default;
    RetainedBlocks(RetainedBlocks&& o) noexcept : pool(std::move(o.pool)), ids(std::move(o.ids)) { o.ids.clear(); }
    RetainedBlocks& operator=(RetainedBlocks&& o) noexcept;
    RetainedBlocks(const RetainedBlocks&) = delete;
    RetainedBlocks& operator=(const RetainedBlocks&) = delete;
    ~RetainedBlocks() { release(); }
    void release();
    std::shared_ptr<KvPool> pool;
    std::vector<std::vector<uint32_t>> ids;  // per group
  };
  struct Checkpoint {
    std::vector<uint32_t> lengths;
    SequenceRecord::Saved record;
    std::vector<BlockTable::State> tables;  // per group
    std::vector<SavedBlocks> blocks;        // per group (own pool)
    RetainedBlocks retained;                // shared pool
    ResidualRing::Saved ring;               // the residual window's share
    EvictionState::Saved eviction;          // the eviction policy's (and every layer's count)
  };
  // keep: tokens the call keeps (truncates to) before it stores n_store more.
  Checkpoint checkpoint(gpu::CommandQueue& queue, uint32_t keep, uint64_t n_store) const;
  // Puts the cache back; a shared pool's retained blocks go to the tables.
  void restore(gpu::CommandQueue& queue, Checkpoint& cp);

  // Blocks a call that keeps `keep` tokens and stores n_store more may take
  // from the pool, per group (what a shared pool's scheduler reserves first):
  // a full group's blocks from keep's block on (its tail is copied first when
  // a checkpoint holds it), a sliding group's window (as much of it as n_store
  // fills) and one more for its tail.
  std::vector<uint32_t> blocks_to_store(uint32_t keep, uint64_t n_store) const;
  // Reserves them in the pool (all groups or none); false when the pool cannot.
  bool reserve(const std::vector<uint32_t>& per_group);
  void unreserve();  // gives back what the tables did not use
  // Tops the reservation up to what storing n more tokens takes from the pool
  // now (BlockTable::blocks_needed, per group), all groups or none; false when
  // the pool cannot (optimistic admission: the scheduler then preempts).
  bool top_up(uint32_t n);

  // Whether the cache takes part in the prefix cache: not with an eviction
  // policy (its blocks are rewritten as it compacts). A residual window's f16
  // rows go beside the blocks (prefix_cache.h).
  bool shares_prefixes() const { return spec_.policy.kind == PolicyKind::none; }
  // The one call a step makes into the cache after its stores, for the n
  // tokens `ids` it stored in every layer (positions length(0) - n ..): records
  // them, notes them stored (SequenceRecord::stored), and with `publish` (the
  // call uses the prefix cache) publishes the full canonical blocks over a shared pool.
  // decode_rows: the rows were computed as decode rows (a speculative step's
  // verification), whatever n: they never extend the canonical prefix.
  void commit(const int32_t* ids, uint32_t n, bool publish, bool decode_rows = false);
  // Becomes a cache of n tokens (`ids`) whose rows are the pool's blocks
  // `blocks` (per group, per logical block; -1 where a sliding group needs
  // none). Needs an empty cache; the blocks stay cached for others. rows: with
  // a residual window, the f16 rows of the prefix's last blocks (prefix::Match),
  // which go into its ring.
  void adopt_prefix(const std::vector<std::vector<int64_t>>& blocks, const int32_t* ids, uint32_t n,
                    const std::vector<uint64_t>& hashes, const std::vector<PrefixRows::Rows>& rows = {});

  const KvPool& pool() const { return *pool_; }
  KvPool& pool() { return *pool_; }
  bool owns_pool() const { return owns_pool_; }

  // Byte accounting, exact.
  size_t layer_nbytes(uint32_t layer) const;  // the layer's pool: R slots of its K and V formats
  size_t staging_nbytes() const;              // blit path staging (0 for compute)
  size_t table_nbytes() const;                // the tables' device mirrors
  size_t ring_nbytes() const { return ring_.nbytes(); }  // the residual window's ring (0 without one)
  size_t held_nbytes() const;                 // the blocks its tables hold, in every layer
  // What the cache holds on the device: its own pool whole, or over a shared pool
  // the blocks its tables hold; its staging, table mirrors, ring and policy scores.
  size_t nbytes() const;
  size_t bytes_per_token() const;             // one more context token: K+V row (its formats) in each non-wrapping layer
  // Bytes of its own buffers a call keeping `keep` tokens and storing n_store
  // more makes before its first step (the ring, table mirrors, blit staging, an
  // evicting group's move lists, the checkpoint's ring copy): what admission asks
  // the budget for.
  size_t own_bytes_to_run(uint32_t keep, uint64_t n_store) const;
  // The same for an empty cache of `spec` over a pool of `shape` (with its
  // policy's scores, made with the cache): the most a sequence of it takes beside
  // its blocks (the engine leaves room for max_seqs).
  static size_t own_bytes_to_run(const KvCacheSpec& spec, const KvPoolSpec& shape);
  // One blit-path staging of max_chunk rows (StorePath::blit) for such a cache.
  static size_t staging_bytes(const KvCacheSpec& spec, const KvPoolSpec& shape);
  // Makes those buffers now (admission: charged before the next call is admitted;
  // KvMemoryError when kv_memory has no room).
  void make_own_buffers();

 private:
  // The sequence in one window group of the pool: its table and the mirror.
  struct Group {
    uint32_t window = 0;
    bool wraps = false;
    bool evicts = false;  // a full group of a cache with a policy
    std::vector<uint32_t> layers;
    std::unique_ptr<BlockTable> table;
    gpu::BufferPtr mirror;  // uint32 per logical block
    // An eviction's kv_move_rows lists, every layer's: the group's own (the
    // groups of a pyramidkv cache evict in one step, one command buffer).
    gpu::BufferPtr moves;
    gpu::BufferPtr move_table;  // the table as the moves read it (kv_evict.cpp)
  };
  void init_groups();
  void check_layer(uint32_t layer) const;
  BufferView staging_for(uint32_t n_new);
  // Writes table entries [from_block, end) to the mirror, growing it if needed.
  void sync_table(Group& g, size_t from_block);
  // read_rows / write_rows: the checks, then one copy per slot and plane.
  void copy_rows(uint32_t layer, uint32_t kv, uint32_t first, uint32_t n, uint8_t* data, uint8_t* params,
                 bool write, bool by_index = false) const;
  void encode_copies(EncoderSession& enc, const Group& g, const std::vector<BlockCopy>& copies);
  // kv_residual.cpp: a store's ring upkeep, and the seal of the q2 K blocks it fills.
  void store_window(EncoderSession& enc, uint32_t layer, uint32_t n, uint32_t n_new);
  // kv_evict.cpp: the eviction before a store (the rows move, the blocks go).
  void evict(EncoderSession& enc, Group& g, uint32_t n_new);
  Group& group_of(uint32_t layer) { return groups_[pool_->group_of(layer)]; }
  const Group& group_of(uint32_t layer) const { return groups_[pool_->group_of(layer)]; }

  gpu::DevicePtr device_;
  KvCacheSpec spec_;
  std::shared_ptr<KvPool> pool_;
  bool owns_pool_ = true;
  std::vector<Group> groups_;  // per group of the pool
  std::vector<uint32_t> lengths_;
  EvictionState eviction_;  // every layer's count, and the eviction policy's state
  gpu::BufferPtr staging_;  // K and V sections of staging_rows_ slots, one unit each (kv_format.h); blit path only
  uint32_t staging_rows_ = 0;
  SequenceRecord record_;
  ResidualRing ring_;                   // the residual window
  Allocator alloc_;                     // its own buffers: through the shared pool's budget (kv_budget.h)
};

}  // namespace mkv::kv
