// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The plain value types of paged_kv_cache's interface: its configuration, its statistics, per-sequence options,
/// and what a prefix lookup found.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvpager/concepts/tier_policy.hpp"
#include "kvpager/core/checked_math.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/geometry.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/core/step_plan.hpp"
#include "kvpager/core/types.hpp"

KVPAGER_NAMESPACE_BEGIN

/// When a cache with a host tier copies prefix-cache blocks to it (cache_config::host_tier).
enum class tier_write : std::uint8_t {
  /// On commit: a block is stored at the begin_step after it was cached (its bytes are in place then), whether or not
  /// the device ever evicts it (vLLM's offloading connector, SGLang HiCache's write_through).
  through,
  /// On eviction: a block is stored in the step the device pool reuses it, before its new owner writes it (SGLang
  /// HiCache's write_back); blocks that never leave the device are never copied.
  back,
};

/// The host tier of a paged_kv_cache whose fifth policy is a tier policy (tier/lru_tier.hpp, tier/arc_tier.hpp):
/// its size and what it stores (docs/host_tier.md). Its host blocks follow the swap pool's in the executors' host
/// pool: tier block i is host block num_host_blocks + i in the step plan.
struct host_tier_options {
  std::int32_t num_blocks = 0;         ///< host blocks of the tier (> 0 with a tier policy, 0 without one)
  tier_write write = tier_write::through;
  std::int32_t store_threshold = 1;    ///< store only blocks looked up in the tier at least this often (1: all)
  std::int32_t max_tracker_size = 64000;  ///< keys whose lookups are counted (store_threshold >= 2)
  /// Store only blocks of sequences whose retention priority is at least this (the lowest int32: every block).
  std::int32_t min_priority = INT32_MIN;
  /// Inclusive: a loaded block keeps its host copy. Exclusive (false; with tier_write::back only): it leaves the tier.
  bool inclusive = true;
  /// Asynchronous transfers: loads and stores complete when the engine reports them
  /// (paged_kv_cache::complete_tier_transfers), each ok or failed, not at the next begin_step. A sequence admitted
  /// with host blocks to load then holds only its hit and waits (tier_load_state: loading) until they are in; a
  /// write-through store keeps its source block from being reused until it completes (docs/host_tier.md).
  bool async = false;
  /// With `async`: begin_steps a sequence waits for its loads before they count as failed (it is recomputed; the
  /// device blocks stay held until the engine reports them). >= 1: a load that never completes cannot hold a request.
  std::int32_t load_timeout_steps = 64;
};

/// An asynchronous host tier transfer the engine finished (paged_kv_cache::complete_tier_transfers): the step
/// plan's entry as it was planned (a load is a swap-in, a store a swap-out, into host blocks num_host_blocks + i),
/// and whether its bytes arrived.
struct tier_done {
  block_swap swap{};
  bool ok = true;
  friend bool operator==(const tier_done&, const tier_done&) = default;
};

/// Where a sequence stands with its host tier loads (paged_kv_cache::tier_load_state).
enum class tier_load_state : std::uint8_t {
  none,     ///< no load pending: the sequence runs as any other (its loaded blocks, if any, are in and cached)
  loading,  ///< admitted with host blocks to load, not all reported yet: it must not be computed (nor appended to)
  failed,   ///< a load failed or timed out: free the sequence and admit it again (its good prefix is cached)
};

/// The blocks of a sequence whose KV arrives from outside (sequence_options::external_tokens): table entries
/// [first, first + count) of its block table, tokens [first x block_size, (first + count) x block_size).
struct external_range {
  std::int32_t first = 0;
  std::int32_t count = 0;
  friend bool operator==(const external_range&, const external_range&) = default;
};

/// Run-time configuration of a paged_kv_cache.
/// The cache's configuration. Block size and pool size are the cache's; with the KV shape after them (KV heads, head
/// dim, dtype, which the cache itself does not use) they are the pool's whole geometry, geometry(), the one value
/// the kernels' views, layouts and checks derive from. Positional initialization keeps its order:
/// {block_size, num_blocks, reserved_blocks, max_blocks_per_seq, num_host_blocks}.
struct cache_config {
  std::int32_t block_size = default_block_size;  ///< tokens per block; a power of two
  std::int32_t num_blocks = 0;        ///< blocks in the pool, including reserved ones
  std::int32_t reserved_blocks = 0;   ///< blocks [0, reserved) never handed out (1 = vLLM's null block)
  std::int32_t max_blocks_per_seq = 0;  ///< longest block table allowed; 0 = no limit
  std::int32_t num_host_blocks = 0;     ///< host (swap) pool blocks, for swap_out/swap_in and preempt; 0 = none
  std::int32_t num_kv_heads = 1;        ///< KV heads of one layer's pool (geometry(); > 0)
  std::int32_t head_dim = 128;          ///< elements per head (geometry(); > 0)
  kv_dtype dtype = kv_dtype::f16;       ///< element type of the pool (geometry())
  host_tier_options host_tier{};        ///< the prefix cache's host tier (paged_kv_cache with a tier policy)

  /// Host blocks the executors' host pool needs: the swap pool's, then the host tier's.
  [[nodiscard]] constexpr std::int64_t host_pool_blocks() const noexcept {
    return std::int64_t{num_host_blocks} + host_tier.num_blocks;
  }

  /// The pool's geometry: num_blocks, block_size, num_kv_heads, head_dim, dtype.
  [[nodiscard]] constexpr kv_geometry geometry() const noexcept {
    return {num_blocks, block_size, num_kv_heads, head_dim, dtype};
  }
};

/// The cache configuration of kernel geometry `g`: the geometry's fields come from `g` (cfg.geometry() == g), the
/// others from `rest`, so the cache and the kernels cannot disagree on them. The cache accepts any power-of-two block size and
/// the kernels only the ones they implement: check `kvpager::can_implement(g)` (kvpager/kernels/can_implement.hpp)
/// before creating the cache, so an unsupported geometry is refused there and not at the first kernel call.
[[nodiscard]] constexpr cache_config cache_config_for(const kv_geometry& g, cache_config rest = {}) noexcept {
  rest.block_size = g.block_size;
  rest.num_blocks = g.num_blocks;
  rest.num_kv_heads = g.num_kv_heads;
  rest.head_dim = g.head_dim;
  rest.dtype = g.dtype;
  return rest;
}

/// A check of a pool's geometry that paged_kv_cache::create runs when given one: kvpager::can_implement
/// (kvpager/kernels/can_implement.hpp, the compiled kernels' verdict), or the engine's own. A function, not a
/// default-constructible value, so `create(cfg, {})` still means the default policies.
struct geometry_check {
  using function = status (*)(const kv_geometry&) noexcept;
  constexpr geometry_check(function f) noexcept : fn(f) {}  // NOLINT(google-explicit-constructor): create(cfg, f)
  function fn;
};

/// The checks of paged_kv_cache::create on `cfg` alone (the pool sizes are block_pool::create's):
/// errc::invalid_block_size (not a positive power of two), errc::invalid_argument (negative max_blocks_per_seq,
/// num_kv_heads or head_dim not positive; host tier options that contradict: store_threshold < 1, an exclusive
/// tier written through, async transfers without a load timeout), errc::invalid_pool_size (negative num_host_blocks or host_tier.num_blocks, or host blocks
/// past 2^29 together).
[[nodiscard]] constexpr status validate(const cache_config& cfg) noexcept {
  if (cfg.block_size <= 0 || !std::has_single_bit(static_cast<std::uint32_t>(cfg.block_size)))
    return status{errc::invalid_block_size, "paged_kv_cache::create: block_size must be a positive power of two",
                  cfg.block_size};
  if (cfg.max_blocks_per_seq < 0)
    return status{errc::invalid_argument, "paged_kv_cache::create: max_blocks_per_seq must be >= 0",
                  cfg.max_blocks_per_seq};
  if (cfg.num_kv_heads <= 0 || cfg.head_dim <= 0)
    return status{errc::invalid_argument, "paged_kv_cache::create: num_kv_heads and head_dim must be positive",
                  cfg.num_kv_heads <= 0 ? cfg.num_kv_heads : cfg.head_dim};
  if (cfg.num_host_blocks < 0)
    return status{errc::invalid_pool_size, "paged_kv_cache::create: num_host_blocks must be >= 0",
                  cfg.num_host_blocks};
  const host_tier_options& t = cfg.host_tier;
  if (t.num_blocks < 0 || cfg.host_pool_blocks() > INT32_MAX / 4)
    return status{errc::invalid_pool_size,
                  "paged_kv_cache::create: host_tier.num_blocks must be >= 0 and, with num_host_blocks, below 2^29",
                  t.num_blocks};
  if (t.store_threshold < 1 || (t.store_threshold >= 2 && t.max_tracker_size < 1))
    return status{errc::invalid_argument,
                  "paged_kv_cache::create: host_tier.store_threshold must be >= 1 (and max_tracker_size >= 1 with it)",
                  t.store_threshold};
  if (t.async && t.load_timeout_steps < 1)
    return status{errc::invalid_argument,
                  "paged_kv_cache::create: host_tier.load_timeout_steps must be >= 1 with async transfers (a load that "
                  "never completes would hold its request forever)",
                  t.load_timeout_steps};
  if (!t.inclusive && t.write == tier_write::through)
    return status{errc::invalid_argument,
                  "paged_kv_cache::create: an exclusive host tier (inclusive = false) stores on eviction "
                  "(tier_write::back): write-through would copy every loaded block back at once"};
  return ok_status();
}

/// A snapshot of the cache's counts. Gauges are O(1) to read; counters are cumulative since creation.
struct cache_stats {
  std::int32_t block_size = 0;
  std::int32_t total = 0;         ///< usable blocks (num_blocks - reserved_blocks)
  std::int32_t free = 0;          ///< blocks in the allocator's free set
  std::int32_t used = 0;          ///< physical blocks in use (refcount > 0)
  std::int64_t logical = 0;       ///< logical block references = sum of block-table lengths
  std::int32_t shared = 0;        ///< physical blocks referenced by more than one sequence
  std::int32_t evictable = 0;     ///< cached, unreferenced blocks held by an indexed eviction policy
  std::int32_t pending_free = 0;  ///< unreferenced blocks a planned copy still uses; free at the next step
  std::int32_t sequences = 0;     ///< live sequences
  std::int64_t tokens = 0;        ///< tokens over all live sequences
  std::int64_t cow_copies = 0;    ///< copy-on-write block copies planned
  std::int64_t fork_copies = 0;   ///< block copies planned by copying forks (fork_mode::copy)
  std::int64_t evictions = 0;     ///< cached blocks whose content was discarded to reuse the block
  std::int32_t cached = 0;              ///< blocks whose content the sharing policy caches (in use or not)
  std::int64_t prefix_query_tokens = 0; ///< tokens of successful token-id admissions (vLLM prefix_cache_queries)
  std::int64_t prefix_hit_tokens = 0;   ///< of those, tokens served from the prefix cache (prefix_cache_hits)
  std::int64_t prefix_hit_tokens_host = 0;  ///< of those, tokens loaded from the host tier (after the device hits)
  std::int64_t tier_loaded_blocks = 0;  ///< host tier blocks copied to the device (loads planned), cumulative
  std::int64_t tier_stored_blocks = 0;  ///< device blocks copied to the host tier (stores planned), cumulative
  std::int64_t tier_failed_loads = 0;   ///< loads reported failed (async): the blocks are recomputed
  std::int64_t tier_failed_stores = 0;  ///< stores reported failed (async): the content has no host copy
  std::int64_t tier_load_timeouts = 0;  ///< sequences whose loads passed load_timeout_steps (async)
  std::int32_t tier_in_flight = 0;      ///< gauge: host tier loads and stores planned and not complete
  std::int32_t swapped = 0;             ///< sequences swapped out to host memory (counted in `sequences` too)
  std::int32_t host_total = 0;          ///< host (swap) blocks in all
  std::int32_t host_free = 0;           ///< host blocks free (blocks released in this step count from the next)
  std::int64_t swapped_out_blocks = 0;  ///< device blocks copied to host, cumulative
  std::int64_t swapped_in_blocks = 0;   ///< host blocks copied back to device, cumulative
  std::int64_t swap_outs = 0;           ///< sequences swapped out (events), cumulative
  std::int64_t swap_ins = 0;            ///< sequences swapped back in (events), cumulative
  std::int64_t swapped_logical = 0;     ///< host block references of swapped-out block tables
  std::int64_t preempted_swap = 0;      ///< preempt() calls that swapped
  std::int64_t preempted_recompute = 0; ///< preempt() calls that dropped the blocks for recompute

  friend bool operator==(const cache_stats&, const cache_stats&) = default;

  /// Blocks an allocation can use now: free + evictable.
  [[nodiscard]] std::int32_t available() const noexcept { return free + evictable; }
  /// prefix_hit_tokens / prefix_query_tokens (0 before any query).
  [[nodiscard]] double prefix_hit_rate() const noexcept {
    return prefix_query_tokens > 0 ? double(prefix_hit_tokens) / double(prefix_query_tokens) : 0.0;
  }
  /// Token slots the block tables of live sequences (device and host) hold minus the tokens stored: the
  /// internal fragmentation of paging, at most block_size - 1 per sequence.
  [[nodiscard]] std::int64_t internal_waste_tokens() const noexcept {
    return saturating_add(saturating_mul(saturating_add(logical, swapped_logical), block_size), -tokens);
  }
  /// used / total.
  [[nodiscard]] double utilization() const noexcept { return total > 0 ? double(used) / double(total) : 0.0; }
  /// Fraction of logical references served by sharing: 1 - used / logical (0 when nothing is shared).
  [[nodiscard]] double sharing_ratio() const noexcept {
    return logical > 0 ? 1.0 - double(used) / double(logical) : 0.0;
  }
};

/// A number of tokens, a type of its own so that a token id cannot be passed where a count is meant:
/// `cache.append_tokens(id, token_count{3})` appends three tokens, `cache.append_token(id, next_token)` one token
/// with its id, and `cache.append_tokens(id, next_token)` does not compile.
struct token_count {
  std::int32_t value = 1;
  constexpr explicit token_count(std::int32_t n) noexcept : value(n) {}
  friend constexpr bool operator==(token_count, token_count) = default;
};

/// The policy objects a paged_kv_cache is created with, by name; each one left out is default-constructed:
/// `cache_t::create(cfg, {.sharing = prefix_caching(hasher), .swap = hybrid_swap{}})`.
template <class A, class E, class S, class W, class T = no_tier>
struct cache_policies {
  A allocator{};  ///< the block_allocator (free set order)
  E eviction{};   ///< the eviction_policy (cached, unreferenced blocks)
  S sharing{};    ///< the sharing_policy (forks, prefix caching)
  W swap{};       ///< the swap_policy (preemption: swap or recompute)
  T tier{};       ///< the host tier's policy (no_tier: none; lru_tier, arc_tier)
};

/// Per-sequence options for sequences added with their token ids.
struct sequence_options {
  /// Extra key folded into the sequence's block hashes (tenant salt, LoRA adapter id, ...): blocks cached under
  /// different keys never hit each other.
  std::uint64_t extra_key = 0;
  /// Retention priority of its blocks once unreferenced (larger = kept longer), for priority-aware eviction.
  std::int32_t priority = 0;
  /// Tokens of the prompt whose KV arrives from outside the cache (a KV transfer from another instance,
  /// docs/disaggregated.md): at admission the full blocks among them after the device's prefix hit (below the
  /// prompt's last token, which is always computed) are taken new, neither computed nor loaded from a host tier;
  /// the sequence holds them and waits (load_state: loading) until the engine reports them
  /// (paged_kv_cache::complete_external): then they are committed to the prefix cache and the sequence runs as a
  /// prefix hit of those tokens. 0: none.
  std::int32_t external_tokens = 0;
};

/// What a prefix-cache lookup found for a prompt.
struct prefix_match {
  std::int32_t blocks = 0;              ///< leading full blocks served from the (device) cache
  std::int32_t tokens = 0;              ///< (blocks + host_blocks) x block_size
  std::int64_t blocks_to_allocate = 0;  ///< what adding the prompt takes from available_blocks()
  /// Full blocks after those loaded from the host tier (a cache with a tier; `tokens` counts them too: every
  /// token of the match is served, none computed).
  std::int32_t host_blocks = 0;
  /// Full blocks after the device's hit whose KV arrives from outside (sequence_options::external_tokens; an
  /// admission's result only; `tokens` counts them too).
  std::int32_t external_blocks = 0;
  friend bool operator==(const prefix_match&, const prefix_match&) = default;
};

/// A prefix-cache lookup kept for the admission it precedes (two-phase admission, as vLLM's get_computed_blocks ->
/// allocate_slots): match_prefix(tokens, options, hit) fills it and add_sequence(id, tokens, options, hit) consumes
/// it without looking the blocks up again. It is stale once a block was cached or evicted since the lookup (the
/// sharing policy's generation changed): add_sequence then answers errc::stale_prefix_hit and changes nothing.
/// Reuse one object across admissions: its buffer keeps its capacity.
/// Block hashes of a prompt known before its lookup or commit: `known[i]` for its first blocks (kept by the
/// request from an earlier admission), and `miss` for block `miss_at` (-1: none), the first one its lookup missed.
struct prompt_hashes {
  std::span<const std::uint64_t> known;
  std::uint64_t miss = 0;
  std::int32_t miss_at = -1;

  /// The hash of block `i`, or nullptr when it is not known.
  [[nodiscard]] const std::uint64_t* find(std::int32_t i) const noexcept {
    if (static_cast<std::size_t>(i) < known.size()) return &known[static_cast<std::size_t>(i)];
    return i == miss_at ? &miss : nullptr;
  }
};

struct prefix_hit {
  prefix_match match;            ///< what the lookup found
  std::vector<block_id> blocks;  ///< the hit blocks, in chain order (match.blocks of them)
  /// Block hashes add_sequence commits with instead of hashing again (a prehashed_content_cache only): the
  /// `known` ones match_prefix was given, and the hash of the first block the lookup missed (block miss_at).
  std::vector<std::uint64_t> known_hashes;
  std::uint64_t miss_hash = 0;
  std::int32_t miss_at = -1;  ///< -1: no miss hashed
  std::uint64_t generation = 0;  ///< the sharing policy's generation at the lookup
  std::uint64_t tier_generation = 0;  ///< the host tier's generation at the lookup (a cache with a tier)
  std::uint64_t extra_key = 0;   ///< the key the lookup used
  std::int32_t num_tokens = 0;   ///< tokens looked up (0: no lookup yet)
};

KVPAGER_NAMESPACE_END
