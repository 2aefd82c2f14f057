// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// hybrid_kv_cache: block tables per sequence and KV cache group over one shared block pool, for models whose
/// layers mix attention kinds (full attention, sliding windows, chunked local attention: concepts/group_kind.hpp).
/// Every group of a sequence has its own table; all groups draw from the one pool with no per-group quota. A group
/// whose kind skips leading tokens gives back the blocks wholly before its window as soon as no later token can read
/// them (they keep their hashes and stay hit-able); their table entries become the null block (block 0, reserved,
/// never read by the kernels). A prefix-cache hit is agreed across groups: the longest prefix every group can
/// resume from (full attention needs every block, a window only its last ones), and blocks are cached per group
/// (the same tokens cached in group 0 do not hit group 1).
///
/// Conventions (hybrid_options::conventions):
///   - hybrid_conventions::vllm: every decision equals vLLM v1's HybridKVCacheCoordinator (KVTRACE.md, "Hybrid KV
///     cache groups"): its group order for allocation and free, its lookups and hit agreement
///     (groups/vllm_hit.hpp), its layouts only (check_vllm_layout), and its window release inside allocate_slots,
///     which is kept even when the allocation then fails (the one documented exception to "a failed call changes
///     nothing").
///   - hybrid_conventions::native: any group kinds and layout, the native agreed hit (groups/agreed_hit.hpp), and
///     the strong guarantee everywhere: the window release counts toward the capacity check but happens only when
///     the call succeeds.
/// A cache of one full-attention group decides exactly as paged_kv_cache over the same policies; use
/// paged_kv_cache then (it is the faster for it).
///
/// The operations are paged_kv_cache's (the same errors; kvpager::scheduler drives either), with group-indexed
/// exports: export_block_table(g, ...), export_csr(g, ...), export_slot_mapping(g, ...), block_table(g, id). Swap
/// moves every group's table of a sequence to the host pool (num_host_blocks > 0) together: each non-null block
/// gets one host block and the plan's swaps name the group whose layers move (block_swap::group); null entries
/// stay null on both sides (host block 0 is reserved as device block 0 is: num_host_blocks - 1 are usable);
/// preempt asks the swap policy W as paged_kv_cache does (with no_swap it answers errc::unsupported, so the
/// scheduler preempts by recompute). Prefix caching needs a prehashed_content_cache sharing policy
/// (prefix_caching): the cache chains the block hashes itself (xxh3 over each block's tokens, seeded by the
/// previous block's hash and, at the root, the sequence's extra key) and indexes each group's blocks under the
/// hash mixed with the group. Lookups verify the block's own token ids when the policy verifies.
///
/// Groups of different sizes (hybrid_options::units, native conventions): group g may hold units(g) pool blocks per
/// table entry, so that groups of different layer counts share the one pool without padding (every pool block is
/// a page of the same unit of layers; groups/layer_grouping.hpp's plan_unit_groups gives the units of a model). An
/// entry's first block (its lead) is the one the tables, the prefix cache and the eviction policy know; its
/// companions follow it: taken with it, freed when the lead is handed out again (a cached lead keeps them, so a
/// hit brings back every page), copied, swapped and counted with it. A sequence then has num_tables() tables:
/// table g holds group g's leads, unit_table(g, u) its u-th companions (kept in step). Everything that names bytes
/// names a table: block_table, host_block_table, the exports, the slot mapping, and the plan's block_copy::group
/// and block_swap::group (an executor's layer_groups map each layer to its table). Capacity (available_blocks,
/// blocks_needed, the errors' details, group_stats::blocks) counts pool blocks. With one unit per group, tables
/// and groups coincide.

#include <algorithm>
#include <array>
#include <cstdint>
#include <new>
#include <span>
#include <utility>
#include <vector>

#include "kvpager/allocator/free_list_allocator.hpp"
#include "kvpager/cache/cache_types.hpp"
#include "kvpager/cache/detail/block_store.hpp"
#include "kvpager/cache/detail/copy_on_write.hpp"
#include "kvpager/cache/detail/exports.hpp"
#include "kvpager/cache/detail/external_book.hpp"
#include "kvpager/cache/detail/sequence_table.hpp"
#include "kvpager/cache/detail/step_ledger.hpp"
#include "kvpager/cache/detail/swap_book.hpp"
#include "kvpager/cache/detail/tier_link.hpp"
#include "kvpager/concepts/block_allocator.hpp"
#include "kvpager/concepts/eviction_policy.hpp"
#include "kvpager/concepts/group_kind.hpp"
#include "kvpager/concepts/sharing_policy.hpp"
#include "kvpager/concepts/swap_policy.hpp"
#include "kvpager/concepts/tier_policy.hpp"
#include "kvpager/core/block_pool.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/kv_events.hpp"
#include "kvpager/core/span_of.hpp"
#include "kvpager/core/splitmix.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/core/types.hpp"
#include "kvpager/eviction/lru_eviction.hpp"
#include "kvpager/groups/agreed_hit.hpp"
#include "kvpager/groups/group_kind_variant.hpp"
#include "kvpager/groups/group_kinds.hpp"
#include "kvpager/groups/vllm_hit.hpp"
#include "kvpager/sharing/prefix_caching.hpp"
#include "kvpager/sharing/xxh3_hasher.hpp"
#include "kvpager/swap/no_swap.hpp"

KVPAGER_NAMESPACE_BEGIN

/// Whose rules a hybrid_kv_cache follows (see the file comment).
enum class hybrid_conventions : std::uint8_t {
  vllm,    ///< vLLM v1's decisions exactly, its window-release timing included
  native,  ///< any kinds and layouts, the native agreed hit, the strong guarantee on every call
};

/// Options of hybrid_kv_cache::create beyond the cache_config.
struct hybrid_options {
  hybrid_conventions conventions = hybrid_conventions::vllm;
  /// Pages per block of each group (empty: 1 each): groups of different sizes from the one pool, with no padding.
  /// A group of u units holds u pool blocks per table entry (a lead and u - 1 companions, each a page of the same
  /// layers count: plan_unit_groups' unit). Decisions (hits, window release, eviction, copy-on-write) are made
  /// once per entry; the u pages always move together. Native conventions only; at most max_groups units in all.
  /// Read by create only (the cache keeps its own copy).
  std::span<const std::int32_t> units{};
};

/// The counts of one KV cache group (`blocks` and `peak_blocks` in pool blocks: a group of u units holds u per
/// entry; the other counts in table entries).
struct group_stats {
  std::int32_t blocks = 0;           ///< pool blocks with reference count > 0 that belong to the group now
  std::int32_t peak_blocks = 0;      ///< the most `blocks` after any successful allocating call
  std::int64_t hit_blocks = 0;       ///< cached blocks admissions took into the group's tables (prefix hits)
  std::int64_t skipped_blocks = 0;   ///< table entries the window release replaced by the null block
  std::int64_t table_entries = 0;    ///< entries of the group's live tables, null ones included
  friend bool operator==(const group_stats&, const group_stats&) = default;
};

namespace detail {
/// The (empty) hash-chain position of a hybrid cache's per-group tables: the cache keeps the chain itself.
struct no_group_cursor {
  friend bool operator==(const no_group_cursor&, const no_group_cursor&) = default;
};
}  // namespace detail

template <group_kind K = any_group_kind, block_allocator A = free_list_allocator, eviction_policy E = lru_eviction,
          sharing_policy S = prefix_caching, swap_policy W = no_swap, cache_tier T = no_tier>
class hybrid_kv_cache {
  static_assert(detail::free_order_fits<A, E>,
                "this eviction policy evicts in the allocator's free order: pair it with the allocator it names "
                "(lru_eviction needs free_list_allocator)");
  static constexpr bool caching = prehashed_content_cache<S>;
  static_assert(std::same_as<T, no_tier> || caching,
                "a host tier keeps prefix-cache blocks by their hashes: pair it with prefix_caching (a "
                "prehashed_content_cache)");
  using table_type = detail::sequence_table<detail::no_group_cursor>;
  using tier_type = detail::tier_link<T>;

 public:
  using kind_type = K;
  using allocator_policy = A;
  using eviction_policy_type = E;
  using sharing_policy_type = S;
  using swap_policy_type = W;
  using tier_policy_type = T;
  using policies = cache_policies<A, E, S, W, T>;

  /// The null block: the entry of a table position a group no longer reads (block 0, reserved).
  static constexpr block_id null_block = 0;
  /// The most groups a cache can have.
  static constexpr std::int32_t max_groups = 64;
  /// Whether the cache keeps its last prefix lookup and, at the next lookup of the same prompt (the waiting request
  /// at the head, looked up again every step while the pool is full), re-checks each block it found by the sharing
  /// policy's stamp instead of looking it up again: a stamped_content_cache (prefix_caching is one).
  static constexpr bool keeps_lookups = stamped_content_cache<S>;

  // Copyable and movable (nothrow) as its members are; declared here so that they too are compiled once with the
  // named compositions (KVPAGER_EXTERN_COMPOSITIONS, core/config.hpp).
  hybrid_kv_cache(const hybrid_kv_cache&);
  hybrid_kv_cache(hybrid_kv_cache&&) noexcept;
  hybrid_kv_cache& operator=(const hybrid_kv_cache&);
  hybrid_kv_cache& operator=(hybrid_kv_cache&&) noexcept;
  ~hybrid_kv_cache();

  /// Validates and builds an empty cache with one group per entry of `groups` (in group order: the order in which
  /// groups allocate and free). Errors: those of paged_kv_cache::create; errc::invalid_argument for no group, more
  /// than max_groups, a kind whose validate() fails (W or C below 1), reserved_blocks 0 (block 0 is the null
  /// block), and, with hybrid_conventions::vllm, a kind vLLM does not have or a layout its grouping cannot produce
  /// (check_vllm_layout); errc::out_of_memory (std::bad_alloc).
  [[nodiscard]] static result<hybrid_kv_cache> create(cache_config cfg, std::span<const K> groups,
                                                      hybrid_options options = {}, policies p = {});

  // ------------------------------------------------------------------------------------------------ sequences

  /// Prefill by count: ceil(num_tokens / block_size) blocks in every group, all or nothing; not content-cached.
  /// Errors as paged_kv_cache::add_sequence.
  status add_sequence(seq_id id, std::int32_t num_tokens);

  /// Prefill with token ids: the agreed prefix hit (capped so the last token is computed), then blocks for the
  /// whole prompt in every group (hits first in every group, then new blocks group by group), and every full block
  /// committed to each group's cache. `known`: chained hashes from block_hashes() of an earlier admission.
  status add_sequence(seq_id id, std::span<const token_id> tokens, sequence_options options = {},
                      prefix_match* hit = nullptr, std::span<const std::uint64_t> known = {});

  /// The lookup add_sequence(id, tokens, options) would do, changing nothing.
  [[nodiscard]] result<prefix_match> match_prefix(std::span<const token_id> tokens, sequence_options options = {});

  /// match_prefix keeping the hit for add_sequence(id, tokens, options, hit): `hit.blocks` holds num_groups()
  /// lists of match.blocks + match.host_blocks entries each (group-major, the null block where a group needs
  /// nothing, -3 where the host tier loads the block), and
  /// `hit.known_hashes` the block hashes of the tokens' full blocks.
  status match_prefix(std::span<const token_id> tokens, sequence_options options, prefix_hit& hit,
                      std::span<const std::uint64_t> known = {});

  /// Prefill consuming `hit` (a match_prefix of at least these tokens with these options); errc::stale_prefix_hit
  /// when the cache changed since or the hit was made for other tokens or options (nothing changed).
  status add_sequence(seq_id id, std::span<const token_id> tokens, sequence_options options, const prefix_hit& hit,
                      prefix_match* out = nullptr);

  /// Decode by count: `n` more tokens in every group (window release first, then copy-on-write of a shared last
  /// block and new blocks, group by group). The sequence's later blocks are no longer content-cached.
  status append_tokens(seq_id id, token_count n = token_count{1});

  status append_token(seq_id id, token_id token) { return append_tokens(id, std::span<const token_id>(&token, 1)); }

  /// Decode with token ids: as the count overload, and every block the tokens fill is committed in every group.
  status append_tokens(seq_id id, std::span<const token_id> tokens);

  /// Forks `child` from `parent`'s first `num_tokens` tokens (all when 0) in every group: shared blocks (copies
  /// with a fork_mode::copy sharing policy). Errors as paged_kv_cache::fork, and errc::invalid_argument when a
  /// group already released blocks the child still reads (num_tokens before the parent's window).
  status fork(seq_id parent, seq_id child, std::int32_t num_tokens = 0);

  /// Frees sequence `id`: groups in group order, each table from its last entry to its first (null entries
  /// skipped); a swapped-out sequence drops its host blocks. Tokens it appended in this step are not computed:
  /// their slots export as -1 in every group and the blocks they would have filled lose their cached content,
  /// except where another sequence already shares one of their blocks (a prefix hit in this step): those slots
  /// are kept. errc::unknown_sequence.
  KVPAGER_FLATTEN status free_sequence(seq_id id);

  // ------------------------------------------------------------------------------------------------ preemption

  /// Swaps the sequences in `group` out to host memory together, every group's table: each distinct non-null
  /// device block gets one host block (a block shared within the group is swapped once, and shared again on
  /// swap-in), the plan lists the (device, host) copies naming their group, and the device references are dropped
  /// (group by group, each table tail first; blocks keep their hashes and stay hit-able). Null entries stay null.
  /// All or nothing. Errors as paged_kv_cache::swap_out: errc::unsupported (no host pool), errc::unknown_sequence,
  /// errc::invalid_argument (an id listed twice), errc::sequence_swapped, errc::pending_append,
  /// errc::host_pool_full (detail = host blocks needed). A swapped sequence stops prefix-caching its later blocks.
  status swap_out(std::span<const seq_id> group);
  status swap_out(seq_id id) { return swap_out(std::span<const seq_id>(&id, 1)); }

  /// Swaps the sequences in `group` back in, every group's table, all or nothing: each distinct host block gets one
  /// device block of its group, and the plan lists the (host, device) copies naming their group. Errors as
  /// paged_kv_cache::swap_in: errc::unknown_sequence, errc::invalid_argument, errc::sequence_swapped (not swapped
  /// out), errc::out_of_blocks (detail = device blocks needed).
  status swap_in(std::span<const seq_id> group);
  status swap_in(seq_id id) { return swap_in(std::span<const seq_id>(&id, 1)); }

  /// What preempt(id) would do now, changing nothing: the swap policy's decision for the device blocks the
  /// sequence holds in all groups (preempt_action::unsupported with no_swap). Errors: errc::unknown_sequence,
  /// errc::sequence_swapped.
  [[nodiscard]] result<preempt_action> preempt_decision(seq_id id) const;
  /// Preempts sequence `id` as the swap policy decides: swap out (it stays live, swapped) or free it (recompute).
  /// Errors: errc::unsupported (the policy does not preempt), those of preempt_decision and swap_out.
  result<preempt_action> preempt(seq_id id);
  /// Table t's host block table of swapped-out sequence `id` (null_block entries stay null); errc::unknown_sequence,
  /// errc::sequence_swapped (it is on device), errc::invalid_argument (no such table).
  [[nodiscard]] result<std::span<const block_id>> host_block_table(std::int32_t g, seq_id id) const noexcept;
  /// The one-table form has no meaning with several groups: errc::unsupported (pass the group).
  [[nodiscard]] result<std::span<const block_id>> host_block_table(seq_id) const noexcept;
  /// Device blocks swap_in(id) takes at most: the non-null host entries of every group's table.
  /// errc::unknown_sequence, errc::sequence_swapped (it is on device).
  [[nodiscard]] result<std::int64_t> swap_in_blocks(seq_id id) const noexcept;
  /// The host (swap) pool, whose refcounts are the references of swapped-out tables; nullptr without one.
  [[nodiscard]] const typename detail::swap_book<W>::host_pool_type* host_pool() const noexcept;
  [[nodiscard]] const W& swap() const noexcept { return book_.policy(); }

  /// Starts a new step: the previous plan is taken as executed and cleared; blocks planned copies kept busy become
  /// reusable.
  void begin_step();

  /// The byte movement planned since the last begin_step(): copies (copy-on-write, copying forks) are whole blocks
  /// of the group each names (block_copy::group: only that group's layers move); appends are token ranges, whose
  /// slots differ per group (export_slot_mapping(g, ...)).
  [[nodiscard]] const step_plan& plan() const noexcept { return ledger_.plan(); }

  /// KV cache events into `*out` (core/kv_events.hpp; nullptr stops them), as paged_kv_cache::set_kv_event_buffer:
  /// blocks are reported per KV cache group (`kv_event::group`), by the chained hash of their tokens (the same in
  /// every group, as vLLM's events carry it, without the group's mixing); a block_stored's parent is the hash of
  /// the block before the first one listed (also when that block is the null block of a window). Same errors.
  status set_kv_event_buffer(kv_event_buffer* out) {
    status st = blocks_.attach_events(out);
    if constexpr (tier_type::enabled) {
      if (st) tier_.set_events(out);
    }
    return st;
  }

  // ------------------------------------------------------------------------------------------------ host tier

  /// The engine's reports of host tier transfers (host_tier_options::async), as paged_kv_cache's: each a load (a
  /// swap-in) or store (a swap-out) of the plan, naming the group whose layers it moved, as planned, ok or failed,
  /// once. A waiting sequence's loaded blocks are committed to their groups' caches as they stand when it is
  /// resolved (all in: it runs; one failed or timed out: tier_load_state::failed, free it and admit it again; the
  /// loads that arrived are cached). Errors (nothing changed): errc::unsupported (no tier, or synchronous
  /// transfers), errc::invalid_argument (an entry matching no transfer in flight, or listed twice; detail = its
  /// index).
  status complete_tier_transfers(std::span<const tier_done> done) {
    if constexpr (tier_type::enabled) {
      return tier_.complete(
          done, counts_, [this](block_id b, std::int32_t priority) { release(b, retention_hint{priority}); },
          [this](detail::pending_load& p) { commit_loaded(p); });
    } else {
      (void)done;
      return status{errc::unsupported, "complete_tier_transfers: the cache has no host tier"};
    }
  }

  /// Where sequence `id` stands with host tier loads (async transfers; tier_load_state::none otherwise).
  /// errc::unknown_sequence for an id not live.
  [[nodiscard]] result<tier_load_state> load_state(seq_id id) const noexcept {
    if (!contains(id)) return status{errc::unknown_sequence, "load_state: unknown sequence id"};
    if (const detail::external_wait* w = external_.find(id)) return w->state;
    if constexpr (tier_type::enabled) return tier_.load_state(id);
    return tier_load_state::none;
  }

  /// The host tier (a cache with a tier policy): keyed by cached_key(hash, group), its states and counts.
  [[nodiscard]] const auto& tier() const noexcept
    requires tier_type::enabled
  {
    return tier_.tier();
  }

  // ------------------------------------------------------------------------------------------------ external KV

  /// The table entries of sequence `id` waiting for KV from outside (sequence_options::external_tokens), the same
  /// range in every table: the full blocks after the cache's own agreed hit, below the prompt's last token. A group
  /// whose kind skips leading tokens takes new blocks only for the entries its window still reads from the first
  /// token computed after them; the others are the null block (the engine reads nothing into them). Errors as
  /// paged_kv_cache::external_blocks.
  [[nodiscard]] result<external_range> external_blocks(seq_id id) const noexcept {
    return external_.range(id, contains(id));
  }

  /// The engine received sequence `id`'s external KV (`ok`): every group's non-null external entries are committed
  /// to its cache (KV cache events too) and the sequence runs as a prefix hit of those tokens; not `ok`: load_state
  /// says failed, nothing is committed (free it and admit it again without external tokens). As
  /// paged_kv_cache::complete_external, a sequence freed while its read could still write keeps its external blocks
  /// until this call reports it. Same errors.
  status complete_external(seq_id id, bool ok) {
    return external_.complete(
        id, ok, contains(id), [this](block_id b) { release(b, retention_hint{}); },
        [this](const detail::external_wait& w) {
          const std::int32_t h = *primary().template checked<"complete_external">(w.id);
          commit_full(h, 0, detail::span_of(w.tokens));
        });
  }

  /// The key group g's block holding the chained hash `h` is cached under in the sharing policy (its
  /// `block_hash`): what a KV cache event's (hash, group) names in this cache.
  [[nodiscard]] static std::uint64_t cached_key(std::uint64_t h, std::int32_t g) noexcept { return group_key(h, g); }

  /// Forgets every cached block, as paged_kv_cache::reset_prefix_cache (one all_blocks_cleared event); only when no
  /// sequence is live and no block waits for a planned copy, else errc::invalid_block and nothing changed.
  status reset_prefix_cache() {
    if (num_sequences() > 0 || ledger_.pending_free() > 0 || !external_.empty())
      return status{errc::invalid_block, "reset_prefix_cache: blocks are in use", stats().used};
    if constexpr (tier_type::enabled) {
      if (tier_.in_flight())
        return status{errc::invalid_block, "reset_prefix_cache: host tier loads or stores are in flight (begin_step)"};
      tier_.reset();
    }
    if constexpr (caching) {
      blocks_.clear_content();
      // Kept lookups stay exact: a cleared hit's stamp is gone, and a miss stays a miss (nothing was committed).
      if (multi()) {  // the free leads' companions no longer serve a hit: back to the free blocks
        for (block_id b = 0; b < cfg_.num_blocks; ++b)
          if (attached_[static_cast<std::size_t>(b)] > 0) detach(b);
      }
    }
    return ok_status();
  }

  // ------------------------------------------------------------------------------------------------ queries

  [[nodiscard]] std::int32_t num_groups() const noexcept { return static_cast<std::int32_t>(kinds_.size()); }
  /// Pool blocks per table entry of group g (hybrid_options::units; 1 unless given).
  [[nodiscard]] std::int32_t units(std::int32_t g) const noexcept { return units_[static_cast<std::size_t>(g)]; }
  /// Tables per sequence: the units of every group (num_groups() when each group has one unit).
  [[nodiscard]] std::int32_t num_tables() const noexcept { return static_cast<std::int32_t>(tables_.size()); }
  /// The table of group g's u-th pages (u in [0, units(g))): g itself for u = 0 (the leads), after the groups for
  /// the companions.
  [[nodiscard]] std::int32_t unit_table(std::int32_t g, std::int32_t u) const noexcept {
    return u == 0 ? g : num_groups() + ubase_[static_cast<std::size_t>(g)] + u - 1;
  }
  [[nodiscard]] const K& kind(std::int32_t g) const noexcept { return kinds_[static_cast<std::size_t>(g)]; }
  [[nodiscard]] hybrid_conventions conventions() const noexcept { return options_.conventions; }
  [[nodiscard]] bool contains(seq_id id) const noexcept { return primary().contains(id); }
  /// Whether sequence `id` is live and swapped out.
  [[nodiscard]] bool is_swapped(seq_id id) const noexcept;
  [[nodiscard]] std::int32_t num_sequences() const noexcept { return primary().size(); }
  [[nodiscard]] std::int32_t block_size() const noexcept { return cfg_.block_size; }
  [[nodiscard]] const cache_config& config() const noexcept { return cfg_; }
  [[nodiscard]] constexpr kv_geometry geometry() const noexcept { return cfg_.geometry(); }
  [[nodiscard]] std::int32_t refcount(block_id b) const noexcept { return blocks_.refcount(b); }
  [[nodiscard]] bool is_free(block_id b) const noexcept { return blocks_.pool().is_free(b); }
  /// The group block `b` was last handed to (meaningful while it is referenced; a companion's is its lead's).
  [[nodiscard]] std::int32_t owner_group(block_id b) const noexcept;
  /// Blocks an allocation can use now (free + evictable), for all groups together.
  [[nodiscard]] std::int64_t available_blocks() const noexcept { return blocks_.available() + spare_; }
  /// Blocks a prompt of `num_tokens` tokens takes without prefix hits: its blocks in every table.
  [[nodiscard]] std::int64_t blocks_needed(std::int64_t num_tokens) const noexcept;
  /// Blocks in use now: usable minus available.
  [[nodiscard]] std::int64_t used_blocks() const noexcept;
  /// The most used_blocks() after any successful allocating call.
  [[nodiscard]] std::int64_t peak_used_blocks() const noexcept { return peak_used_; }
  [[nodiscard]] const group_stats& stats(std::int32_t g) const noexcept { return gstats_[static_cast<std::size_t>(g)]; }

  [[nodiscard]] cache_stats stats() const noexcept;

  [[nodiscard]] result<std::int32_t> num_tokens(seq_id id) const noexcept;
  /// Table t's block table of sequence `id` (null_block where its group no longer reads); t = g for group g's
  /// leads (unit_table).
  [[nodiscard]] result<std::span<const block_id>> block_table(std::int32_t t, seq_id id) const noexcept;
  /// Every table's block table of sequence `id` into `out`, in table order (paged_kv_cache answers its one):
  /// errc::unknown_sequence, errc::sequence_swapped, and `out` unchanged.
  status block_tables(seq_id id, std::vector<std::span<const block_id>>& out) const;
  /// The chained hashes of sequence `id`'s full blocks (empty without content caching), for re-admission.
  status block_hashes(seq_id id, std::vector<std::uint64_t>& out) const;

  // ------------------------------------------------------------------------------------------------ exports

  /// Table t's dense page table (paged_kv_cache::export_block_table's format; null entries are null_block); t is
  /// a group with one unit per group, else unit_table(g, u).
  status export_block_table(std::int32_t g, std::span<const seq_id> seqs, std::span<std::int32_t> table,
                            std::int32_t row_stride, std::span<std::int32_t> seq_lens) const noexcept;
  [[nodiscard]] result<std::int64_t> csr_size(std::int32_t g, std::span<const seq_id> seqs) const noexcept;
  status export_csr(std::int32_t g, std::span<const seq_id> seqs, std::span<std::int32_t> indptr,
                    std::span<std::int32_t> indices, std::span<std::int32_t> last_page_len) const noexcept;
  /// The one-table exports have no meaning with several groups: errc::unsupported (export per group).
  [[nodiscard]] result<std::int64_t> csr_size(std::span<const seq_id>) const noexcept { return per_group("csr_size"); }
  status export_csr(std::span<const seq_id>, std::span<std::int32_t>, std::span<std::int32_t>,
                    std::span<std::int32_t>) const noexcept;
  /// Slots of this step's appends in all tables: num_tables() x plan().num_append_tokens().
  [[nodiscard]] std::int64_t slot_mapping_size() const noexcept;
  /// Table t's slot mapping of this step's appends (plan().num_append_tokens() slots), in plan().appends() order:
  /// slot = block * block_size + offset in that group's table; -1 for tokens of sequences freed since, except
  /// slots kept for sharers. errc::buffer_too_small (detail = plan().num_append_tokens()), nothing written.
  status export_slot_mapping(std::int32_t g, std::span<std::int64_t> out) const noexcept;
  /// Every table's slot mapping, table-major: table t's at [t x n, (t + 1) x n), n = plan().num_append_tokens()
  /// (what kvpager::scheduler exports as step_output::slot_mapping). errc::buffer_too_small (detail =
  /// slot_mapping_size()).
  status export_slot_mapping(std::span<std::int64_t> out) const noexcept;

  [[nodiscard]] const block_pool<A>& pool() const noexcept { return blocks_.pool(); }
  [[nodiscard]] const E& eviction() const noexcept { return blocks_.eviction(); }
  [[nodiscard]] const S& sharing() const noexcept { return blocks_.sharing(); }

 private:
  /// What a sequence keeps beside its per-group tables (indexed by handle, as the tables).
  struct extra_state {
    std::vector<std::uint64_t> hashes;     ///< chained hashes of its full blocks (content known)
    std::vector<std::int32_t> committed;   ///< per group: table entries committed to the cache
    std::int32_t step_base = 0;            ///< tokens before its first append of the current step
    bool content = false;                  ///< token ids known: full blocks are hashed and cached
  };

  hybrid_kv_cache(cache_config cfg, std::span<const K> groups, std::vector<vllm_kind> vk, hybrid_options options,
                  block_pool<A> pool, E e, S s, W w, tier_type t);

  // ---------------------------------------------------------------- groups of several units

  /// Whether some group has more than one unit (the companion bookkeeping runs only then).
  [[nodiscard]] bool multi() const noexcept { return max_units_ > 1; }
  /// Slot u (in [1, max_units_)) of lead b's companions.
  [[nodiscard]] block_id& companion(block_id b, std::int32_t u) noexcept {
    const auto slots = static_cast<std::size_t>(max_units_ - 1);
    return comp_[static_cast<std::size_t>(b) * slots + static_cast<std::size_t>(u - 1)];
  }
  /// The lead block `b` follows (b itself unless it is a companion).
  [[nodiscard]] block_id lead_of(block_id b) const noexcept {
    if (!multi() || b <= null_block) return b;
    const block_id l = lead_of_[static_cast<std::size_t>(b)];
    return l >= 0 ? l : b;
  }
  /// One block from the store for table `g` (a group, or -1: a bare block), lead b's old companions (if it was
  /// handed out again) returned to the free blocks first; then, for a group of u units, u - 1 companions attached.
  /// (Out of line, as the other companion paths: they must not take the one-unit paths' inlining.)
  KVPAGER_NOINLINE void take_multi(std::int32_t g, block_id& b) noexcept;
  /// A block popped from the store: its companions (it led an entry) go back to the free blocks.
  KVPAGER_NOINLINE void detach(block_id b) noexcept;
  /// release and touch of a cache with companions: the lead's companions counted as idle and spare.
  KVPAGER_NOINLINE void release_units(block_id b, retention_hint hint);
  KVPAGER_NOINLINE void touch_units(block_id b) noexcept;
  /// Table entries [from, ...) of sequence h's companion tables of group g rewritten from its leads.
  void mirror(std::int32_t h, std::int32_t g, std::size_t from) {
    if (units_[static_cast<std::size_t>(g)] > 1) mirror_units(h, g, from);
  }
  KVPAGER_NOINLINE void mirror_units(std::int32_t h, std::int32_t g, std::size_t from);
  /// After a swap-in: each non-null lead of the sequences' tables gets the companions its companion tables hold.
  KVPAGER_NOINLINE void reattach(std::span<const seq_id> seqs) noexcept;
  /// Plans the copy of group g's entry `src` to `dst`: the lead and each companion (on its own table).
  void plan_copy(std::int32_t g, block_id src, block_id dst);

  /// Group g's slots of this step's appends into `out` (exactly plan().num_append_tokens() long).
  void write_slots(std::int32_t g, std::span<std::int64_t> out) const noexcept;

  [[nodiscard]] static constexpr std::size_t ix(std::int64_t i) noexcept { return static_cast<std::size_t>(i); }
  [[nodiscard]] const table_type& primary() const noexcept { return tables_[0]; }
  [[nodiscard]] table_type& primary() noexcept { return tables_[0]; }

  /// The non-null entries of sequence h's tables (its device blocks, or host blocks while swapped out).
  [[nodiscard]] std::int64_t held_blocks(std::int32_t h) const noexcept;
  [[nodiscard]] static status per_group(const char* call) noexcept;
  [[nodiscard]] status check_group(const char* call, std::int32_t g) const noexcept;
  [[nodiscard]] static status check_prompt(const char* call, std::span<const token_id> tokens) noexcept;

  [[nodiscard]] bool exceeds_table_limit(std::int64_t blocks) const noexcept;
  [[nodiscard]] std::uint64_t generation() const noexcept;

  /// A new handle in every group's table (they stay in step: same inserts and erases in the same order).
  std::int32_t insert(seq_id id);

  // ---------------------------------------------------------------- block life cycle, counted per group

  void count_up(std::int32_t g, block_id b) noexcept;
  void take(std::int32_t g, std::span<block_id> out) noexcept;
  void touch(std::int32_t g, block_id b) noexcept;
  void release(block_id b, retention_hint hint);
  /// Drops one reference to b, parking it where a planned copy still uses it (the step ledger's rule).
  void drop(block_id b, retention_hint hint);
  void note_allocation() noexcept;

  // ---------------------------------------------------------------- hashing and lookup

  /// Group g's index key for a block of chained hash `h`, and its cursor's extra key (so that verification tells
  /// groups apart as well).
  [[nodiscard]] static std::uint64_t group_key(std::uint64_t h, std::int32_t g) noexcept;
  /// What group_key mixes into group g's hashes (0 for group 0).
  [[nodiscard]] static constexpr std::uint64_t group_mix(std::int32_t g) noexcept {
    return std::uint64_t{0xD6E8FEB86659FD93ULL} * static_cast<std::uint64_t>(g);
  }
  [[nodiscard]] static std::uint64_t group_extra(std::uint64_t extra, std::int32_t g) noexcept;

  /// The chained hash of block i (holding `block`) after the hashes of blocks 0 .. i-1, under root key `extra`.
  [[nodiscard]] static std::uint64_t chain_hash(std::span<const std::uint64_t> hashes, std::size_t i,
                                                std::uint64_t extra, std::span<const token_id> block) noexcept;

  /// Extends `hashes` (a prefix may be known) to every full block of `tokens`.
  void hash_blocks(std::span<const token_id> tokens, std::uint64_t extra, std::vector<std::uint64_t>& hashes) const;

  /// The agreed hit for `tokens` (capped at n - 1 tokens, n <= tokens.size()): its length in blocks, the
  /// num_groups() hit lists in `lists` (group-major, that many entries each), and in `need` the blocks adding
  /// n tokens takes from available_blocks(). Changes nothing.
  std::int32_t find_hit(std::span<const token_id> tokens, std::uint64_t extra, std::span<const std::uint64_t> hashes,
                        std::vector<block_id>& lists, std::int64_t& need, std::int32_t n);

  /// Brings the memo up to date for a lookup of `tokens` with `hashes` (its m blocks) under `extra`, capped at
  /// `max_tokens`: the cells looked up before keep their answers (looked up again where they may have changed),
  /// every other cell is to look up. True when every cell the last lookup read answers as it did and the cap is
  /// the same: the last lookup's result (memo_len_, memo_lists_, memo_nulls_) is this one's.
  [[nodiscard]] bool keep_lookup(std::span<const token_id> tokens, std::uint64_t extra,
                                 std::span<const std::uint64_t> hashes, std::int64_t max_tokens);
  /// A cell of a block at or past memo_end_ is looked up: the memo keeps the hashes and tokens of blocks
  /// [memo_end_, end) as this prompt has them (a kept lookup may serve another prompt that agrees only on the blocks
  /// read before), and memo_end_ becomes `end`.
  void remember_blocks(std::span<const token_id> tokens, std::span<const std::uint64_t> hashes, std::size_t end);

  /// Blocks an admission of `total` blocks per group with hit lists `lists` (`len` entries each) takes from
  /// available_blocks(): the new blocks of every group and the hits that are free or evictable.
  [[nodiscard]] std::int64_t admission_need(std::int64_t total, std::int32_t len,
                                            std::span<const block_id> lists) const noexcept;

  // ---------------------------------------------------------------- operations

  status add_impl(seq_id id, std::int32_t n, std::span<const token_id> tokens, sequence_options options,
                  prefix_match* out, const prefix_hit* given, std::span<const std::uint64_t> known);

  /// Commits sequence h's full blocks from block `from` on in every group (entries not yet committed, not null,
  /// not cached); `tokens` holds the tokens of blocks [from, ...) from its start.
  void commit_full(std::int32_t h, std::size_t from, std::span<const token_id> tokens);
  /// Commits block `b`, entry i of sequence h's group-g table, holding `block` (chained hashes `hashes`, i + 1 or
  /// more of them): the prefix cache, its event, the host tier's write-through, the lookup memo's commit log.
  void commit_entry(std::int32_t h, std::int32_t g, std::size_t i, block_id b, std::span<const std::uint64_t> hashes,
                    std::span<const token_id> block);

  /// The host tier's part of an admission: the loads of the tier cells of lists_ (hit length len; sequence h's
  /// tables hold their new blocks), the lookups counted for selective storing, and with async transfers the wait
  /// record of sequence `id`. `hashes`: the prompt's block hashes.
  void plan_loads(std::int32_t h, seq_id id, std::int32_t len, bool waits, std::span<const token_id> tokens,
                  std::span<const std::uint64_t> hashes, std::uint64_t extra);
  /// A waiting sequence's loads are resolved: the blocks that arrived are committed in their groups.
  void commit_loaded(const detail::pending_load& p);
  /// After an operation that took device blocks: the host tier stores what was evicted for them (write-back).
  void tier_evicted() {
    if constexpr (tier_type::enabled) tier_.evicted(blocks_, ledger_, counts_);
  }
  /// errc::pending_append when sequence `id` waits for host tier loads (async transfers): its bytes are not in.
  template <detail::call_name Call>
  [[nodiscard]] status not_waiting(seq_id id) const noexcept {
    if (external_.find(id) != nullptr)
      return status{errc::pending_append,
                    detail::joined<Call, ": the sequence waits for external KV (load_state)">::value.data()};
    if constexpr (tier_type::enabled) {
      if (tier_.waits(id))
        return status{errc::pending_append,
                      detail::joined<Call, ": the sequence waits for host tier loads (tier_load_state)">::value.data()};
    } else {
      (void)id;
    }
    return ok_status();
  }

  std::uint64_t record_append(std::int32_t h, seq_id id, std::int32_t first, std::int32_t count);

  /// Slots for `n` more tokens of sequence h in every group: window release, capacity, copy-on-write, new blocks.
  status grow(std::int32_t h, std::int32_t n, std::span<const token_id> tokens);

  /// The decode step's path, inline: one token that fits every group's last block as it is (ours alone, not cached,
  /// no window past a block); a token that fills the block hashes and commits it here. False (nothing changed)
  /// otherwise.
  bool append_one_in_place(std::int32_t h, token_id token);

  /// Sequence h's partial block `i` just filled (its tokens in `partial`): its hash (unless known) and its commit in
  /// every group, as extend_content does for a longer append.
  void fill_block(std::int32_t h, std::size_t i);

  /// Whether every group can write tokens from position `from` on into its last block as it is: ours alone, not
  /// cached, and no block wholly before the group's window still held.
  [[nodiscard]] bool in_place(std::int32_t h, std::int64_t from) const noexcept;

  /// The end of a successful append of `n` tokens at position `first`: the plan's range, the counts, the content
  /// (hashes and commits of the blocks the tokens fill), and the peaks when blocks were taken.
  status finish_append(std::int32_t h, std::int32_t first, std::int32_t n, bool pending,
                       std::span<const token_id> tokens, bool allocated);

  /// Table entries [0, k) wholly before group g's window for a next token at position `from`.
  [[nodiscard]] std::size_t release_end(std::int32_t g, std::int64_t from, std::size_t len) const noexcept;

  /// The window release: in group order, entries k-1 down to the first null entry are released and nulled.
  void release_window(std::int32_t h, std::int64_t from, retention_hint hint);

  /// Hashes and commits the blocks that tokens appended at position `first` fill.
  void extend_content(std::int32_t h, std::int32_t first, std::span<const token_id> tokens);

  /// Before sequence h is freed: its appends of this step are cancelled (slots -1 in every group) and the blocks
  /// they touch lose their cached content, except blocks another sequence shares (a prefix hit in this step): their
  /// slots are kept (frozen), in every group, and they stay busy for the step (the step_ledger's rule, per group).
  void cancel_appends(std::int32_t h);

  static constexpr block_id lookup_pending = -2;
  /// A hit list's entry for a block the host tier loads (not on the device; a new block takes it).
  static constexpr block_id tier_cell = -3;

  cache_config cfg_;
  hybrid_options options_;  ///< units cleared (the cache's own are units_)
  std::vector<K> kinds_;
  std::vector<std::int32_t> units_;     ///< per group: pool blocks per entry
  std::vector<std::int32_t> ubase_;     ///< per group: its companion tables start at num_groups() + ubase_[g]
  std::int32_t max_units_ = 1;
  std::vector<block_id> comp_;          ///< per block, max_units_ - 1 slots: the companions of a lead
  std::vector<block_id> lead_of_;       ///< per block: the lead a companion follows, -1 otherwise
  std::vector<std::uint8_t> attached_;  ///< per block: companions attached to it as a lead
  std::int64_t spare_ = 0;              ///< companions of leads that are free or evictable (available too)
  std::int64_t idle_ = 0;               ///< companions of unreferenced leads (spare_ and those of parked leads)
  std::vector<vllm_kind> vkinds_;   ///< vLLM's view of the kinds (vllm conventions only)
  std::vector<table_type> tables_;  ///< per table (groups' leads, then companions); table 0 also holds the
                                    ///< per-sequence fields (id, priority, ...)
  std::vector<extra_state> extra_;  ///< per handle
  std::vector<group_stats> gstats_;
  detail::block_store<A, E, S> blocks_;
  detail::step_ledger ledger_;
  detail::swap_book<W> book_;
  tier_type tier_;                   ///< the host tier (empty without one)
  detail::external_book external_;   ///< sequences waiting for (or failed to get) external KV
  std::vector<std::uint8_t> owner_;  ///< per block: the group it was last handed to
  std::int64_t peak_used_ = 0;
  cache_stats counts_;
  // Scratch, kept between calls so that warm calls allocate nothing.
  std::vector<std::uint64_t> hashes_;
  std::vector<block_id> lists_;
  std::vector<block_id> memo_;
  std::vector<std::int32_t> nulls_;
  std::vector<token_id> buffer_;
  std::vector<block_id> tier_dst_;     ///< an admission's loads: device blocks of one group
  std::vector<block_id> tier_blocks_;  ///< an admission's loads: their tier blocks, in slot order
  std::vector<std::int32_t> tier_cells_;  ///< an admission's loads: their table entries (pending_load::cells)
  std::int32_t device_hit_ = 0;  ///< find_hit with a tier: the entries of the hit the device alone would serve
  vllm_hit_scratch vscratch_;
  hit_scratch hscratch_;
  // The last prompt's lookup, kept for the next lookup of the same prompt (keeps_lookups only): memo_ holds what
  // each (block, group) cell found, block-major (cell i * num_groups() + g). Invariant: every cell not in
  // memo_cells_ is lookup_pending.
  std::vector<std::uint64_t> memo_stamp_;   ///< per cell looked up and found: first_holder_stamp of its block
  std::vector<std::int32_t> memo_cells_;    ///< the cells looked up
  std::vector<std::uint64_t> memo_hashes_;  ///< the prompt's block hashes (memo_m_ of them)
  std::vector<token_id> memo_tokens_;       ///< the prompt's tokens (memo_m_ blocks)
  std::uint64_t memo_extra_ = 0;
  std::size_t memo_m_ = 0;
  std::size_t memo_end_ = 0;  ///< 1 + the last block a cell was looked up in (0: none)
  /// 0: no prompt; 1: the prompt's hashes are known (looked up once); 2: its tokens too (looked up again: from the
  /// next lookup on, its cells are re-checked instead of looked up). A prompt looked up once is not copied.
  std::uint8_t memo_stage_ = 0;
  std::uint64_t memo_commits_ = 0;          ///< the policy's commits() when the memo was last brought up to date
  // The last agreed hit, for the cap memo_max_tokens_ (-1: none).
  std::int64_t memo_max_tokens_ = -1;
  std::int32_t memo_len_ = 0;
  std::vector<block_id> memo_lists_;
  std::vector<std::int32_t> memo_nulls_;
  // The keys committed since the memo was last brought up to date, at most commit_log_capacity (then full).
  static constexpr std::size_t commit_log_capacity = 32;
  std::array<std::uint64_t, commit_log_capacity> commit_log_{};
  std::size_t commit_log_size_ = 0;  ///< commit_log_capacity + 1: more keys were committed than the log holds
};

// ------------------------------------------------------------------------------------------------ definitions

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE hybrid_kv_cache<K, A, E, S, W, T>::hybrid_kv_cache(const hybrid_kv_cache&) = default;
template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE hybrid_kv_cache<K, A, E, S, W, T>::hybrid_kv_cache(hybrid_kv_cache&&) noexcept = default;
template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::operator=(const hybrid_kv_cache&)
    -> hybrid_kv_cache& = default;
template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::operator=(hybrid_kv_cache&&) noexcept
    -> hybrid_kv_cache& = default;
template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE hybrid_kv_cache<K, A, E, S, W, T>::~hybrid_kv_cache() = default;

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::create(cache_config cfg, std::span<const K> groups,
                                                                hybrid_options options, policies p)
    -> result<hybrid_kv_cache> {
  if (status st = validate(cfg); !st) return st;
  if (groups.empty()) return status{errc::invalid_argument, "hybrid_kv_cache::create: no KV cache group"};
  if (groups.size() > static_cast<std::size_t>(max_groups))
    return status{errc::invalid_argument, "hybrid_kv_cache::create: more than max_groups groups",
                  static_cast<std::int64_t>(groups.size())};
  for (std::size_t g = 0; g < groups.size(); ++g)
    if (status st = groups[g].validate(); !st) return st;
  if (cfg.reserved_blocks < 1)
    return status{errc::invalid_argument,
                  "hybrid_kv_cache::create: block 0 is the null block: reserved_blocks must be at least 1",
                  cfg.reserved_blocks};
  if (cfg.num_host_blocks == 1)
    return status{errc::invalid_pool_size,
                  "hybrid_kv_cache::create: host block 0 is reserved (a table's null entry on the host side): "
                  "num_host_blocks must be 0 or at least 2",
                  cfg.num_host_blocks};
  if (!options.units.empty()) {
    if (options.units.size() != groups.size())
      return status{errc::invalid_argument, "hybrid_kv_cache::create: units must be empty or one per group",
                    static_cast<std::int64_t>(options.units.size())};
    std::int64_t total = 0;
    for (const std::int32_t u : options.units) {
      if (u < 1)
        return status{errc::invalid_argument, "hybrid_kv_cache::create: a group's units must be at least 1", u};
      total += u;
      if (u > 1 && options.conventions == hybrid_conventions::vllm)
        return status{errc::invalid_argument,
                      "hybrid_kv_cache::create: groups of several units need native conventions (vLLM pads to one "
                      "page size)", u};
    }
    if (total > max_groups)
      return status{errc::invalid_argument, "hybrid_kv_cache::create: more than max_groups units in all", total};
  }
  std::vector<vllm_kind> vk;
  if (options.conventions == hybrid_conventions::vllm) {
    for (const K& k : groups) vk.push_back(vllm_kind_of(k));
    if (status st = check_vllm_layout(detail::span_of(vk)); !st) return st;
  }
#if KVPAGER_HAS_EXCEPTIONS
  try {
#endif
    if constexpr (tier_type::enabled) {
      for (const std::int32_t u : options.units)
        if (u > 1)
          return status{errc::invalid_argument,
                        "hybrid_kv_cache::create: a host tier keeps one block per table entry: groups of several "
                        "units cannot have one", u};
    }
    auto link = tier_type::create(cfg, std::move(p.tier));
    if (!link) return link.error();
    auto pool = block_pool<A>::create({cfg.num_blocks, cfg.reserved_blocks}, std::move(p.allocator));
    if (!pool) return pool.error();
    return hybrid_kv_cache(cfg, groups, std::move(vk), options, std::move(*pool), std::move(p.eviction),
                           std::move(p.sharing), std::move(p.swap), std::move(*link));
#if KVPAGER_HAS_EXCEPTIONS
  } catch (const std::bad_alloc&) {
    return status{errc::out_of_memory, "hybrid_kv_cache::create: not enough host memory for the bookkeeping",
                  cfg.num_blocks};
  }
#endif
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::add_sequence(seq_id id, std::int32_t num_tokens) -> status {
  if (num_tokens <= 0) return status{errc::invalid_argument, "add_sequence: num_tokens must be positive", num_tokens};
  return add_impl(id, num_tokens, {}, sequence_options{}, nullptr, nullptr, {});
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::add_sequence(seq_id id, std::span<const token_id> tokens,
                                                                      sequence_options options, prefix_match* hit,
                                                                      std::span<const std::uint64_t> known) -> status {
  if (status st = check_prompt("add_sequence", tokens); !st) return st;
  return add_impl(id, static_cast<std::int32_t>(tokens.size()), tokens, options, hit, nullptr, known);
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::match_prefix(std::span<const token_id> tokens,
                                                                      sequence_options options)
    -> result<prefix_match> {
  prefix_hit h;
  if (status st = match_prefix(tokens, options, h); !st) return st;
  return h.match;
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::match_prefix(std::span<const token_id> tokens,
                                                                      sequence_options options, prefix_hit& hit,
                                                                      std::span<const std::uint64_t> known) -> status {
  hit.blocks.clear();
  hit.known_hashes.assign(known.begin(), known.end());
  hit.num_tokens = 0;
  hit.match = prefix_match{};
  if (status st = check_prompt("match_prefix", tokens); !st) return st;
  const auto n = static_cast<std::int32_t>(tokens.size());
  hash_blocks(tokens, options.extra_key, hit.known_hashes);
  std::int64_t need = 0;
  const std::int32_t len = find_hit(tokens, options.extra_key, detail::span_of(hit.known_hashes), hit.blocks, need, n);
  std::int32_t d = len;  // the entries the device alone serves: the rest is the host tier's
  if constexpr (tier_type::enabled) {
    d = device_hit_;
    hit.tier_generation = tier_.generation();
  }
  hit.match = prefix_match{d, len * cfg_.block_size, need, len - d};
  hit.generation = generation();
  hit.extra_key = options.extra_key;
  hit.num_tokens = n;
  return ok_status();
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::add_sequence(seq_id id, std::span<const token_id> tokens,
                                                                      sequence_options options, const prefix_hit& hit,
                                                                      prefix_match* out) -> status {
  bool tier_fresh = true;
  if constexpr (tier_type::enabled) tier_fresh = hit.tier_generation == tier_.generation();
  if (!tier_fresh || hit.generation != generation() || hit.extra_key != options.extra_key ||
      tokens.size() > static_cast<std::size_t>(hit.num_tokens) || hit.num_tokens == 0)
    return status{errc::stale_prefix_hit, "add_sequence: the prefix hit is stale (the cache changed since "
                                          "match_prefix) or was made for other tokens or options"};
  if (status st = check_prompt("add_sequence", tokens); !st) return st;
  return add_impl(id, static_cast<std::int32_t>(tokens.size()), tokens, options, out, &hit,
                  detail::span_of(hit.known_hashes));
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::append_tokens(seq_id id, token_count n) -> status {
  if (n.value <= 0) return status{errc::invalid_argument, "append_tokens: token count must be positive", n.value};
  const auto h = primary().template checked<"append_tokens">(id);
  if (!h) return h.error();
  if (status st = not_waiting<"append_tokens">(id); !st) return st;
  return grow(*h, n.value, {});
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::append_tokens(seq_id id, std::span<const token_id> tokens)
    -> status {
  if (tokens.empty() || tokens.size() > static_cast<std::size_t>(INT32_MAX))
    return status{errc::invalid_argument, "append_tokens: token count must be positive",
                  static_cast<std::int64_t>(tokens.size())};
  const auto h = primary().template checked<"append_tokens">(id);
  if (!h) return h.error();
  if (status st = not_waiting<"append_tokens">(id); !st) return st;
  if (tokens.size() == 1 && append_one_in_place(*h, tokens[0])) return ok_status();
  return grow(*h, static_cast<std::int32_t>(tokens.size()), tokens);
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::fork(seq_id parent, seq_id child, std::int32_t num_tokens)
    -> status {
  const auto ph = primary().template checked<"fork">(parent);
  if (!ph) return ph.error();
  if (status st = not_waiting<"fork">(parent); !st) return st;
  if (child == parent || primary().contains(child))
    return status{errc::duplicate_sequence, "fork: child sequence id is already live"};
  const auto& parent_state = primary()[*ph];
  if (num_tokens < 0 || num_tokens > parent_state.num_tokens)
    return status{errc::invalid_argument, "fork: num_tokens must be in [0, parent length]", num_tokens};
  if (parent_state.append_step == ledger_.step())
    return status{errc::pending_append, "fork: the parent has tokens appended in this step; fork after begin_step"};
  const std::int32_t tokens = num_tokens == 0 ? parent_state.num_tokens : num_tokens;
  const auto k = static_cast<std::size_t>(blocks_for_tokens(tokens, cfg_.block_size));
  std::int64_t copies = 0;
  for (std::int32_t g = 0; g < num_groups(); ++g) {
    const auto& t = tables_[ix(g)][*ph].blocks;
    const auto first = static_cast<std::size_t>(kinds_[ix(g)].skipped_tokens(tokens) / cfg_.block_size);
    for (std::size_t i = first; i < k; ++i)
      if (t[i] == null_block)
        return status{errc::invalid_argument, "fork: a window group no longer holds blocks the child reads", g};
    for (std::size_t i = 0; i < k; ++i) copies += t[i] != null_block ? units_[ix(g)] : 0;
  }
  if constexpr (S::fork == fork_mode::copy) {
    if (copies > available_blocks())
      return status{errc::out_of_blocks, "fork: not enough free blocks to copy the parent", copies};
  }
  const std::int32_t h = insert(child);  // may reallocate the states: index by handle from here on
  const auto& p = primary()[*ph];
  const extra_state& pe = extra_[static_cast<std::size_t>(*ph)];
  extra_state& ce = extra_[static_cast<std::size_t>(h)];
  for (std::int32_t g = 0; g < num_groups(); ++g) {
    const auto& pt = tables_[ix(g)][*ph].blocks;
    auto& ct = tables_[ix(g)][h].blocks;
    ct.assign(pt.begin(), pt.begin() + static_cast<std::ptrdiff_t>(k));
    for (block_id& b : ct) {
      if (b == null_block) continue;
      if constexpr (S::fork == fork_mode::copy) {
        const block_id src = b;
        take(g, std::span<block_id>(&b, 1));
        plan_copy(g, src, b);
        ++counts_.fork_copies;
      } else {
        blocks_.add_ref(b);
      }
    }
    tables_[ix(g)][h].num_tokens = tokens;
    gstats_[ix(g)].table_entries += static_cast<std::int64_t>(k);
    mirror(h, g, 0);
  }
  auto& c = primary()[h];
  c.priority = p.priority;
  c.extra_key = p.extra_key;
  if constexpr (S::fork == fork_mode::copy) c.append_step = ledger_.step();
  const auto full = static_cast<std::size_t>(tokens / cfg_.block_size);
  ce.hashes.assign(pe.hashes.begin(), pe.hashes.begin() + static_cast<std::ptrdiff_t>(std::min(full, pe.hashes.size())));
  ce.committed.resize(static_cast<std::size_t>(num_groups()));
  for (std::int32_t g = 0; g < num_groups(); ++g)
    ce.committed[ix(g)] = std::min(pe.committed[ix(g)], static_cast<std::int32_t>(full));
  // The child keeps caching where it knows its last block's tokens: a fork at the parent's end.
  ce.content = pe.content && (tokens == p.num_tokens || tokens % cfg_.block_size == 0);
  if (ce.content && tokens == p.num_tokens) c.partial = p.partial;
  ce.step_base = tokens;
  counts_.tokens += tokens;
  if constexpr (S::fork == fork_mode::copy) note_allocation();
  tier_evicted();
  return ok_status();
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::free_sequence(seq_id id) -> status {
  const auto hh = primary().template checked<"free_sequence">(id, detail::residency::any);
  if (!hh) return hh.error();
  const std::int32_t h = *hh;
  const bool swapped = primary()[h].swapped;
  if (!swapped && primary()[h].append_step == ledger_.step()) cancel_appends(h);
  if constexpr (tier_type::enabled) {  // loads in flight keep their blocks (released when reported)
    tier_.drop_sequence_with(id, [this, h](const detail::pending_load& p, std::int32_t j) noexcept {
      const std::int32_t c = p.cells[static_cast<std::size_t>(j)];
      tables_[ix(c % max_groups)][h].blocks[static_cast<std::size_t>(c / max_groups)] = null_block;
    });
  }
  // A read in flight may still write into the external entries: their blocks stay held (uncommitted, findable by
  // nobody) until complete_external(id) reports it. A failed read has ended: its blocks are freed now.
  detail::external_wait* w = external_.reading(id);
  const retention_hint hint{primary()[h].priority};
  for (std::int32_t g = 0; g < num_groups(); ++g) {
    const auto& t = tables_[ix(g)][h].blocks;
    if (!swapped) {
      for (std::size_t i = t.size(); i-- > 0;) {
        if (t[i] == null_block) continue;
        if (w != nullptr && i >= static_cast<std::size_t>(w->range.first) &&
            i < static_cast<std::size_t>(w->range.first + w->range.count)) {
          w->orphans.push_back(t[i]);
          continue;
        }
        release(t[i], hint);
      }
    }
    gstats_[ix(g)].table_entries -= static_cast<std::int64_t>(t.size());
  }
  if (swapped) {  // every table's host blocks (a companion has a host block of its own)
    for (const table_type& t : tables_) book_.drop_refs(t[h].blocks, null_block);
    book_.dropped_sequence();
  }
  if (w == nullptr || w->orphans.empty()) external_.erase(id);  // a failed read's record, or nothing to hold
  counts_.tokens -= primary()[h].num_tokens;
  for (table_type& t : tables_) t.erase(h);
  extra_state& e = extra_[static_cast<std::size_t>(h)];
  e.hashes.clear();
  e.content = false;
  return ok_status();
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::swap_out(std::span<const seq_id> group) -> status {
  if (!book_.has_host_pool())
    return status{errc::unsupported, "swap_out: the cache has no host pool (num_host_blocks 0)"};
  if (status st = primary().template checked_group<"swap_out">(group, detail::residency::device, ledger_.step());
      !st)
    return st;
  for (const seq_id id : group)
    if (status st = not_waiting<"swap_out">(id); !st) return st;
  const auto release_ref = [this](block_id b, retention_hint hint) { release(b, hint); };
  if (status st = book_.swap_out(group, std::span<table_type>(tables_), ledger_, release_ref, null_block); !st)
    return st;
  for (const seq_id id : group) {
    const std::int32_t h = *primary().template checked<"swap_out">(id, detail::residency::any);
    extra_[static_cast<std::size_t>(h)].content = false;
    primary()[h].partial.clear();
  }
  return ok_status();
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::swap_in(std::span<const seq_id> group) -> status {
  if (status st = primary().template checked_group<"swap_in">(group, detail::residency::swapped, ledger_.step());
      !st)
    return st;
  if (!multi()) {
    const auto taken = [this](std::int32_t g, block_id b) { count_up(g, b); };
    if (status st = book_.swap_in(group, std::span<table_type>(tables_), blocks_, ledger_, taken, null_block); !st)
      return st;
  } else {
    // Every table entry (lead or companion) gets a device block of its own; the companions are attached to their
    // leads after (reattach), from the companion tables the swap wrote.
    struct unit_store {
      hybrid_kv_cache* c;
      [[nodiscard]] std::int64_t available() const noexcept { return c->available_blocks(); }
      void take(std::span<block_id> out) noexcept {
        for (block_id& b : out) c->take_multi(-1, b);
      }
      void add_ref(block_id b) noexcept {
        if (c->lead_of_[static_cast<std::size_t>(b)] == -1) c->blocks_.add_ref(b);  // a companion goes with its lead
      }
    } store{this};
    const auto taken = [this](std::int32_t t, block_id b) {
      if (t < num_groups()) {
        count_up(t, b);
      } else {
        lead_of_[static_cast<std::size_t>(b)] = -2;  // a companion, its lead set by reattach
      }
    };
    if (status st = book_.swap_in(group, std::span<table_type>(tables_), store, ledger_, taken, null_block); !st)
      return st;
    reattach(group);
  }
  tier_evicted();
  note_allocation();
  return ok_status();
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::preempt_decision(seq_id id) const -> result<preempt_action> {
  const auto h = primary().template checked<"preempt">(id);
  if (!h) return h.error();
  if (status st = not_waiting<"preempt">(id); !st) return st;
  return book_.decide(static_cast<std::int32_t>(held_blocks(*h)));
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::preempt(seq_id id) -> result<preempt_action> {
  const auto d = preempt_decision(id);
  if (!d) return d;
  switch (*d) {
    case preempt_action::swap:
      if (status st = swap_out(id); !st) return st;
      ++counts_.preempted_swap;
      return *d;
    case preempt_action::recompute:
      (void)free_sequence(id);
      ++counts_.preempted_recompute;
      return *d;
    default:
      return status{errc::unsupported, "preempt: the swap policy does not preempt (no_swap)"};
  }
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::host_block_table(std::int32_t g, seq_id id)
    const noexcept -> result<std::span<const block_id>> {
  if (status st = check_group("host_block_table", g); !st) return st;
  const auto h = primary().template checked<"host_block_table">(id, detail::residency::swapped);
  if (!h) return h.error();
  return std::span<const block_id>(tables_[ix(g)][*h].blocks);
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::host_block_table(seq_id)
    const noexcept -> result<std::span<const block_id>> {
  return per_group("host_block_table");
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::swap_in_blocks(seq_id id)
    const noexcept -> result<std::int64_t> {
  const auto h = primary().template checked<"swap_in_blocks">(id, detail::residency::swapped);
  if (!h) return h.error();
  return held_blocks(*h);
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::host_pool()
    const noexcept -> const typename detail::swap_book<W>::host_pool_type* {
  return book_.host_pool();
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::begin_step() -> void {
  ledger_.begin_step([this](block_id b, retention_hint hint) {
    if (blocks_.refcount(b) != 0) return;
    blocks_.settle(b, hint);
    if (multi()) spare_ += attached_[static_cast<std::size_t>(b)];  // a parked lead is free or evictable now
  });
  book_.begin_step();
  if constexpr (tier_type::enabled) {
    tier_.begin_step(
        [this](block_id b, std::uint64_t& key) {
          if (!blocks_.is_cached(b)) return false;
          key = blocks_.sharing().block_hash(b);
          return true;
        },
        [this](block_id b) { touch(owner_[static_cast<std::size_t>(b)], b); },  // a store's source, held
        [this](detail::pending_load& p) { commit_loaded(p); }, ledger_.step(), ledger_, counts_);
  }
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::is_swapped(seq_id id) const noexcept -> bool {
  const auto h = primary().template checked<"is_swapped">(id, detail::residency::any);
  return h && primary()[*h].swapped;
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::owner_group(block_id b) const noexcept -> std::int32_t {
  return b >= 0 && b < cfg_.num_blocks ? owner_[static_cast<std::size_t>(lead_of(b))] : -1;
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::blocks_needed(std::int64_t num_tokens)
    const noexcept -> std::int64_t {
  return blocks_for_tokens(num_tokens, cfg_.block_size) * num_tables();
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::used_blocks() const noexcept -> std::int64_t {
  return std::int64_t{cfg_.num_blocks - cfg_.reserved_blocks} - available_blocks();
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::stats() const noexcept -> cache_stats {
  cache_stats s = counts_;
  s.block_size = cfg_.block_size;
  s.pending_free = ledger_.pending_free();
  s.sequences = primary().size();
  blocks_.report(s);
  // Companions of unreferenced leads are referenced in the pool but not used; those of free or evictable leads
  // are free for an allocation.
  s.free += static_cast<std::int32_t>(spare_);
  s.used -= static_cast<std::int32_t>(idle_);
  s.logical -= idle_;
  book_.report(s);
  if constexpr (tier_type::enabled) s.tier_in_flight = tier_.num_in_flight();
  return s;
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::num_tokens(seq_id id) const noexcept -> result<std::int32_t> {
  const auto h = primary().template checked<"num_tokens">(id, detail::residency::any);
  if (!h) return h.error();
  return primary()[*h].num_tokens;
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::block_table(std::int32_t g, seq_id id)
    const noexcept -> result<std::span<const block_id>> {
  if (status st = check_group("block_table", g); !st) return st;
  const auto h = primary().template checked<"block_table">(id);
  if (!h) return h.error();
  return std::span<const block_id>(tables_[ix(g)][*h].blocks);
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::block_tables(seq_id id,
                                                                      std::vector<std::span<const block_id>>& out)
    const -> status {
  const auto h = primary().template checked<"block_tables">(id);
  if (!h) return h.error();
  out.clear();
  for (const auto& table : tables_) out.emplace_back(table[*h].blocks);
  return ok_status();
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::block_hashes(seq_id id, std::vector<std::uint64_t>& out)
    const -> status {
  const auto h = primary().template checked<"block_hashes">(id);
  if (!h) return h.error();
  const extra_state& e = extra_[static_cast<std::size_t>(*h)];
  out.assign(e.hashes.begin(), e.hashes.end());
  return ok_status();
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::export_block_table(std::int32_t g,
                                                                            std::span<const seq_id> seqs,
                                                                            std::span<std::int32_t> table,
                                                                            std::int32_t row_stride,
                                                                            std::span<std::int32_t> seq_lens)
    const noexcept -> status {
  if (status st = check_group("export_block_table", g); !st) return st;
  return detail::export_block_table(tables_[ix(g)], seqs, table, row_stride, seq_lens);
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::csr_size(std::int32_t g, std::span<const seq_id> seqs)
    const noexcept -> result<std::int64_t> {
  if (status st = check_group("csr_size", g); !st) return st;
  return detail::csr_size(tables_[ix(g)], seqs);
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::export_csr(std::int32_t g, std::span<const seq_id> seqs,
                                                                    std::span<std::int32_t> indptr,
                                                                    std::span<std::int32_t> indices,
                                                                    std::span<std::int32_t> last_page_len)
    const noexcept -> status {
  if (status st = check_group("export_csr", g); !st) return st;
  return detail::export_csr(tables_[ix(g)], cfg_.block_size, seqs, indptr, indices, last_page_len);
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::export_csr(std::span<const seq_id>, std::span<std::int32_t>,
                                                                    std::span<std::int32_t>, std::span<std::int32_t>)
    const noexcept -> status {
  return per_group("export_csr");
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::slot_mapping_size() const noexcept -> std::int64_t {
  return ledger_.plan().num_append_tokens() * num_tables();
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::export_slot_mapping(std::int32_t g,
                                                                             std::span<std::int64_t> out)
    const noexcept -> status {
  if (status st = check_group("export_slot_mapping", g); !st) return st;
  const std::int64_t n = ledger_.plan().num_append_tokens();
  if (static_cast<std::int64_t>(out.size()) < n)
    return status{errc::buffer_too_small, "export_slot_mapping: buffer is shorter than the step's appended tokens", n};
  write_slots(g, out.first(static_cast<std::size_t>(n)));
  return ok_status();
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::export_slot_mapping(std::span<std::int64_t> out)
    const noexcept -> status {
  if (static_cast<std::int64_t>(out.size()) < slot_mapping_size())
    return status{errc::buffer_too_small, "export_slot_mapping: buffer is shorter than slot_mapping_size()",
                  slot_mapping_size()};
  const std::int64_t n = ledger_.plan().num_append_tokens();
  for (std::int32_t t = 0; t < num_tables(); ++t)
    write_slots(t, out.subspan(static_cast<std::size_t>(t * n), static_cast<std::size_t>(n)));
  return ok_status();
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE hybrid_kv_cache<K, A, E, S, W, T>::hybrid_kv_cache(cache_config cfg, std::span<const K> groups,
                                                                    std::vector<vllm_kind> vk, hybrid_options options,
                                                                    block_pool<A> pool, E e, S s, W w, tier_type t)
    : cfg_(cfg),
      options_(options),
      kinds_(groups.begin(), groups.end()),
      units_(groups.size(), 1),
      ubase_(groups.size(), 0),
      vkinds_(std::move(vk)),
      gstats_(groups.size()),
      blocks_(std::move(pool), std::move(e), std::move(s)),
      book_(std::move(w)),
      tier_(std::move(t)) {
  options_.units = {};
  std::int32_t extra_tables = 0;
  for (std::size_t i = 0; i < options.units.size(); ++i) {
    units_[i] = options.units[i];
    ubase_[i] = extra_tables;
    extra_tables += units_[i] - 1;
    max_units_ = std::max(max_units_, units_[i]);
  }
  tables_.resize(groups.size() + static_cast<std::size_t>(extra_tables));
  if (multi()) {
    comp_.assign(static_cast<std::size_t>(cfg.num_blocks) * static_cast<std::size_t>(max_units_ - 1), null_block);
    lead_of_.assign(static_cast<std::size_t>(cfg.num_blocks), -1);
    attached_.assign(static_cast<std::size_t>(cfg.num_blocks), 0);
  }
  const pool_geometry g{cfg.num_blocks, cfg.block_size, cfg.reserved_blocks};
  blocks_.reset(g);
  book_.reset(g, cfg.num_host_blocks, /*host_reserved=*/1);  // host block 0 is never used: null stays null
  ledger_.reset(cfg.num_blocks);
  owner_.assign(static_cast<std::size_t>(cfg.num_blocks), 0);
  nulls_.resize(groups.size());
  if constexpr (tier_type::enabled) {
    if (cfg.host_tier.write == tier_write::back) blocks_.log_evictions();
    tier_.name_blocks([](std::uint64_t key, std::int32_t group) noexcept {
      return kv_block_name{key ^ group_mix(group), group};  // group_key undone: the events' (hash, group)
    });
  }
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::write_slots(std::int32_t g, std::span<std::int64_t> out)
    const noexcept -> void {
  (void)ledger_.export_slot_mapping(
      out, cfg_.block_size, [this, g](std::int32_t h) { return tables_[ix(g)][h].blocks.data(); }, g);
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::held_blocks(std::int32_t h) const noexcept -> std::int64_t {
  std::int64_t n = 0;
  for (const table_type& t : tables_)
    for (const block_id b : t[h].blocks) n += b != null_block ? 1 : 0;
  return n;
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::per_group(const char* call) noexcept -> status {
  (void)call;
  return status{errc::unsupported, "hybrid_kv_cache: export tables and slot mappings per group (pass the group)"};
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::check_group(const char* call, std::int32_t g)
    const noexcept -> status {
  (void)call;
  if (g < 0 || g >= num_tables()) return status{errc::invalid_argument, "hybrid_kv_cache: no such table", g};
  return ok_status();
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::check_prompt(const char* call,
                                                                      std::span<const token_id> tokens)
    noexcept -> status {
  (void)call;
  if (tokens.empty() || tokens.size() > static_cast<std::size_t>(INT32_MAX))
    return status{errc::invalid_argument, "add_sequence: the prompt must have 1 to 2^31-1 tokens",
                  static_cast<std::int64_t>(tokens.size())};
  return ok_status();
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::exceeds_table_limit(std::int64_t blocks)
    const noexcept -> bool {
  return cfg_.max_blocks_per_seq > 0 && blocks > cfg_.max_blocks_per_seq;
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::generation() const noexcept -> std::uint64_t {
  if constexpr (caching) {
    return blocks_.sharing().generation();
  } else {
    return 0;
  }
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::insert(seq_id id) -> std::int32_t {
  std::int32_t h = -1;
  for (table_type& t : tables_) h = t.insert(id);
  if (extra_.size() <= static_cast<std::size_t>(h)) extra_.resize(static_cast<std::size_t>(h) + 1);
  extra_state& e = extra_[static_cast<std::size_t>(h)];
  e.committed.assign(static_cast<std::size_t>(num_groups()), 0);
  e.hashes.clear();
  e.content = false;
  e.step_base = 0;
  return h;
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::count_up(std::int32_t g, block_id b) noexcept -> void {
  owner_[static_cast<std::size_t>(b)] = static_cast<std::uint8_t>(g);
  gstats_[static_cast<std::size_t>(g)].blocks += multi() ? units_[static_cast<std::size_t>(g)] : 1;
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::take(std::int32_t g, std::span<block_id> out)
    noexcept -> void {
  if (multi()) {
    for (block_id& b : out) take_multi(g, b);
    return;
  }
  blocks_.take(out);
  for (const block_id b : out) count_up(g, b);
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::touch(std::int32_t g, block_id b) noexcept -> void {
  if (multi()) touch_units(b);
  if (blocks_.refcount(b) == 0) count_up(g, b);
  if (blocks_.touch(b)) ledger_.unpark();
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::release(block_id b, retention_hint hint) -> void {
  if (multi()) {
    release_units(b, hint);
    return;
  }
  if (blocks_.refcount(b) == 1) --gstats_[owner_[static_cast<std::size_t>(b)]].blocks;
  drop(b, hint);
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::drop(block_id b, retention_hint hint) -> void {
  blocks_.release(b, hint, [this](block_id x, retention_hint xh) { return ledger_.park(x, xh); });
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
auto hybrid_kv_cache<K, A, E, S, W, T>::release_units(block_id b, retention_hint hint) -> void {
  if (lead_of_[static_cast<std::size_t>(b)] >= 0) return;  // a companion goes with its lead
  const bool last = blocks_.refcount(b) == 1;
  if (last) gstats_[owner_[static_cast<std::size_t>(b)]].blocks -= units_[owner_[static_cast<std::size_t>(b)]];
  drop(b, hint);
  // A lead that became free or evictable keeps its companions (a later hit needs them) until it is handed out;
  // one parked until the next step (unreferenced and busy) is not available yet.
  if (last) {
    idle_ += attached_[static_cast<std::size_t>(b)];
    if (!ledger_.busy(b)) spare_ += attached_[static_cast<std::size_t>(b)];
  }
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
auto hybrid_kv_cache<K, A, E, S, W, T>::touch_units(block_id b) noexcept -> void {
  if (attached_[static_cast<std::size_t>(b)] > 0 && blocks_.refcount(b) == 0) {
    idle_ -= attached_[static_cast<std::size_t>(b)];  // a hit on an unreferenced lead takes its companions too
    if (!ledger_.busy(b)) spare_ -= attached_[static_cast<std::size_t>(b)];  // (busy: parked, not counted)
  }
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
auto hybrid_kv_cache<K, A, E, S, W, T>::detach(block_id b) noexcept -> void {
  const std::int32_t n = attached_[static_cast<std::size_t>(b)];
  if (n == 0) return;
  spare_ -= n;
  idle_ -= n;
  attached_[static_cast<std::size_t>(b)] = 0;
  for (std::int32_t u = 1; u <= n; ++u) {
    const block_id c = companion(b, u);
    companion(b, u) = null_block;
    lead_of_[static_cast<std::size_t>(c)] = -1;
    drop(c, retention_hint{});  // never cached, never busy (its lead was free): back to the free blocks
  }
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
auto hybrid_kv_cache<K, A, E, S, W, T>::take_multi(std::int32_t g, block_id& b) noexcept -> void {
  blocks_.take(std::span<block_id>(&b, 1));
  detach(b);
  if (g < 0) return;
  count_up(g, b);
  const std::int32_t u = units_[static_cast<std::size_t>(g)];
  for (std::int32_t k = 1; k < u; ++k) {
    block_id c = no_block;
    blocks_.take(std::span<block_id>(&c, 1));
    detach(c);
    companion(b, k) = c;
    lead_of_[static_cast<std::size_t>(c)] = b;
  }
  attached_[static_cast<std::size_t>(b)] = static_cast<std::uint8_t>(u - 1);
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::note_allocation() noexcept -> void {
  peak_used_ = std::max(peak_used_, used_blocks());
  for (group_stats& s : gstats_) s.peak_blocks = std::max(s.peak_blocks, s.blocks);
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::group_key(std::uint64_t h, std::int32_t g)
    noexcept -> std::uint64_t {
  // The chained hash apart per group by a constant of its own (group 0's is 0: its key is the hash itself, as its
  // extra key is the request's). Keys only need to differ: the index mixes them itself (id_map::home), and every
  // entry found is verified against its tokens and group extra key.
  return h ^ group_mix(g);
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::group_extra(std::uint64_t extra, std::int32_t g)
    noexcept -> std::uint64_t {
  return g == 0 ? extra : splitmix64(extra + std::uint64_t{0xA0761D6478BD642FULL} * static_cast<std::uint64_t>(g));
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::chain_hash(std::span<const std::uint64_t> hashes,
                                                                    std::size_t i, std::uint64_t extra,
                                                                    std::span<const token_id> block)
    noexcept -> std::uint64_t {
  return xxh3_hasher{}(i == 0 ? splitmix64(extra) : hashes[i - 1], block);
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::hash_blocks(std::span<const token_id> tokens,
                                                                     std::uint64_t extra,
                                                                     std::vector<std::uint64_t>& hashes) const -> void {
  if constexpr (caching) {
    const std::size_t bs = static_cast<std::size_t>(cfg_.block_size);
    const std::size_t full = tokens.size() / bs;
    const std::size_t from = std::min(hashes.size(), full);
    hashes.resize(full);  // written in place (no push_back call per block)
    for (std::size_t i = from; i < full; ++i)
      hashes[i] = chain_hash(detail::span_of(hashes), i, extra, tokens.subspan(i * bs, bs));
  } else {
    (void)tokens;
    (void)extra;
    hashes.clear();
  }
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::find_hit(std::span<const token_id> tokens, std::uint64_t extra,
                                                                  std::span<const std::uint64_t> hashes,
                                                                  std::vector<block_id>& lists, std::int64_t& need,
                                                                  std::int32_t n) -> std::int32_t {
  const std::int32_t bs = cfg_.block_size;
  const std::int64_t total = blocks_for_tokens(n, bs);
  lists.clear();
  std::int32_t len = 0;
  if constexpr (caching) {
    const std::int64_t max_tokens = std::min<std::int64_t>(n - 1, static_cast<std::int64_t>(hashes.size()) * bs);
    const auto m = static_cast<std::size_t>(max_tokens / bs);
    const auto G = static_cast<std::size_t>(num_groups());
    const S& share = blocks_.sharing();
    if (G == 1 && kinds_[0].skipped_tokens(max_tokens) == 0) {
      // One group that skips nothing up to the cap (full attention, or a window or chunk longer than the
      // prompt): under both conventions its hit is the run of cached blocks from block 0. One pass, as
      // paged_kv_cache's walk: each block looked up once up to the first miss, its hit list and need at once.
      const auto root = share.first_cursor(group_extra(extra, 0));
      const std::int64_t u0 = units_[0];
      need = total * u0;
      lists.resize(m);  // written in place, cut to the hit after (no push_back call per block)
      std::size_t i = 0;
      for (; i < m; ++i) {
        auto c = root;
        const block_id b = share.lookup(c, group_key(hashes[i], 0),
                                        tokens.subspan(i * static_cast<std::size_t>(bs), static_cast<std::size_t>(bs)));
        if (b == no_block) break;
        lists[i] = b;
        need -= blocks_.consumes_capacity(b) ? 0 : u0;
      }
      if constexpr (tier_type::enabled) {  // then the blocks the host tier can load (new blocks)
        device_hit_ = static_cast<std::int32_t>(i);
        for (; i < m && tier_.ready(group_key(hashes[i], 0)); ++i) lists[i] = tier_cell;
      }
      lists.resize(i);
      nulls_[0] = 0;
      return static_cast<std::int32_t>(i);
    }
    bool unchanged = false;  // every cell the last lookup read answers as it did: its result stands
    if constexpr (keeps_lookups && !tier_type::enabled) {  // a tier's cells change with it: looked up each time
      unchanged = keep_lookup(tokens, extra, hashes.first(m), max_tokens);
    } else {
      memo_.assign(G * m, lookup_pending);
    }
    // Group g's root cursor, made once per run of lookups in one group (the searches ask group by group).
    std::int32_t root_group = 0;
    auto root = share.first_cursor(group_extra(extra, 0));
    const auto cached_block = [&](std::int32_t g, std::int64_t i) -> block_id {
      const std::size_t cell = static_cast<std::size_t>(i) * G + static_cast<std::size_t>(g);
      block_id& slot = memo_[cell];
      if (slot == lookup_pending) {
        if (g != root_group) {
          root = share.first_cursor(group_extra(extra, g));
          root_group = g;
        }
        auto c = root;
        const auto block = tokens.subspan(static_cast<std::size_t>(i) * static_cast<std::size_t>(bs),
                                          static_cast<std::size_t>(bs));
        slot = share.lookup(c, group_key(hashes[static_cast<std::size_t>(i)], g), block);
        if constexpr (keeps_lookups) {
          if (memo_stage_ == 2) {  // a prompt looked up again: its cells are kept for the next lookup
            if (slot != no_block) memo_stamp_[cell] = share.first_holder_stamp(slot);
            memo_cells_.push_back(static_cast<std::int32_t>(cell));
            if (static_cast<std::size_t>(i) >= memo_end_) remember_blocks(tokens, hashes, static_cast<std::size_t>(i) + 1);
          }
        }
        if constexpr (tier_type::enabled) {  // not on the device: the host tier may load it
          if (slot == no_block && tier_.ready(group_key(hashes[static_cast<std::size_t>(i)], g))) slot = tier_cell;
        }
      }
      return slot;
    };
    if (unchanged) {
      // The agreement is a function of the block size, the cap and the answers of the cells it reads: the same.
      len = memo_len_;
      lists.assign(memo_lists_.begin(), memo_lists_.end());
      std::copy(memo_nulls_.begin(), memo_nulls_.end(), nulls_.begin());
    } else {
      // The conventions' agreement over the cells `cached(g, i)` says are served (vLLM's writes nulls_).
      const auto agree = [&](const auto& cached) -> std::int64_t {
        if (options_.conventions == hybrid_conventions::vllm)
          return vllm_agreed_hit(vkinds_, bs, max_tokens, cached, nulls_, vscratch_);
        std::fill(nulls_.begin(), nulls_.end(), 0);
        return agreed_hit_tokens(
            num_groups(), bs, max_tokens,
            [this](std::int32_t g, std::int64_t t) noexcept { return kinds_[static_cast<std::size_t>(g)].skipped_tokens(t); },
            cached, hscratch_);
      };
      const std::int64_t hit = agree([&](std::int32_t g, std::int64_t i) { return cached_block(g, i) != no_block; });
      // The entries the admission skips (those wholly before the window of the hit's first computed token) are the
      // null block whatever the lookup found there: vLLM's lookup for a window of 1 token returns the last cached
      // block, which allocate_slots then skips (not touched, not counted, left in the free queue).
      for (std::int32_t g = 0; g < num_groups(); ++g)
        nulls_[ix(g)] = std::max(nulls_[ix(g)], static_cast<std::int32_t>(
                                                    kinds_[static_cast<std::size_t>(g)].skipped_tokens(hit) / bs));
      len = static_cast<std::int32_t>(hit / bs);
      lists.resize(G * static_cast<std::size_t>(len));
      for (std::int32_t g = 0; g < num_groups(); ++g)
        for (std::int32_t i = 0; i < len; ++i) {
          // The memo read here as well as in cached_block: 3% fewer admission instructions than the call alone.
          const block_id known = memo_[static_cast<std::size_t>(i) * G + static_cast<std::size_t>(g)];
          const block_id b = i < nulls_[ix(g)] ? null_block : known != lookup_pending ? known : cached_block(g, i);
          lists[static_cast<std::size_t>(g) * static_cast<std::size_t>(len) + static_cast<std::size_t>(i)] = b;
        }
      if constexpr (tier_type::enabled) {
        // What the device alone would have served (the agreement over its blocks only): the hit's tokens past it
        // are the tier's (prefix_match::host_blocks). Asked only when the hit loads something; nulls_ is not read
        // after this.
        device_hit_ = len;
        if (std::find(lists.begin(), lists.end(), tier_cell) != lists.end()) {
          const std::int64_t alone =
              agree([&](std::int32_t g, std::int64_t i) { return cached_block(g, i) > null_block; });
          // A hit that loads has a host part (the scheduler waits for loads where host_blocks > 0): a loaded entry is
          // one the device cannot serve, so the device's own agreement stops before it.
          device_hit_ = std::min(len - 1, static_cast<std::int32_t>(alone / bs));
        }
      }
      if constexpr (keeps_lookups) {
        if (memo_stage_ == 2) {  // the result of a prompt looked up again, for its next lookup
          memo_len_ = len;
          memo_lists_.assign(lists.begin(), lists.end());
          memo_nulls_.assign(nulls_.begin(), nulls_.end());
          memo_max_tokens_ = max_tokens;
        }
      }
    }
  } else {
    (void)tokens;
    (void)extra;
    (void)hashes;
  }
  need = admission_need(total, len, lists);
  return len;
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
auto hybrid_kv_cache<K, A, E, S, W, T>::keep_lookup(std::span<const token_id> tokens, std::uint64_t extra,
                                                 std::span<const std::uint64_t> hashes, std::int64_t max_tokens)
    -> bool {
  if constexpr (keeps_lookups) {
    const S& share = blocks_.sharing();
    const std::size_t m = hashes.size();
    const auto bs = static_cast<std::size_t>(cfg_.block_size);
    const auto G = static_cast<std::size_t>(num_groups());
    const auto prompt = tokens.first(m * bs);
    bool unchanged = false;
    // Only the blocks a cell was looked up in matter (the lookup read no other): [0, memo_end_).
    const auto end = static_cast<std::ptrdiff_t>(memo_end_);
    const bool same_hashes = memo_stage_ != 0 && memo_m_ == m && memo_extra_ == extra &&
                             std::equal(hashes.begin(), hashes.begin() + end, memo_hashes_.begin());
    if (same_hashes && memo_stage_ == 2 &&
        std::equal(prompt.begin(), prompt.begin() + end * static_cast<std::ptrdiff_t>(bs), memo_tokens_.begin())) {
      // The same prompt: a cell's answer depends only on its block's hash and tokens, the extra key and the
      // policy's state. A kept hit stands while its block's stamp is unchanged, a kept miss while its key was not
      // committed since; a cell that may have changed is looked up again now. The cost is in the cells looked up
      // (about the hit's length), not in the prompt's length.
      const std::uint64_t committed = share.commits() - memo_commits_;
      // Every commit since is in the log (it records each key committed, capped): a miss stands unless its key is.
      const bool logged = commit_log_size_ <= commit_log_capacity && committed <= commit_log_size_;
      const auto log_end = commit_log_.begin() + static_cast<std::ptrdiff_t>(std::min(commit_log_size_, commit_log_capacity));
      unchanged = memo_max_tokens_ == max_tokens;
      for (const std::int32_t cell : memo_cells_) {
        const auto u = static_cast<std::size_t>(cell);
        const block_id found = memo_[u];
        const auto g = static_cast<std::int32_t>(u % G);
        const std::size_t i = u / G;
        if (found == no_block) {
          if (committed == 0) continue;
          if (logged && std::find(commit_log_.begin(), log_end, group_key(hashes[i], g)) == log_end) continue;
        } else if (share.first_holder_stamp(found) == memo_stamp_[u]) {
          continue;
        }
        auto c = share.first_cursor(group_extra(extra, g));
        const block_id now = share.lookup(c, group_key(hashes[i], g), prompt.subspan(i * bs, bs));
        unchanged = unchanged && now == found;
        memo_[u] = now;
        if (now != no_block) memo_stamp_[u] = share.first_holder_stamp(now);
      }
    } else {
      // Nothing is kept until the memo is made again (an allocation below may throw: the next lookup is then fresh).
      const std::uint8_t stage = memo_stage_;
      memo_stage_ = 0;
      memo_max_tokens_ = -1;
      // Back to every cell pending: the listed ones (stage 2), or the last prompt's (stages 0 and 1 list none).
      if (stage == 2) {
        for (const std::int32_t cell : memo_cells_) memo_[static_cast<std::size_t>(cell)] = lookup_pending;
      } else {
        std::fill(memo_.begin(), memo_.begin() + static_cast<std::ptrdiff_t>(G * memo_m_), lookup_pending);
      }
      memo_cells_.clear();
      if (memo_.size() < G * m) {
        memo_.resize(G * m, lookup_pending);
        memo_stamp_.resize(G * m);
      }
      memo_cells_.reserve(G * m);  // the lookup lists its cells without allocating
      if (same_hashes) {  // looked up again (or its tokens differ): keep its tokens, re-check from the next lookup
        memo_tokens_.assign(prompt.begin(), prompt.end());
        memo_stage_ = 2;
        memo_end_ = 0;
      } else {  // looked up once: its hashes only, no cell listed (all of [0, m) compared next time)
        memo_hashes_.assign(hashes.begin(), hashes.end());
        memo_m_ = m;
        memo_extra_ = extra;
        memo_stage_ = 1;
        memo_end_ = m;
      }
    }
    memo_commits_ = share.commits();
    commit_log_size_ = 0;
    if (!unchanged) memo_max_tokens_ = -1;  // the result is made again (and kept) by this lookup
    return unchanged;
  } else {
    (void)tokens;
    (void)extra;
    (void)hashes;
    (void)max_tokens;
    return false;
  }
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
auto hybrid_kv_cache<K, A, E, S, W, T>::remember_blocks(std::span<const token_id> tokens,
                                                     std::span<const std::uint64_t> hashes, std::size_t end) -> void {
  const auto bs = static_cast<std::size_t>(cfg_.block_size);
  std::copy(hashes.begin() + static_cast<std::ptrdiff_t>(memo_end_), hashes.begin() + static_cast<std::ptrdiff_t>(end),
            memo_hashes_.begin() + static_cast<std::ptrdiff_t>(memo_end_));
  std::copy(tokens.begin() + static_cast<std::ptrdiff_t>(memo_end_ * bs), tokens.begin() + static_cast<std::ptrdiff_t>(end * bs),
            memo_tokens_.begin() + static_cast<std::ptrdiff_t>(memo_end_ * bs));
  memo_end_ = end;
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::admission_need(std::int64_t total, std::int32_t len,
                                                                        std::span<const block_id> lists)
    const noexcept -> std::int64_t {
  std::int64_t need = (total - len) * num_tables();
  const auto n = static_cast<std::size_t>(len);
  for (std::size_t i = 0; i < lists.size(); ++i) {  // group-major, len entries each; a hit takes its companions too
    if constexpr (tier_type::enabled) {
      if (lists[i] == tier_cell) {  // loaded into a new block (a cache with a tier has one unit per group)
        ++need;
        continue;
      }
    }
    if (lists[i] != null_block && blocks_.consumes_capacity(lists[i])) need += multi() ? units_[i / n] : 1;
  }
  return need;
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::add_impl(seq_id id, std::int32_t n,
                                                                  std::span<const token_id> tokens,
                                                                  sequence_options options, prefix_match* out,
                                                                  const prefix_hit* given,
                                                                  std::span<const std::uint64_t> known) -> status {
  if (primary().contains(id)) return status{errc::duplicate_sequence, "add_sequence: sequence id is already live"};
  if (external_.find(id) != nullptr)
    return status{errc::duplicate_sequence, "add_sequence: the id's external read is not reported yet (complete_external)"};
  if (options.external_tokens < 0 || (options.external_tokens > 0 && tokens.empty()))
    return status{errc::invalid_argument,
                  "add_sequence: external_tokens must be >= 0, and needs the prompt's token ids", options.external_tokens};
  const std::int64_t total = blocks_for_tokens(n, cfg_.block_size);
  if (exceeds_table_limit(total))
    return status{errc::invalid_argument, "add_sequence: prompt needs more than max_blocks_per_seq blocks", total};
  const bool content = caching && !tokens.empty();
  std::int64_t need = 0;
  std::int32_t len = 0;
  hashes_.assign(known.begin(), known.end());
  if (content) hash_blocks(tokens, options.extra_key, hashes_);
  if (given != nullptr && given->match.tokens <= n - 1 &&
      given->blocks.size() == static_cast<std::size_t>(given->match.blocks + given->match.host_blocks) * kinds_.size()) {
    len = given->match.blocks + given->match.host_blocks;  // the lookup is done: its lists, its need for n tokens
    lists_.assign(given->blocks.begin(), given->blocks.end());
    need = admission_need(total, len, lists_);
  } else if (content) {
    len = find_hit(tokens, options.extra_key, detail::span_of(hashes_), lists_, need, n);
  } else {
    lists_.clear();
    need = total * num_tables();
  }
  // The host tier's loads (tier_cell entries); the first d entries the device alone would serve, the rest of the
  // hit is the tier's (a consumed match_prefix says it in its blocks).
  std::int32_t d = len;
  bool loads = false;
  if constexpr (tier_type::enabled) {
    loads = std::find(lists_.begin(), lists_.end(), tier_cell) != lists_.end();
    d = !loads ? len : given != nullptr ? given->match.blocks : device_hit_;
  }
  // KV from outside: the full blocks after the agreed hit up to options.external_tokens, below the last token (none
  // when the host tier loads part of the hit: the sequence then takes what its own cache has). In group g the
  // entries wholly before the window of the first token computed after them are null: the external ones before
  // ext_first[g] take no block, and the hit's before ext_skip[g] are not taken (the window release would never reach
  // them past the null entries).
  std::int32_t ext = 0;
  if (options.external_tokens > 0 && content && !loads) {
    const std::int64_t cap = std::min<std::int64_t>(options.external_tokens, n - 1) / cfg_.block_size;
    ext = static_cast<std::int32_t>(std::max<std::int64_t>(0, cap - len));
  }
  const std::int32_t end = len + ext;  // the entries the admission serves (hit and external)
  std::array<std::int32_t, max_groups> ext_first{}, ext_skip{};
  if (ext > 0) {
    for (std::int32_t g = 0; g < num_groups(); ++g) {
      const auto skipped = static_cast<std::int32_t>(
          kinds_[ix(g)].skipped_tokens(std::int64_t{end} * cfg_.block_size) / cfg_.block_size);
      ext_first[ix(g)] = std::clamp(skipped, len, end);
      ext_skip[ix(g)] = std::clamp(skipped, 0, len);
      need -= std::int64_t{ext_first[ix(g)] - len} * units_[ix(g)];  // null entries take no block
      for (std::int32_t i = 0; i < ext_skip[ix(g)]; ++i) {            // nor hits not taken
        const block_id b = lists_[static_cast<std::size_t>(g) * static_cast<std::size_t>(len) + static_cast<std::size_t>(i)];
        if (b != null_block && b != tier_cell && blocks_.consumes_capacity(b)) need -= multi() ? units_[ix(g)] : 1;
      }
    }
  }
  if (need > available_blocks())
    return status{errc::out_of_blocks, "add_sequence: not enough free blocks for the prompt", need};
  std::vector<token_id> ext_tokens;  // allocated before anything changes
  if (ext > 0) {
    external_.reserve_one();
    ext_tokens.assign(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(end) * cfg_.block_size);
  }
  // With async transfers a sequence with loads takes only its hit's entries for now: it waits for them; one with
  // external KV takes its hit's and the external entries and waits for the read.
  bool waits = ext > 0;
  if constexpr (tier_type::enabled) waits = waits || (loads && tier_.async());
  const std::int64_t rows = waits ? end : total;
  const std::int32_t hit_tokens = end * cfg_.block_size;  // served: not computed
  const std::int32_t held_tokens = waits ? hit_tokens : n;

  const std::int32_t h = insert(id);
  // Hits first in every group (they leave the free queue before anything is popped), then new blocks group by
  // group (vLLM's order: an earlier group's allocation cannot evict a later group's hits); the blocks the host tier
  // loads are new blocks, taken first in their group.
  for (std::int32_t g = 0; g < num_groups(); ++g) {
    auto& t = tables_[ix(g)][h].blocks;
    t.resize(static_cast<std::size_t>(rows));
    for (std::int32_t i = 0; i < len; ++i) {
      const block_id b = i < ext_skip[ix(g)] ? null_block
                         : lists_[static_cast<std::size_t>(g) * static_cast<std::size_t>(len) + static_cast<std::size_t>(i)];
      t[static_cast<std::size_t>(i)] = b;
      if (b == null_block || b == tier_cell) continue;
      touch(g, b);
      ++gstats_[ix(g)].hit_blocks;
    }
  }
  for (std::int32_t g = 0; g < num_groups(); ++g) {
    auto& t = tables_[ix(g)][h].blocks;
    if (loads) {
      for (std::int32_t i = 0; i < len; ++i)
        if (t[static_cast<std::size_t>(i)] == tier_cell) take(g, std::span<block_id>(t).subspan(static_cast<std::size_t>(i), 1));
    }
    const std::int32_t first_new = ext > 0 ? ext_first[ix(g)] : len;
    std::fill(t.begin() + len, t.begin() + first_new, null_block);
    take(g, std::span<block_id>(t).subspan(static_cast<std::size_t>(first_new)));
    tables_[ix(g)][h].num_tokens = held_tokens;
    gstats_[ix(g)].table_entries += rows;
    mirror(h, g, 0);
  }
  auto& s = primary()[h];
  s.priority = options.priority;
  s.extra_key = options.extra_key;
  extra_state& e = extra_[static_cast<std::size_t>(h)];
  e.content = content;
  // The tier's loads are pinned before write-back stores what the device evicted (which may evict in the tier), and
  // those stores are planned before the new blocks are committed (each store takes its block's group and priority).
  if constexpr (tier_type::enabled) {
    if (content) plan_loads(h, id, len, waits, tokens, detail::span_of(hashes_), options.extra_key);
  }
  tier_evicted();
  if (content) {
    e.hashes.swap(hashes_);
    // The hit blocks are cached (or the null block): commit from the first new block on, and, unless the
    // sequence waits for them (committed as they arrive), the blocks the host tier loads among the hits
    // (commit_full skips the cached and null entries).
    std::fill(e.committed.begin(), e.committed.end(), loads && !waits ? 0 : len);
    if (waits) {
      // The rest comes with its append, once the loads (or the external KV: committed then) are in.
      e.hashes.resize(static_cast<std::size_t>(end));
      s.partial.clear();
    } else {
      commit_full(h, 0, tokens);
      const std::size_t tail = tokens.size() % static_cast<std::size_t>(cfg_.block_size);
      s.partial.assign(tokens.end() - static_cast<std::ptrdiff_t>(tail), tokens.end());
    }
    counts_.prefix_query_tokens += n;
    counts_.prefix_hit_tokens += d * cfg_.block_size;
    counts_.prefix_hit_tokens_host += (len - d) * cfg_.block_size;
  }
  if (ext > 0) external_.add(id, external_range{len, ext}, std::move(ext_tokens));
  counts_.tokens += held_tokens;
  e.step_base = hit_tokens;
  if (!waits) s.append_step = record_append(h, id, hit_tokens, n - hit_tokens);
  note_allocation();
  if (out != nullptr) *out = prefix_match{d, hit_tokens, need, len - d, ext};
  return ok_status();
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::commit_full(std::int32_t h, std::size_t from,
                                                                     std::span<const token_id> tokens) -> void {
  if constexpr (caching) {
    extra_state& e = extra_[static_cast<std::size_t>(h)];
    const auto bs = static_cast<std::size_t>(cfg_.block_size);
    const std::size_t full = e.hashes.size();
    const S& share = blocks_.sharing();
    for (std::int32_t g = 0; g < num_groups(); ++g) {
      auto& t = tables_[ix(g)][h].blocks;
      const std::size_t start = std::max<std::size_t>(from, static_cast<std::size_t>(e.committed[ix(g)]));
      for (std::size_t i = start; i < full; ++i) {
        const block_id b = t[i];
        if (b == null_block || share.is_cached(b)) continue;
        commit_entry(h, g, i, b, detail::span_of(e.hashes), tokens.subspan((i - from) * bs, bs));
      }
      e.committed[ix(g)] = static_cast<std::int32_t>(std::max<std::size_t>(full, static_cast<std::size_t>(e.committed[ix(g)])));
    }
  } else {
    (void)h;
    (void)from;
    (void)tokens;
  }
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::commit_entry(std::int32_t h, std::int32_t g, std::size_t i,
                                                                       block_id b,
                                                                       std::span<const std::uint64_t> hashes,
                                                                       std::span<const token_id> block) -> void {
  if constexpr (caching) {
    S& share = blocks_.sharing();
    auto c = share.first_cursor(group_extra(primary()[h].extra_key, g));
    const std::uint64_t key = group_key(hashes[i], g);
    share.commit(b, c, key, block);
    if (blocks_.events() != nullptr)
      blocks_.announce_stored(b, hashes[i], i > 0, i > 0 ? hashes[i - 1] : 0, g, block);
    if constexpr (tier_type::enabled) tier_.committed(b, primary()[h].priority, g);
    if constexpr (keeps_lookups) {
      if (memo_stage_ == 2) {  // a prompt's cells are kept: its misses stand unless their key is committed
        if (commit_log_size_ < commit_log_capacity) {
          commit_log_[commit_log_size_++] = key;
        } else {
          commit_log_size_ = commit_log_capacity + 1;
        }
      }
    }
  } else {
    (void)h, (void)g, (void)i, (void)b, (void)hashes, (void)block;
  }
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::plan_loads(std::int32_t h, seq_id id, std::int32_t len,
                                                                     bool waits, std::span<const token_id> tokens,
                                                                     std::span<const std::uint64_t> hashes,
                                                                     std::uint64_t extra) -> void {
  if constexpr (tier_type::enabled) {
    tier_blocks_.clear();
    tier_cells_.clear();
    const auto n = static_cast<std::size_t>(len);
    // The blocks the lookup can take below the cap that keeps the last token computed.
    const std::size_t m = std::min((tokens.size() - 1) / static_cast<std::size_t>(cfg_.block_size), hashes.size());
    std::int32_t slot = 0;
    for (std::int32_t g = 0; g < num_groups(); ++g) {
      std::vector<std::uint64_t>& keys = tier_.keys();
      keys.clear();
      tier_dst_.clear();
      const auto& t = tables_[ix(g)][h].blocks;
      for (std::size_t i = 0; i < n; ++i) {
        if (lists_[static_cast<std::size_t>(g) * n + i] != tier_cell) continue;
        keys.push_back(group_key(hashes[i], g));
        tier_dst_.push_back(t[i]);
        tier_cells_.push_back(static_cast<std::int32_t>(i) * max_groups + g);
      }
      // The block after the hit is looked up too (a miss, as the walk past the hit of a lookup of one group).
      if (n < m) keys.push_back(group_key(hashes[n], g));
      tier_.load(detail::span_of(tier_dst_), ledger_, counts_, g, slot);
      tier_blocks_.insert(tier_blocks_.end(), tier_.loaded().begin(), tier_.loaded().end());
      slot += static_cast<std::int32_t>(tier_dst_.size());
    }
    if (waits)
      tier_.wait_for_cells(id, detail::span_of(tier_blocks_), detail::span_of(tier_cells_),
                           tokens.first(n * static_cast<std::size_t>(cfg_.block_size)), hashes.first(n), extra,
                           ledger_.step());
  } else {
    (void)h, (void)id, (void)len, (void)waits, (void)tokens, (void)hashes, (void)extra;
  }
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::commit_loaded(const detail::pending_load& p) -> void {
  if constexpr (tier_type::enabled) {
    const std::int32_t h = *primary().template checked<"complete_tier_transfers">(p.id);
    const auto bs = static_cast<std::size_t>(cfg_.block_size);
    for (std::size_t j = 0; j < static_cast<std::size_t>(p.count); ++j) {
      if (p.done[j] != 1) continue;  // in flight or failed: never cached
      const std::int32_t g = p.cells[j] % max_groups;
      const auto i = static_cast<std::size_t>(p.cells[j] / max_groups);
      const block_id b = tables_[ix(g)][h].blocks[i];
      if (blocks_.is_cached(b)) continue;
      commit_entry(h, g, i, b, detail::span_of(p.hashes), std::span<const token_id>(p.tokens).subspan(i * bs, bs));
    }
  } else {
    (void)p;
  }
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::record_append(std::int32_t h, seq_id id, std::int32_t first,
                                                                       std::int32_t count) -> std::uint64_t {
  return ledger_.record_append(h, id, first, count);
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::grow(std::int32_t h, std::int32_t n,
                                                              std::span<const token_id> tokens) -> status {
  auto& s = primary()[h];
  const auto blocks = detail::blocks_after_growth(s.num_tokens, n, cfg_.block_size, cfg_.max_blocks_per_seq);
  if (!blocks) return blocks.error();
  const std::int64_t new_total = std::int64_t{s.num_tokens} + n, total_blocks = *blocks;
  extra_state& e = extra_[static_cast<std::size_t>(h)];
  const std::int32_t first = s.num_tokens;  // tokens before this append
  const bool pending = s.append_step == ledger_.step();
  // The window is that of the first token this step computes: tokens appended earlier in this step are not
  // computed yet and still read their own windows.
  const std::int64_t from = pending ? e.step_base : s.num_tokens;
  // The common decode step: the tokens fit every group's last block, which is ours alone and not cached, and no
  // window moves past a block. Nothing is taken or released (so no peak can rise).
  if (total_blocks == static_cast<std::int64_t>(s.blocks.size()) && s.num_tokens % cfg_.block_size != 0 &&
      in_place(h, from)) {
    for (table_type& t : tables_) t[h].num_tokens = static_cast<std::int32_t>(new_total);
    return finish_append(h, first, n, pending, tokens, false);
  }
  const retention_hint hint{s.priority};
  // What the window release would free, and what the tokens take.
  const bool vllm = options_.conventions == hybrid_conventions::vllm;
  if (vllm) release_window(h, from, hint);  // kept even if the allocation fails (vLLM's allocate_slots)
  std::int64_t gain = 0, need = 0;
  const bool writes_last = s.num_tokens % cfg_.block_size != 0;
  for (std::int32_t g = 0; g < num_groups(); ++g) {
    auto& t = tables_[ix(g)][h].blocks;
    const std::int64_t u = units_[ix(g)];
    if (!vllm) {  // what the window release would free
      for (std::size_t i = release_end(g, from, t.size()); i-- > 0 && t[i] != null_block;)
        gain += blocks_.refcount(t[i]) == 1 && !ledger_.busy(t[i]) ? u : 0;
    }
    need += std::max<std::int64_t>(total_blocks - static_cast<std::int64_t>(t.size()), 0) * u;
    need += writes_last && blocks_.refcount(t.back()) > 1 ? u : 0;
  }
  if (need > available_blocks() + gain)
    return status{errc::out_of_blocks, "append_tokens: not enough free blocks", need};
  if (!vllm) release_window(h, from, hint);
  for (std::int32_t g = 0; g < num_groups(); ++g) {
    auto& t = tables_[ix(g)][h].blocks;
    if (writes_last) {
      const block_id last = t.back();
      if (blocks_.refcount(last) > 1) {  // copy-on-write of a shared, partly filled last block
        block_id dst = no_block;
        take(g, std::span<block_id>(&dst, 1));
        plan_copy(g, last, dst);
        t.back() = dst;
        release(last, hint);
        ++counts_.cow_copies;
      } else if (blocks_.is_cached(last)) {  // ours alone but cached (a fork ended in it): it is about to change
        blocks_.evict(last);
      }
    }
    const std::size_t old = t.size();
    if (static_cast<std::int64_t>(old) < total_blocks) {
      t.resize(static_cast<std::size_t>(total_blocks));
      take(g, std::span<block_id>(t).subspan(old));
      gstats_[ix(g)].table_entries += total_blocks - static_cast<std::int64_t>(old);
    }
    tables_[ix(g)][h].num_tokens = static_cast<std::int32_t>(new_total);
    mirror(h, g, writes_last ? old - 1 : old);
  }
  tier_evicted();
  return finish_append(h, first, n, pending, tokens, true);
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::append_one_in_place(std::int32_t h, token_id token) -> bool {
  auto& s = primary()[h];
  const std::int32_t bs = cfg_.block_size;
  if (s.num_tokens % bs == 0 || s.num_tokens == INT32_MAX) return false;
  extra_state& e = extra_[static_cast<std::size_t>(h)];
  const bool pending = s.append_step == ledger_.step();
  if (!in_place(h, pending ? e.step_base : s.num_tokens)) return false;
  const std::int32_t first = s.num_tokens;
  for (table_type& t : tables_) ++t[h].num_tokens;
  if (!pending) e.step_base = first;
  s.append_step = record_append(h, s.id, first, 1);
  ++counts_.tokens;
  if (e.content) {
    s.partial.push_back(token);
    if (s.partial.size() == static_cast<std::size_t>(bs)) fill_block(h, static_cast<std::size_t>(first / bs));
  } else {
    s.partial.clear();
  }
  return true;
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::fill_block(std::int32_t h, std::size_t i) -> void {
  auto& s = primary()[h];
  extra_state& e = extra_[static_cast<std::size_t>(h)];
  if constexpr (caching) {
    // The hashes cover the full blocks before this one (admission and fork trim them to the full blocks).
    KVPAGER_ASSERT(e.hashes.size() == i || e.hashes.size() == i + 1,
                   "hybrid_kv_cache: block hashes out of step with a filling block");
    if (e.hashes.size() == i) e.hashes.push_back(chain_hash(detail::span_of(e.hashes), i, s.extra_key, s.partial));
    commit_full(h, i, s.partial);
  } else {
    (void)e;
    (void)i;
  }
  s.partial.clear();
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::in_place(std::int32_t h, std::int64_t from)
    const noexcept -> bool {
  for (std::int32_t g = 0; g < num_groups(); ++g) {
    const auto& t = tables_[ix(g)][h].blocks;
    const block_id last = t.back();
    if (blocks_.refcount(last) != 1 || blocks_.is_cached(last)) return false;
    const std::size_t k = release_end(g, from, t.size());
    if (k > 0 && t[k - 1] != null_block) return false;
  }
  return true;
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::finish_append(std::int32_t h, std::int32_t first,
                                                                       std::int32_t n, bool pending,
                                                                       std::span<const token_id> tokens, bool allocated)
    -> status {
  auto& s = primary()[h];
  extra_state& e = extra_[static_cast<std::size_t>(h)];
  if (!pending) e.step_base = first;
  s.append_step = record_append(h, s.id, first, n);
  counts_.tokens += n;
  if (e.content && !tokens.empty()) {
    extend_content(h, first, tokens);
  } else {
    e.content = false;  // token ids unknown from here: the later blocks are not cached
    s.partial.clear();
  }
  if (allocated) note_allocation();
  return ok_status();
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::release_end(std::int32_t g, std::int64_t from, std::size_t len)
    const noexcept -> std::size_t {
  const std::int64_t sk = kinds_[static_cast<std::size_t>(g)].skipped_tokens(from) / cfg_.block_size;
  return std::min(static_cast<std::size_t>(sk), len);
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::release_window(std::int32_t h, std::int64_t from,
                                                                        retention_hint hint) -> void {
  for (std::int32_t g = 0; g < num_groups(); ++g) {
    auto& t = tables_[ix(g)][h].blocks;
    for (std::size_t i = release_end(g, from, t.size()); i-- > 0 && t[i] != null_block;) {
      release(t[i], hint);
      t[i] = null_block;
      ++gstats_[ix(g)].skipped_blocks;
      for (std::int32_t u = 1; u < units_[ix(g)]; ++u) tables_[ix(unit_table(g, u))][h].blocks[i] = null_block;
    }
  }
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::extend_content(std::int32_t h, std::int32_t first,
                                                                        std::span<const token_id> tokens) -> void {
  auto& s = primary()[h];
  extra_state& e = extra_[static_cast<std::size_t>(h)];
  const auto bs = static_cast<std::size_t>(cfg_.block_size);
  if (s.partial.size() + tokens.size() < bs) {  // the common decode step: no block fills
    if (tokens.size() == 1) {
      s.partial.push_back(tokens[0]);
    } else {
      s.partial.insert(s.partial.end(), tokens.begin(), tokens.end());
    }
    return;
  }
  buffer_.assign(s.partial.begin(), s.partial.end());
  buffer_.insert(buffer_.end(), tokens.begin(), tokens.end());
  const std::size_t base = static_cast<std::size_t>(first) - s.partial.size();  // position of buffer_[0]
  const std::size_t from_block = base / bs;
  const std::size_t full = (static_cast<std::size_t>(first) + tokens.size()) / bs;
  const std::span<const token_id> buf(buffer_);
  for (std::size_t i = e.hashes.size(); i < full; ++i)
    e.hashes.push_back(chain_hash(detail::span_of(e.hashes), i, s.extra_key, buf.subspan((i - from_block) * bs, bs)));
  if (full > from_block) commit_full(h, from_block, buf);
  const std::size_t tail = (static_cast<std::size_t>(first) + tokens.size()) % bs;
  s.partial.assign(buffer_.end() - static_cast<std::ptrdiff_t>(tail), buffer_.end());
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::cancel_appends(std::int32_t h) -> void {
  ledger_.cancel_appends(
      h, num_tables(), [this, h](std::int32_t t) { return std::span<const block_id>(tables_[ix(t)][h].blocks); },
      cfg_.block_size, [this](block_id b) { return b != null_block && blocks_.refcount(lead_of(b)) > 1; },
      [this](block_id b) {
        if (b != null_block && blocks_.is_cached(b)) blocks_.drop_content(b);  // its content will never be written
      });
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
auto hybrid_kv_cache<K, A, E, S, W, T>::mirror_units(std::int32_t h, std::int32_t g, std::size_t from) -> void {
  const std::int32_t n = units_[ix(g)];
  const auto& lead = tables_[ix(g)][h];
  for (std::int32_t u = 1; u < n; ++u) {
    auto& t = tables_[ix(unit_table(g, u))][h];
    t.blocks.resize(lead.blocks.size());
    for (std::size_t i = from; i < lead.blocks.size(); ++i)
      t.blocks[i] = lead.blocks[i] == null_block ? null_block : companion(lead.blocks[i], u);
    t.num_tokens = lead.num_tokens;
  }
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
auto hybrid_kv_cache<K, A, E, S, W, T>::reattach(std::span<const seq_id> seqs) noexcept -> void {
  for (const seq_id id : seqs) {
    const std::int32_t h = *primary().template checked<"swap_in">(id, detail::residency::any);
    for (std::int32_t g = 0; g < num_groups(); ++g) {
      const std::int32_t n = units_[ix(g)];
      if (n == 1) continue;
      const auto& lead = tables_[ix(g)][h].blocks;
      for (std::size_t i = 0; i < lead.size(); ++i) {
        const block_id b = lead[i];
        if (b == null_block) continue;
        for (std::int32_t u = 1; u < n; ++u) {
          const block_id c = tables_[ix(unit_table(g, u))][h].blocks[i];
          companion(b, u) = c;
          lead_of_[static_cast<std::size_t>(c)] = b;
        }
        attached_[static_cast<std::size_t>(b)] = static_cast<std::uint8_t>(n - 1);
      }
    }
  }
}

template <group_kind K, block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto hybrid_kv_cache<K, A, E, S, W, T>::plan_copy(std::int32_t g, block_id src, block_id dst)
    -> void {
  ledger_.plan_copy(src, dst, g);
  for (std::int32_t u = 1; u < units_[ix(g)]; ++u)
    ledger_.plan_copy(companion(src, u), companion(dst, u), unit_table(g, u));
}

KVPAGER_NAMESPACE_END
