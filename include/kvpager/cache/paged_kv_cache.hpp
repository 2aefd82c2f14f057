#pragma once
/// \file
/// paged_kv_cache: block tables for sequences over one block_pool, composed from four policies. It plans byte
/// movement (copy-on-write copies, slots of appended tokens) in a step_plan and exports kernel-facing tables into
/// caller-provided buffers; it never touches KV bytes and never throws. Every failed call leaves the cache exactly
/// as it was.
///
/// Typical engine step:
/// \code
///   cache.begin_step();                          // the previous plan has been executed
///   cache.add_sequence(id, prompt_len);          // prefill: ceil(prompt_len / block_size) blocks in one batch
///   cache.append_tokens(other_id, 1);            // decode: a new block exactly when the last one is full
///   run copies in cache.plan().copies();         // copy_blocks
///   cache.export_slot_mapping(slots);            // kv_append
///   cache.export_block_table(ids, table, stride, seq_lens);   // paged attention
/// \endcode

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstdint>
#include <new>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include "kvpager/allocator/free_list_allocator.hpp"
#include "kvpager/cache/step_plan.hpp"
#include "kvpager/concepts/block_allocator.hpp"
#include "kvpager/concepts/eviction_policy.hpp"
#include "kvpager/concepts/sharing_policy.hpp"
#include "kvpager/concepts/swap_policy.hpp"
#include "kvpager/core/assert.hpp"
#include "kvpager/core/block_pool.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/id_map.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/core/types.hpp"
#include "kvpager/eviction/no_eviction.hpp"
#include "kvpager/sharing/refcount_sharing.hpp"
#include "kvpager/swap/no_swap.hpp"

KVPAGER_NAMESPACE_BEGIN

/// Run-time configuration of a paged_kv_cache.
struct cache_config {
  std::int32_t block_size = 16;       ///< tokens per block; a power of two
  std::int32_t num_blocks = 0;        ///< blocks in the pool, including reserved ones
  std::int32_t reserved_blocks = 0;   ///< blocks [0, reserved) never handed out (1 = vLLM's null block)
  std::int32_t max_blocks_per_seq = 0;  ///< longest block table allowed; 0 = no limit
};

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
  std::int32_t swapped = 0;             ///< sequences swapped out to host memory (counted in `sequences` too)
  std::int32_t host_total = 0;          ///< host (swap) blocks in all
  std::int32_t host_free = 0;           ///< host blocks free (blocks released in this step count from the next)
  std::int64_t swapped_out_blocks = 0;  ///< device blocks copied to host, cumulative
  std::int64_t swapped_in_blocks = 0;   ///< host blocks copied back to device, cumulative
  std::int64_t preempted_swap = 0;      ///< preempt() calls that swapped
  std::int64_t preempted_recompute = 0; ///< preempt() calls that dropped the blocks for recompute

  friend bool operator==(const cache_stats&, const cache_stats&) = default;

  /// Blocks an allocation can use now: free + evictable.
  [[nodiscard]] std::int32_t available() const noexcept { return free + evictable; }
  /// prefix_hit_tokens / prefix_query_tokens (0 before any query).
  [[nodiscard]] double prefix_hit_rate() const noexcept {
    return prefix_query_tokens > 0 ? double(prefix_hit_tokens) / double(prefix_query_tokens) : 0.0;
  }
  /// used / total.
  [[nodiscard]] double utilization() const noexcept { return total > 0 ? double(used) / double(total) : 0.0; }
  /// Fraction of logical references served by sharing: 1 - used / logical (0 when nothing is shared).
  [[nodiscard]] double sharing_ratio() const noexcept {
    return logical > 0 ? 1.0 - double(used) / double(logical) : 0.0;
  }
};

/// Per-sequence options for sequences added with their token ids.
struct sequence_options {
  /// Extra key folded into the sequence's block hashes (tenant salt, LoRA adapter id, ...): blocks cached under
  /// different keys never hit each other.
  std::uint64_t extra_key = 0;
  /// Retention priority of its blocks once unreferenced (larger = kept longer), for priority-aware eviction.
  std::int32_t priority = 0;
};

/// What a prefix-cache lookup found for a prompt.
struct prefix_match {
  std::int32_t blocks = 0;              ///< leading full blocks served from the cache
  std::int32_t tokens = 0;              ///< blocks x block_size
  std::int64_t blocks_to_allocate = 0;  ///< what adding the prompt takes from available_blocks()
  friend bool operator==(const prefix_match&, const prefix_match&) = default;
};

/// A prefix-cache lookup kept for the admission it precedes (two-phase admission, as vLLM's get_computed_blocks ->
/// allocate_slots): match_prefix(tokens, options, hit) fills it and add_sequence(id, tokens, options, hit) consumes
/// it without looking the blocks up again. It is stale once a block was cached or evicted since the lookup (the
/// sharing policy's generation changed): add_sequence then answers errc::stale_prefix_hit and changes nothing.
/// Reuse one object across admissions: its buffer keeps its capacity.
struct prefix_hit {
  prefix_match match;            ///< what the lookup found
  std::vector<block_id> blocks;  ///< the hit blocks, in chain order (match.blocks of them)
  std::uint64_t generation = 0;  ///< the sharing policy's generation at the lookup
  std::uint64_t extra_key = 0;   ///< the key the lookup used
  std::int32_t num_tokens = 0;   ///< tokens looked up (0: no lookup yet)
};

template <block_allocator A = free_list_allocator, eviction_policy E = no_eviction,
          sharing_policy S = refcount_sharing, swap_policy W = no_swap>
class paged_kv_cache {
  static constexpr bool caches_content = content_cache<S>;
  static constexpr bool indexed = E::retention == retention_mode::indexed;
  static constexpr bool free_order_fits = [] {
    if constexpr (requires { E::required_free_order; }) {
      return allocator_traits<A>::order == static_cast<free_order>(E::required_free_order);
    } else {
      return true;
    }
  }();
  static_assert(free_order_fits,
                "this eviction policy evicts in the allocator's free order: pair it with the allocator it names "
                "(lru_eviction needs free_list_allocator)");

 public:
  using allocator_policy = A;
  using eviction_policy_type = E;
  using sharing_policy_type = S;
  using swap_policy_type = W;

  /// Validates `cfg` and builds an empty cache; never throws (an exception other than an allocation failure that a
  /// user-written policy's reset throws passes through). Errors: errc::invalid_block_size (not a positive power of
  /// two), errc::invalid_pool_size (no usable block), errc::invalid_argument (negative max_blocks_per_seq),
  /// errc::out_of_memory (the bookkeeping below could not be allocated, std::bad_alloc or std::length_error;
  /// everything allocated so far is freed again, detail = num_blocks. Built without exceptions, a failed allocation
  /// ends the program instead, as every allocation does there). All sizes are computed in 64 bits.
  ///
  /// Host memory allocated here, per device block: 4 bytes of reference count plus the allocator's links (8 bytes
  /// for free_list_allocator), 5 bytes of step bookkeeping, and each policy's per-block state: 0 for lru_eviction
  /// and no_eviction, about 36 bytes for the heap-ordered indexed policies, 12 bytes for prefix_caching (its
  /// content entries, with block_size token ids each for hit verification, are allocated later, as blocks are
  /// cached: see prefix_caching.hpp); plus 9 bytes per host block of the swap policy's pool (and that policy's
  /// own state). Per sequence, its block table and (content caches) the token ids of its last, partial block.
  [[nodiscard]] static result<paged_kv_cache> create(cache_config cfg, A allocator = A{}, E eviction = E{},
                                                     S sharing = S{}, W swap = W{}) {
    if (cfg.block_size <= 0 || !std::has_single_bit(static_cast<std::uint32_t>(cfg.block_size)))
      return status{errc::invalid_block_size, "paged_kv_cache::create: block_size must be a positive power of two",
                    cfg.block_size};
    if (cfg.max_blocks_per_seq < 0)
      return status{errc::invalid_argument, "paged_kv_cache::create: max_blocks_per_seq must be >= 0",
                    cfg.max_blocks_per_seq};
#if KVPAGER_HAS_EXCEPTIONS
    try {
#endif
      auto pool = block_pool<A>::create({cfg.num_blocks, cfg.reserved_blocks}, std::move(allocator));
      if (!pool) return pool.error();
      return paged_kv_cache(cfg, std::move(*pool), std::move(eviction), std::move(sharing), std::move(swap));
#if KVPAGER_HAS_EXCEPTIONS
    } catch (const std::bad_alloc&) {
      return status{errc::out_of_memory, "paged_kv_cache::create: not enough host memory for the cache's bookkeeping",
                    cfg.num_blocks};
    } catch (const std::length_error&) {
      return status{errc::out_of_memory, "paged_kv_cache::create: the cache's bookkeeping exceeds max_size",
                    cfg.num_blocks};
    }
#endif
  }

  // ------------------------------------------------------------------------------------------------ sequences

  /// Prefill by count: adds sequence `id` with a `num_tokens`-token prompt, taking ceil(num_tokens / block_size)
  /// blocks in one all-or-nothing batch, and plans the prompt's slots. Its blocks are not content-cached (no token
  /// ids). Errors: errc::invalid_argument (num_tokens <= 0 or over max_blocks_per_seq),
  /// errc::duplicate_sequence, errc::out_of_blocks (detail = blocks needed).
  status add_sequence(seq_id id, std::int32_t num_tokens) {
    if (num_tokens <= 0)
      return status{errc::invalid_argument, "add_sequence: num_tokens must be positive", num_tokens};
    return add_impl(id, num_tokens, {}, sequence_options{}, nullptr);
  }

  /// Prefill with token ids: like the count overload, but first reuses the longest cached prefix of full blocks
  /// (with a content_cache sharing policy; capped so the last token is always computed), takes the remaining
  /// blocks, and commits every full block to the cache. Only the tokens after the hit get slots in the plan.
  /// `*hit` (if given) receives what the lookup found. Same errors as the count overload.
  status add_sequence(seq_id id, std::span<const token_id> tokens, sequence_options options = {},
                      prefix_match* hit = nullptr) {
    if (tokens.empty() || tokens.size() > static_cast<std::size_t>(INT32_MAX))
      return status{errc::invalid_argument, "add_sequence: the prompt must have 1 to 2^31-1 tokens",
                    static_cast<std::int64_t>(tokens.size())};
    return add_impl(id, static_cast<std::int32_t>(tokens.size()), tokens, options, hit);
  }

  /// The prefix-cache lookup add_sequence(id, tokens, options) would do, without changing anything: the hit and
  /// the number of blocks the admission would take. errc::invalid_argument for an empty prompt.
  [[nodiscard]] result<prefix_match> match_prefix(std::span<const token_id> tokens,
                                                  sequence_options options = {}) const noexcept {
    return walk_prefix(tokens, options, [](block_id) noexcept {});
  }

  /// match_prefix, keeping the hit (its blocks and the cache's generation) in `hit` for add_sequence(id, tokens,
  /// options, hit), in the same single pass over the blocks. errc::invalid_argument for an empty prompt (hit
  /// emptied). Allocates only when `hit`'s buffer grows.
  status match_prefix(std::span<const token_id> tokens, sequence_options options, prefix_hit& hit) const {
    hit.blocks.clear();
    hit.num_tokens = 0;
    const auto m = walk_prefix(tokens, options, [&](block_id b) { hit.blocks.push_back(b); });
    if (!m) return m.error();
    hit.generation = content_generation();
    hit.match = *m;
    hit.extra_key = options.extra_key;
    hit.num_tokens = static_cast<std::int32_t>(tokens.size());
    return ok_status();
  }

  /// Prefill consuming `hit`, a match_prefix of (at least) these tokens with these options: no block is looked up
  /// again (a shorter prefix of the looked-up tokens takes the hit blocks it can use, capped below its last token).
  /// errc::stale_prefix_hit when a block was cached or evicted since the lookup, or `hit` was made for other
  /// options or fewer tokens (nothing changed: look up again); otherwise as add_sequence(id, tokens, options).
  status add_sequence(seq_id id, std::span<const token_id> tokens, sequence_options options, const prefix_hit& hit,
                      prefix_match* out = nullptr) {
    if (hit.num_tokens < 1 || static_cast<std::size_t>(hit.num_tokens) < tokens.size() ||
        hit.extra_key != options.extra_key || (caches_content && hit.generation != content_generation()))
      return status{errc::stale_prefix_hit, "add_sequence: the prefix hit is stale (the cache changed since "
                                            "match_prefix) or was made for other tokens or options"};
    if (tokens.empty()) return status{errc::invalid_argument, "add_sequence: the prompt must have 1 to 2^31-1 tokens"};
    // A sharing policy without generation() cannot tell a stale hit: look the blocks up again for it.
    return add_impl(id, static_cast<std::int32_t>(tokens.size()), tokens, options, out,
                    has_generation ? &hit : nullptr);
  }

  /// Decode by count: appends `n` tokens (default 1) to sequence `id`. Takes a new block exactly when the token
  /// count exceeds blocks x block_size; writing into a shared, partly filled last block first copies it
  /// (copy-on-write: a fresh block and a (src, dst) pair in the plan). All or nothing. The sequence's later blocks
  /// are no longer content-cached (their token ids are unknown). Errors: errc::invalid_argument (n <= 0, or over
  /// max_blocks_per_seq), errc::unknown_sequence, errc::out_of_blocks.
  status append_tokens(seq_id id, std::int32_t n = 1) {
    if (n <= 0) return status{errc::invalid_argument, "append_tokens: token count must be positive", n};
    const std::int32_t h = index_.find(id);
    if (h < 0) return status{errc::unknown_sequence, "append_tokens: unknown sequence id"};
    if (seqs_[static_cast<std::size_t>(h)].swapped)
      return status{errc::sequence_swapped, "append_tokens: the sequence is swapped out; swap it in first"};
    if (status st = grow(h, n); !st) return st;
    seq_state& s = seqs_[static_cast<std::size_t>(h)];
    s.cursor = cursor_type{};
    s.partial.clear();
    return ok_status();
  }

  /// Decode with token ids: like the count overload; every block the tokens fill is committed to the content
  /// cache (for sequences added with token ids). Errors as the count overload (an empty span is invalid).
  status append_tokens(seq_id id, std::span<const token_id> tokens) {
    if (tokens.empty() || tokens.size() > static_cast<std::size_t>(INT32_MAX))
      return status{errc::invalid_argument, "append_tokens: token count must be positive",
                    static_cast<std::int64_t>(tokens.size())};
    const std::int32_t h = index_.find(id);
    if (h < 0) return status{errc::unknown_sequence, "append_tokens: unknown sequence id"};
    if (seqs_[static_cast<std::size_t>(h)].swapped)
      return status{errc::sequence_swapped, "append_tokens: the sequence is swapped out; swap it in first"};
    const std::int32_t first = seqs_[static_cast<std::size_t>(h)].num_tokens;
    if (status st = grow(h, static_cast<std::int32_t>(tokens.size())); !st) return st;
    if constexpr (caches_content) {
      seq_state& s = seqs_[static_cast<std::size_t>(h)];
      if (share_.valid(s.cursor)) {
        std::int32_t pos = first;
        for (const token_id t : tokens) {
          s.partial.push_back(t);
          ++pos;
          if (static_cast<std::int32_t>(s.partial.size()) == cfg_.block_size) {
            share_.commit(s.blocks[static_cast<std::size_t>((pos - 1) / cfg_.block_size)], s.cursor, s.partial);
            s.partial.clear();
          }
        }
      }
    }
    return ok_status();
  }

  /// Forks `child` from `parent`: the child starts with the parent's first `num_tokens` tokens (all of them when
  /// num_tokens is 0; a shared system prompt when fewer). With fork_mode::share the child references the
  /// parent's blocks; with fork_mode::copy it gets fresh blocks and the plan copies them (all or nothing).
  /// Errors: errc::unknown_sequence (parent), errc::duplicate_sequence (child is live or equals parent),
  /// errc::invalid_argument (num_tokens < 0 or over the parent's length), errc::pending_append (the parent's
  /// tokens appended in this step are not written yet: fork after begin_step), errc::out_of_blocks (copy mode).
  status fork(seq_id parent, seq_id child, std::int32_t num_tokens = 0) {
    const std::int32_t ph = index_.find(parent);
    if (ph < 0) return status{errc::unknown_sequence, "fork: unknown parent sequence id"};
    if (child == parent || index_.find(child) >= 0)
      return status{errc::duplicate_sequence, "fork: child sequence id is already live"};
    const seq_state& p = seqs_[static_cast<std::size_t>(ph)];
    if (num_tokens < 0 || num_tokens > p.num_tokens)
      return status{errc::invalid_argument, "fork: num_tokens must be in [0, parent length]", num_tokens};
    if (p.swapped) return status{errc::sequence_swapped, "fork: the parent is swapped out; swap it in first"};
    if (p.append_step == step_)
      return status{errc::pending_append, "fork: the parent has tokens appended in this step; fork after begin_step"};
    const std::int32_t tokens = num_tokens == 0 ? p.num_tokens : num_tokens;
    const auto k = static_cast<std::size_t>(blocks_for_tokens(tokens, cfg_.block_size));
    if constexpr (S::fork == fork_mode::copy) {
      if (static_cast<std::int64_t>(k) > available_blocks())
        return status{errc::out_of_blocks, "fork: not enough free blocks to copy the parent",
                      static_cast<std::int64_t>(k)};
    }

    const std::int32_t h = new_handle(child);  // may reallocate seqs_: index by handle from here on
    seq_state& c = seqs_[static_cast<std::size_t>(h)];
    const seq_state& ps = seqs_[static_cast<std::size_t>(ph)];
    c.blocks.resize(k);
    if constexpr (S::fork == fork_mode::share) {
      for (std::size_t i = 0; i < k; ++i) {
        c.blocks[i] = ps.blocks[i];
        pool_.add_ref(ps.blocks[i]);
      }
    } else {
      take_blocks(c.blocks);
      for (std::size_t i = 0; i < k; ++i) plan_copy(ps.blocks[i], c.blocks[i]);
      fork_copies_ += static_cast<std::int64_t>(k);
      c.append_step = step_;  // its bytes arrive with this step's copies
    }
    c.num_tokens = tokens;
    c.priority = ps.priority;
    if constexpr (caches_content) inherit_cursor(c, ps, tokens);
    tokens_ += tokens;
    return ok_status();
  }

  /// Frees sequence `id`: references are dropped last block first (so with LRU the tail of a chain is reclaimed
  /// before its head); a block whose count reaches zero returns to the pool (or stays cached, per the eviction
  /// policy). Tokens it appended in this step are not computed: their slots export as -1 and blocks they would
  /// have filled are not cached, except in blocks another sequence already shares through a prefix hit in this
  /// step, whose content that sequence needs: those slots are kept, and the engine must still write them.
  /// Error: errc::unknown_sequence (never added or already freed).
  status free_sequence(seq_id id) {
    const std::int32_t h = index_.find(id);
    if (h < 0) return status{errc::unknown_sequence, "free_sequence: unknown sequence id (never added or already freed)"};
    seq_state& s = seqs_[static_cast<std::size_t>(h)];
    if (s.swapped) {
      for (const block_id hb : s.blocks) release_host_ref(hb);
      s.swapped = false;
      --swapped_;
    } else {
      if (s.append_step == step_) cancel_appends(h, s);
      const retention_hint hint{s.priority};
      for (auto it = s.blocks.rbegin(); it != s.blocks.rend(); ++it) release_block(*it, hint);
    }
    tokens_ -= s.num_tokens;
    s.blocks.clear();  // keeps capacity for the next sequence in this handle
    s.partial.clear();
    s.cursor = cursor_type{};
    s.num_tokens = 0;
    s.priority = 0;
    s.extra_key = 0;
    s.append_step = no_step;
    index_.erase(id);
    free_handles_.push_back(h);
    return ok_status();
  }

  // ------------------------------------------------------------------------------------------------ memory pressure

  /// Swaps the sequences in `group` out to host memory together: every distinct device block they reference gets
  /// one host block (a block shared within the group is swapped once, and shared again on swap-in), the plan lists
  /// the (device, host) copies, and their device references are dropped (blocks still used by other sequences stay
  /// on device). All or nothing. Errors: errc::unsupported (no host pool), errc::unknown_sequence,
  /// errc::invalid_argument (an id listed twice), errc::sequence_swapped (already out), errc::pending_append
  /// (bytes of this step not in place yet: swap after begin_step), errc::host_pool_full (detail = blocks needed).
  /// A swapped sequence stops prefix-caching its later blocks.
  status swap_out(std::span<const seq_id> group) {
    if (swap_.host_capacity() == 0) return status{errc::unsupported, "swap_out: the swap policy has no host pool"};
    if (status st = check_group(group, false, "swap_out"); !st) return st;
    collect_distinct(group, dev_map_);  // distinct device blocks of the group, in first-use order
    const auto need = static_cast<std::int64_t>(scratch_.size());
    if (need > swap_.host_free()) {
      for (const block_id b : scratch_) dev_map_[static_cast<std::size_t>(b)] = -1;
      return status{errc::host_pool_full, "swap_out: not enough free host blocks", need};
    }
    id_scratch_.resize(scratch_.size());
    [[maybe_unused]] const bool got = swap_.allocate_host(id_scratch_);
    KVPAGER_ASSERT(got, "swap_out: the host pool refused blocks it reported free");
    for (std::size_t i = 0; i < scratch_.size(); ++i) {
      dev_map_[static_cast<std::size_t>(scratch_[i])] = id_scratch_[i];
      plan_.add_swap_out(block_swap{scratch_[i], id_scratch_[i]});
    }
    for (const seq_id id : group) {
      seq_state& s = seqs_[static_cast<std::size_t>(index_.find(id))];
      const retention_hint hint{s.priority};
      for (auto it = s.blocks.rbegin(); it != s.blocks.rend(); ++it) {  // tail first, as a free
        const block_id hb = dev_map_[static_cast<std::size_t>(*it)];
        ++host_refs_[static_cast<std::size_t>(hb)];
        release_block(*it, hint);
        *it = hb;
      }
      s.swapped = true;
      s.cursor = cursor_type{};
      s.partial.clear();
      ++swapped_;
    }
    for (const block_id b : scratch_) dev_map_[static_cast<std::size_t>(b)] = -1;
    swapped_out_blocks_ += need;
    return ok_status();
  }
  status swap_out(seq_id id) { return swap_out(std::span<const seq_id>(&id, 1)); }

  /// Swaps the sequences in `group` back in, all or nothing: each distinct host block gets one device block
  /// (sharing within the group is restored) and the plan lists the (host, device) copies. Their bytes arrive with
  /// this step's plan, so they can be forked or swapped out again only from the next step. Errors:
  /// errc::unknown_sequence, errc::invalid_argument (an id listed twice), errc::sequence_swapped (not swapped out),
  /// errc::out_of_blocks (detail = device blocks needed).
  status swap_in(std::span<const seq_id> group) {
    if (status st = check_group(group, true, "swap_in"); !st) return st;
    collect_distinct(group, host_map_);  // distinct host blocks of the group, in first-use order
    const auto need = static_cast<std::int64_t>(scratch_.size());
    if (need > available_blocks()) {
      for (const block_id hb : scratch_) host_map_[static_cast<std::size_t>(hb)] = -1;
      return status{errc::out_of_blocks, "swap_in: not enough free device blocks", need};
    }
    id_scratch_.resize(scratch_.size());
    take_blocks(id_scratch_);
    for (std::size_t i = 0; i < scratch_.size(); ++i) {
      host_map_[static_cast<std::size_t>(scratch_[i])] = id_scratch_[i];
      plan_.add_swap_in(block_swap{id_scratch_[i], scratch_[i]});
      mark_busy(id_scratch_[i]);  // written by the swap-in: not handed out again in this step if freed
    }
    for (const seq_id id : group) {
      const std::int32_t h = index_.find(id);
      seq_state& s = seqs_[static_cast<std::size_t>(h)];
      for (block_id& b : s.blocks) {
        const block_id hb = b;
        b = host_map_[static_cast<std::size_t>(hb)];
        if (host_first_use_[static_cast<std::size_t>(hb)] != 0) {
          pool_.add_ref(b);  // shared within the group: one device block again
        } else {
          host_first_use_[static_cast<std::size_t>(hb)] = 1;
        }
        release_host_ref(hb);
      }
      s.swapped = false;
      s.append_step = step_;  // its bytes arrive with this step's swap-ins
      --swapped_;
    }
    for (const block_id hb : scratch_) {
      host_map_[static_cast<std::size_t>(hb)] = -1;
      host_first_use_[static_cast<std::size_t>(hb)] = 0;
    }
    swapped_in_blocks_ += need;
    return ok_status();
  }
  status swap_in(seq_id id) { return swap_in(std::span<const seq_id>(&id, 1)); }

  /// Preempts sequence `id` as the swap policy decides for its block count: preempt_action::swap swaps it out
  /// (it stays live, swapped); preempt_action::recompute frees it (the engine re-adds its tokens later). Errors:
  /// errc::unsupported (the policy does not preempt), errc::unknown_sequence, errc::sequence_swapped, and those of
  /// swap_out.
  result<preempt_action> preempt(seq_id id) {
    const std::int32_t h = index_.find(id);
    if (h < 0) return status{errc::unknown_sequence, "preempt: unknown sequence id"};
    const seq_state& s = seqs_[static_cast<std::size_t>(h)];
    if (s.swapped) return status{errc::sequence_swapped, "preempt: the sequence is already swapped out"};
    const preempt_action a = swap_.action(static_cast<std::int32_t>(s.blocks.size()));
    switch (a) {
      case preempt_action::swap:
        if (status st = swap_out(id); !st) return st;
        ++preempted_swap_;
        return a;
      case preempt_action::recompute:
        (void)free_sequence(id);
        ++preempted_recompute_;
        return a;
      default:
        return status{errc::unsupported, "preempt: the swap policy does not preempt (no_swap)"};
    }
  }

  /// Starts a new step: the previous plan is taken as executed, it is cleared, and blocks that planned copies
  /// kept busy become reusable. O(blocks touched by the previous plan).
  void begin_step() {
    for (const block_id b : busy_list_) busy_[static_cast<std::size_t>(b)] = 0;
    busy_list_.clear();
    for (const auto& [b, hint] : deferred_)
      if (pool_.refcount(b) == 0) settle(b, hint);  // a prefix hit may have revived it
    deferred_.clear();
    pending_ = 0;
    for (const block_id hb : host_deferred_) swap_.release_host(hb);
    host_deferred_.clear();
    plan_.clear();
    append_owner_.clear();
    frozen_offset_.clear();
    frozen_slots_.clear();
    ++step_;
  }

  /// The byte movement planned since the last begin_step().
  [[nodiscard]] const step_plan& plan() const noexcept { return plan_; }

  // ------------------------------------------------------------------------------------------------ queries

  [[nodiscard]] bool contains(seq_id id) const noexcept { return index_.find(id) >= 0; }
  [[nodiscard]] std::int32_t num_sequences() const noexcept { return index_.size(); }
  [[nodiscard]] std::int32_t block_size() const noexcept { return cfg_.block_size; }
  [[nodiscard]] const cache_config& config() const noexcept { return cfg_; }

  /// Tokens of sequence `id`; errc::unknown_sequence.
  [[nodiscard]] result<std::int32_t> num_tokens(seq_id id) const noexcept {
    const std::int32_t h = index_.find(id);
    if (h < 0) return status{errc::unknown_sequence, "num_tokens: unknown sequence id"};
    return seqs_[static_cast<std::size_t>(h)].num_tokens;
  }

  /// The block table of sequence `id` (valid until the next call that changes that sequence);
  /// errc::unknown_sequence.
  [[nodiscard]] result<std::span<const block_id>> block_table(seq_id id) const noexcept {
    const std::int32_t h = index_.find(id);
    if (h < 0) return status{errc::unknown_sequence, "block_table: unknown sequence id"};
    if (seqs_[static_cast<std::size_t>(h)].swapped)
      return status{errc::sequence_swapped, "block_table: the sequence is swapped out (see host_block_table)"};
    return std::span<const block_id>(seqs_[static_cast<std::size_t>(h)].blocks);
  }

  /// The host block table of swapped-out sequence `id`; errc::unknown_sequence, errc::sequence_swapped (it is
  /// not swapped out).
  [[nodiscard]] result<std::span<const block_id>> host_block_table(seq_id id) const noexcept {
    const std::int32_t h = index_.find(id);
    if (h < 0) return status{errc::unknown_sequence, "host_block_table: unknown sequence id"};
    if (!seqs_[static_cast<std::size_t>(h)].swapped)
      return status{errc::sequence_swapped, "host_block_table: the sequence is not swapped out"};
    return std::span<const block_id>(seqs_[static_cast<std::size_t>(h)].blocks);
  }

  /// Whether sequence `id` is live and swapped out.
  [[nodiscard]] bool is_swapped(seq_id id) const noexcept {
    const std::int32_t h = index_.find(id);
    return h >= 0 && seqs_[static_cast<std::size_t>(h)].swapped;
  }

  /// Reference count of block `b` (0 when free, parked, reserved or out of range).
  [[nodiscard]] std::int32_t refcount(block_id b) const noexcept { return pool_.refcount(b); }
  /// Whether `b` is in the allocator's free set.
  [[nodiscard]] bool is_free(block_id b) const noexcept { return pool_.is_free(b); }

  /// Blocks an allocation can use now (free + evictable).
  [[nodiscard]] std::int64_t available_blocks() const noexcept {
    std::int64_t n = pool_.num_free();
    if constexpr (indexed) n += evict_.size();
    return n;
  }
  /// Blocks a prompt of `num_tokens` tokens needs (without prefix hits).
  [[nodiscard]] std::int64_t blocks_needed(std::int64_t num_tokens) const noexcept {
    return blocks_for_tokens(num_tokens, cfg_.block_size);
  }

  [[nodiscard]] cache_stats stats() const noexcept {
    const pool_stats p = pool_.stats();
    cache_stats s;
    s.block_size = cfg_.block_size;
    s.total = p.total;
    s.free = p.free;
    s.used = p.used;
    s.logical = p.references;
    s.shared = p.shared;
    if constexpr (indexed) s.evictable = evict_.size();
    s.pending_free = pending_;
    s.sequences = index_.size();
    s.tokens = tokens_;
    s.cow_copies = cow_copies_;
    s.fork_copies = fork_copies_;
    s.evictions = evictions_;
    if constexpr (caches_content) s.cached = share_.num_cached();
    s.prefix_query_tokens = prefix_query_tokens_;
    s.prefix_hit_tokens = prefix_hit_tokens_;
    s.swapped = swapped_;
    s.host_total = swap_.host_capacity();
    s.host_free = swap_.host_free();
    s.swapped_out_blocks = swapped_out_blocks_;
    s.swapped_in_blocks = swapped_in_blocks_;
    s.preempted_swap = preempted_swap_;
    s.preempted_recompute = preempted_recompute_;
    return s;
  }

  [[nodiscard]] const block_pool<A>& pool() const noexcept { return pool_; }
  [[nodiscard]] const E& eviction() const noexcept { return evict_; }
  [[nodiscard]] const S& sharing() const noexcept { return share_; }
  [[nodiscard]] const W& swap() const noexcept { return swap_; }

  // ------------------------------------------------------------------------------------------------ exports

  /// Dense page table (vLLM layout): row i of `table` (`row_stride` int32 entries) gets the block ids of
  /// `seqs[i]`, padded with -1; `seq_lens[i]` its token count. Validates everything before writing anything.
  /// Errors: errc::invalid_argument (row_stride <= 0), errc::unknown_sequence, errc::buffer_too_small (a
  /// buffer, or a sequence with more than row_stride blocks; detail = entries needed).
  status export_block_table(std::span<const seq_id> seqs, std::span<std::int32_t> table, std::int32_t row_stride,
                            std::span<std::int32_t> seq_lens) const noexcept {
    if (row_stride <= 0)
      return status{errc::invalid_argument, "export_block_table: row_stride must be positive", row_stride};
    if (seq_lens.size() < seqs.size())
      return status{errc::buffer_too_small, "export_block_table: seq_lens is shorter than seqs",
                    static_cast<std::int64_t>(seqs.size())};
    const auto need = static_cast<std::int64_t>(seqs.size()) * row_stride;
    if (static_cast<std::int64_t>(table.size()) < need)
      return status{errc::buffer_too_small, "export_block_table: table is smaller than seqs x row_stride", need};
    for (const seq_id id : seqs) {
      const std::int32_t h = index_.find(id);
      if (h < 0) return status{errc::unknown_sequence, "export_block_table: unknown sequence id"};
      if (seqs_[static_cast<std::size_t>(h)].swapped)
        return status{errc::sequence_swapped, "export_block_table: a sequence is swapped out"};
      const auto n = static_cast<std::int64_t>(seqs_[static_cast<std::size_t>(h)].blocks.size());
      if (n > row_stride)
        return status{errc::buffer_too_small, "export_block_table: a sequence has more blocks than row_stride", n};
    }
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      const seq_state& s = seqs_[static_cast<std::size_t>(index_.find(seqs[i]))];
      std::int32_t* row = table.data() + i * static_cast<std::size_t>(row_stride);
      std::copy(s.blocks.begin(), s.blocks.end(), row);
      std::fill(row + s.blocks.size(), row + row_stride, no_block);
      seq_lens[i] = s.num_tokens;
    }
    return ok_status();
  }

  /// Number of `indices` entries export_csr needs for `seqs`; errc::unknown_sequence.
  [[nodiscard]] result<std::int64_t> csr_size(std::span<const seq_id> seqs) const noexcept {
    std::int64_t n = 0;
    for (const seq_id id : seqs) {
      const std::int32_t h = index_.find(id);
      if (h < 0) return status{errc::unknown_sequence, "csr_size: unknown sequence id"};
      if (seqs_[static_cast<std::size_t>(h)].swapped)
        return status{errc::sequence_swapped, "csr_size: a sequence is swapped out"};
      n += static_cast<std::int64_t>(seqs_[static_cast<std::size_t>(h)].blocks.size());
    }
    return n;
  }

  /// CSR page table (FlashInfer layout): the blocks of seqs[i] are indices[indptr[i] .. indptr[i+1]);
  /// last_page_len[i] = tokens in its last block (in [1, block_size]). Validates before writing.
  /// Errors: errc::unknown_sequence, errc::buffer_too_small (indptr < seqs + 1, last_page_len < seqs,
  /// indices < csr_size, or a total over 2^31-1 entries; detail = entries needed).
  status export_csr(std::span<const seq_id> seqs, std::span<std::int32_t> indptr, std::span<std::int32_t> indices,
                    std::span<std::int32_t> last_page_len) const noexcept {
    const auto total = csr_size(seqs);
    if (!total) return total.error();
    if (indptr.size() < seqs.size() + 1)
      return status{errc::buffer_too_small, "export_csr: indptr needs seqs + 1 entries",
                    static_cast<std::int64_t>(seqs.size() + 1)};
    if (last_page_len.size() < seqs.size())
      return status{errc::buffer_too_small, "export_csr: last_page_len is shorter than seqs",
                    static_cast<std::int64_t>(seqs.size())};
    if (static_cast<std::int64_t>(indices.size()) < *total || *total > INT32_MAX)
      return status{errc::buffer_too_small, "export_csr: indices cannot hold every block", *total};
    std::int32_t pos = 0;
    indptr[0] = 0;
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      const seq_state& s = seqs_[static_cast<std::size_t>(index_.find(seqs[i]))];
      std::copy(s.blocks.begin(), s.blocks.end(), indices.begin() + pos);
      pos += static_cast<std::int32_t>(s.blocks.size());
      indptr[i + 1] = pos;
      last_page_len[i] = s.num_tokens - (static_cast<std::int32_t>(s.blocks.size()) - 1) * cfg_.block_size;
    }
    return ok_status();
  }

  /// Length of the slot mapping of this step (plan().num_append_tokens()).
  [[nodiscard]] std::int64_t slot_mapping_size() const noexcept { return plan_.num_append_tokens(); }

  /// Slot mapping of the tokens appended in this step, in plan().appends() order: slot = block * block_size +
  /// offset, computed in 64 bits; -1 (kernels skip it) for tokens of sequences freed since, except those kept
  /// because another sequence shares their block (see free_sequence).
  /// Error: errc::buffer_too_small (detail = slot_mapping_size()); nothing written then.
  status export_slot_mapping(std::span<std::int64_t> out) const noexcept {
    if (static_cast<std::int64_t>(out.size()) < plan_.num_append_tokens())
      return status{errc::buffer_too_small, "export_slot_mapping: buffer is shorter than slot_mapping_size()",
                    plan_.num_append_tokens()};
    const std::span<const token_range> ranges = plan_.appends();
    const std::int64_t bs = cfg_.block_size;
    std::int64_t* o = out.data();
    for (std::size_t r = 0; r < ranges.size(); ++r) {
      const token_range& tr = ranges[r];
      const std::int32_t owner = append_owner_[r];
      if (owner < 0) {  // its sequence was freed: cancelled, or the slots kept for sharers were frozen then
        if (r >= frozen_offset_.size() || frozen_offset_[r] < 0) {
          o = std::fill_n(o, tr.count, std::int64_t{-1});
        } else {
          const auto first = frozen_slots_.begin() + frozen_offset_[r];
          o = std::copy(first, first + tr.count, o);
        }
        continue;
      }
      const block_id* blocks = seqs_[static_cast<std::size_t>(owner)].blocks.data();
      for (std::int64_t p = tr.first_pos; p < std::int64_t{tr.first_pos} + tr.count; ++p)
        *o++ = std::int64_t{blocks[p / bs]} * bs + p % bs;
    }
    return ok_status();
  }

 private:
  static constexpr std::uint64_t no_step = ~std::uint64_t{0};
  struct no_cursor {
    friend bool operator==(const no_cursor&, const no_cursor&) = default;
  };
  template <class T>
  struct cursor_of {
    using type = no_cursor;
  };
  template <content_cache T>
  struct cursor_of<T> {
    using type = typename T::cursor;
  };
  using cursor_type = typename cursor_of<S>::type;

  struct seq_state {
    std::vector<block_id> blocks;
    std::vector<token_id> partial;  ///< token ids of the last, partly filled block (content caches only)
    seq_id id = 0;
    std::int32_t num_tokens = 0;
    std::int32_t priority = 0;
    std::uint64_t extra_key = 0;
    std::uint64_t append_step = no_step;  ///< step of the last append whose bytes are not written yet
    bool swapped = false;                 ///< blocks holds host block ids
    [[no_unique_address]] cursor_type cursor{};  ///< hash chain after the last full block (content caches only)
  };

  paged_kv_cache(cache_config cfg, block_pool<A> pool, E e, S s, W w)
      : cfg_(cfg), pool_(std::move(pool)), evict_(std::move(e)), share_(std::move(s)), swap_(std::move(w)) {
    const pool_geometry g{cfg.num_blocks, cfg.block_size, cfg.reserved_blocks};
    evict_.reset(g);
    share_.reset(g);
    swap_.reset(g);
    busy_.assign(static_cast<std::size_t>(cfg.num_blocks), 0);
    dev_map_.assign(static_cast<std::size_t>(cfg.num_blocks), -1);
    const auto host = static_cast<std::size_t>(swap_.host_capacity());
    host_map_.assign(host, -1);
    host_first_use_.assign(host, 0);
    host_refs_.assign(host, 0);
  }

  [[nodiscard]] bool exceeds_table_limit(std::int64_t blocks) const noexcept {
    return cfg_.max_blocks_per_seq > 0 && blocks > cfg_.max_blocks_per_seq;
  }

  [[nodiscard]] std::span<const token_id> block_tokens(std::span<const token_id> tokens, std::int32_t i) const noexcept {
    return tokens.subspan(static_cast<std::size_t>(i) * static_cast<std::size_t>(cfg_.block_size),
                          static_cast<std::size_t>(cfg_.block_size));
  }

  /// Whether a hit on `b` takes a block from available_blocks() (it is free or evictable, not in use or parked).
  [[nodiscard]] bool consumes_capacity(block_id b) const noexcept {
    if (pool_.refcount(b) > 0) return false;
    if constexpr (indexed) {
      if (evict_.contains(b)) return true;
    }
    return pool_.is_free(b);
  }

  /// The prefix-cache lookup of match_prefix; `on_hit(b)` sees each hit block in chain order.
  template <class F>
  [[nodiscard]] result<prefix_match> walk_prefix(std::span<const token_id> tokens, sequence_options options,
                                                 F&& on_hit) const {
    if (tokens.empty() || tokens.size() > static_cast<std::size_t>(INT32_MAX))
      return status{errc::invalid_argument, "match_prefix: the prompt must have 1 to 2^31-1 tokens",
                    static_cast<std::int64_t>(tokens.size())};
    prefix_match m;
    const auto n = static_cast<std::int32_t>(tokens.size());
    if constexpr (caches_content) {
      auto c = share_.first_cursor(options.extra_key);
      const std::int32_t max_blocks = (n - 1) / cfg_.block_size;
      for (std::int32_t i = 0; i < max_blocks; ++i) {
        const block_id b = share_.lookup(c, block_tokens(tokens, i));
        if (b == no_block) break;
        on_hit(b);
        ++m.blocks;
        if (consumes_capacity(b)) ++m.blocks_to_allocate;
      }
    }
    m.tokens = m.blocks * cfg_.block_size;
    m.blocks_to_allocate += blocks_for_tokens(n, cfg_.block_size) - m.blocks;
    return m;
  }

  /// Whether the sharing policy counts its content changes (prefix_caching::generation()).
  static constexpr bool has_generation = requires(const S& s) {
    { s.generation() } -> std::convertible_to<std::uint64_t>;
  };
  /// The sharing policy's generation (0 without one: see add_sequence with a prefix_hit).
  [[nodiscard]] std::uint64_t content_generation() const noexcept {
    if constexpr (has_generation)
      return share_.generation();
    else
      return 0;
  }

  /// Prefill shared by the add_sequence overloads; `tokens` is empty for the count overload; `given`: a
  /// match_prefix hit to consume instead of looking the blocks up.
  status add_impl(seq_id id, std::int32_t n, std::span<const token_id> tokens, sequence_options options,
                  prefix_match* hit, const prefix_hit* given = nullptr) {
    if (index_.find(id) >= 0) return status{errc::duplicate_sequence, "add_sequence: sequence id is already live"};
    const std::int64_t total = blocks_for_tokens(n, cfg_.block_size);
    if (exceeds_table_limit(total))
      return status{errc::invalid_argument, "add_sequence: prompt needs more than max_blocks_per_seq blocks", total};
    // Lookup (no mutation): the longest cached prefix, capped at n - 1 tokens.
    hits_.clear();
    std::int64_t needed = total;
    [[maybe_unused]] cursor_type cur{};
    if constexpr (caches_content) {
      if (!tokens.empty()) {
        cur = share_.first_cursor(options.extra_key);
        const std::int32_t max_blocks = (n - 1) / cfg_.block_size;
        if (given != nullptr) {  // the lookup is done: take its blocks, continue the chain after the last one
          hits_.assign(given->blocks.begin(), given->blocks.begin() + std::min(given->match.blocks, max_blocks));
          for (const block_id b : hits_)
            if (!consumes_capacity(b)) --needed;
          if (!hits_.empty()) cur = share_.cursor_after(hits_.back());
        }
        for (auto i = static_cast<std::int32_t>(hits_.size()); given == nullptr && i < max_blocks; ++i) {
          const block_id b = share_.lookup(cur, block_tokens(tokens, i));
          if (b == no_block) break;
          hits_.push_back(b);
          if (!consumes_capacity(b)) --needed;
        }
      }
    }
    if (needed > available_blocks())
      return status{errc::out_of_blocks, "add_sequence: not enough free blocks for the prompt", needed};

    const std::int32_t h = new_handle(id);
    seq_state& s = seqs_[static_cast<std::size_t>(h)];
    s.blocks.resize(static_cast<std::size_t>(total));
    // Hits first (they leave the free queue before anything is popped from it), then new blocks.
    for (std::size_t i = 0; i < hits_.size(); ++i) {
      touch(hits_[i]);
      s.blocks[i] = hits_[i];
    }
    take_blocks(std::span<block_id>(s.blocks).subspan(hits_.size()));
    s.num_tokens = n;
    s.priority = options.priority;
    s.extra_key = options.extra_key;
    const auto hit_tokens = static_cast<std::int32_t>(hits_.size()) * cfg_.block_size;
    if constexpr (caches_content) {
      if (!tokens.empty()) {
        const std::int32_t full = n / cfg_.block_size;
        for (auto i = static_cast<std::int32_t>(hits_.size()); i < full; ++i)
          share_.commit(s.blocks[static_cast<std::size_t>(i)], cur, block_tokens(tokens, i));
        s.partial.assign(tokens.begin() + static_cast<std::ptrdiff_t>(full) * cfg_.block_size, tokens.end());
        s.cursor = cur;
      }
    }
    if (!tokens.empty()) {
      prefix_query_tokens_ += n;
      prefix_hit_tokens_ += hit_tokens;
    }
    tokens_ += n;
    record_append(h, s, hit_tokens, n - hit_tokens);
    if (hit != nullptr)
      *hit = prefix_match{static_cast<std::int32_t>(hits_.size()), hit_tokens, static_cast<std::int64_t>(needed)};
    return ok_status();
  }

  /// Slots for `n` more tokens of sequence `h` (copy-on-write of a shared partial last block, new blocks), all or
  /// nothing, and their range in the plan.
  status grow(std::int32_t h, std::int32_t n) {
    seq_state& s = seqs_[static_cast<std::size_t>(h)];
    const std::int64_t new_total = std::int64_t{s.num_tokens} + n;
    if (new_total > INT32_MAX)
      return status{errc::invalid_argument, "append_tokens: sequence would exceed 2^31-1 tokens", new_total};
    const std::int64_t total_blocks = blocks_for_tokens(new_total, cfg_.block_size);
    if (exceeds_table_limit(total_blocks))
      return status{errc::invalid_argument, "append_tokens: sequence would need more than max_blocks_per_seq blocks",
                    total_blocks};
    const std::int64_t more = total_blocks - static_cast<std::int64_t>(s.blocks.size());
    const bool writes_last = s.num_tokens % cfg_.block_size != 0;  // the first new token lands in the last block
    const bool cow = writes_last && pool_.refcount(s.blocks.back()) > 1;
    if (more + (cow ? 1 : 0) > available_blocks())
      return status{errc::out_of_blocks, "append_tokens: not enough free blocks", more + (cow ? 1 : 0)};
    // A full block that is cached but ours alone (a fork that ended inside it) is about to change: its cached
    // content must not be handed out again.
    if (writes_last && !cow && share_.is_cached(s.blocks.back())) evict(s.blocks.back());

    if (cow) {
      const block_id src = s.blocks.back();
      block_id dst = no_block;
      take_blocks(std::span<block_id>(&dst, 1));
      plan_copy(src, dst);
      ++cow_copies_;
      s.blocks.back() = dst;
      release_block(src, retention_hint{s.priority});  // still referenced by the other sharers
    }
    if (more > 0) {
      const std::size_t old = s.blocks.size();
      s.blocks.resize(old + static_cast<std::size_t>(more));
      take_blocks(std::span<block_id>(s.blocks).subspan(old));
    }
    record_append(h, s, s.num_tokens, n);
    s.num_tokens = static_cast<std::int32_t>(new_total);
    tokens_ += n;
    return ok_status();
  }

  /// The child's hash-chain state after forking `tokens` tokens of `p`: it keeps caching only if the content of
  /// its partial block is known (the fork point is block-aligned, or inside the parent's own partial block).
  void inherit_cursor(seq_state& c, const seq_state& p, std::int32_t tokens) {
    c.partial.clear();
    c.cursor = cursor_type{};
    if (!share_.valid(p.cursor)) return;
    const std::int32_t full = tokens / cfg_.block_size;
    const std::int32_t rest = tokens % cfg_.block_size;
    const std::int32_t parent_full = p.num_tokens / cfg_.block_size;
    if (rest != 0 && full != parent_full) return;  // the partial block's tokens are not kept
    if (full == parent_full) {
      c.cursor = p.cursor;
    } else if (full == 0) {
      c.cursor = share_.first_cursor(p.extra_key);
    } else {
      c.cursor = share_.cursor_after(p.blocks[static_cast<std::size_t>(full - 1)]);  // invalid if not cached
    }
    c.partial.assign(p.partial.begin(), p.partial.begin() + rest);
    c.extra_key = p.extra_key;
  }

  std::int32_t new_handle(seq_id id) {
    std::int32_t h;
    if (!free_handles_.empty()) {
      h = free_handles_.back();
      free_handles_.pop_back();
    } else {
      h = static_cast<std::int32_t>(seqs_.size());
      seqs_.emplace_back();
    }
    seqs_[static_cast<std::size_t>(h)].id = id;
    index_.insert(id, h);
    return h;
  }

  /// A prefix hit takes a reference on `b`, wherever it is: in use, in the free queue, in the eviction index, or
  /// parked until the next step.
  void touch(block_id b) noexcept {
    if (pool_.refcount(b) > 0) {
      pool_.add_ref(b);
    } else if (pool_.is_free(b)) {
      pool_.take(b);
    } else {
      bool parked_for_copy = true;
      if constexpr (indexed) {
        if (evict_.contains(b)) {
          evict_.erase(b);
          parked_for_copy = false;
        }
      }
      if (parked_for_copy) --pending_;  // revived: begin_step will see it referenced and skip it
      pool_.adopt(b);
    }
    if constexpr (indexed) evict_.on_hit(b);
  }

  /// Fills `out` with blocks; the caller has checked out.size() <= available_blocks(). Clean free blocks first,
  /// then (indexed retention) victims of the eviction policy. A reused block that still holds cached content is
  /// evicted here, lazily (vLLM's order with retention_mode::in_free_list).
  void take_blocks(std::span<block_id> out) noexcept {
    KVPAGER_ASSERT(static_cast<std::int64_t>(out.size()) <= available_blocks(), "take_blocks: capacity not checked");
    for (block_id& b : out) {
      if (pool_.num_free() > 0) {
        b = pool_.pop_free();
        if constexpr (E::retention == retention_mode::in_free_list) {
          if (share_.is_cached(b)) evict(b);
        }
      } else {
        if constexpr (indexed) {
          b = evict_.pop_victim();
          evict(b);
          pool_.adopt(b);
        }
      }
      KVPAGER_ASSERT(!share_.is_cached(b), "take_blocks: a handed-out block still carries cached content");
    }
  }

  /// Reuses cached block `b` for other content (counted in stats().evictions).
  void evict(block_id b) noexcept {
    drop_content(b);
    ++evictions_;
  }

  /// Every discard of a block's cached content goes through here (eviction, a write into an owned cached block,
  /// an append cancelled before its bytes were written, a release without retention): the sharing policy forgets
  /// the content and the eviction policy the per-content state it keeps (hits, first-use stamp), so the block's
  /// next content starts afresh. `b` is not in the eviction index.
  void drop_content(block_id b) noexcept {
    share_.uncache(b);
    if constexpr (detail::forgets_content<E>) evict_.forget(b);
  }

  /// Drops one reference; at zero the block is parked while a planned copy uses it, else settled.
  void release_block(block_id b, retention_hint hint) {
    if (pool_.drop_ref(b) > 0) return;
    std::uint8_t& f = busy_[static_cast<std::size_t>(b)];
    if (f != 0) {
      if ((f & deferred_flag) == 0) {  // listed once per step, even if revived and released again
        f |= deferred_flag;
        deferred_.emplace_back(b, hint);
      } else {
        for (auto& d : deferred_)
          if (d.first == b) d.second = hint;  // the latest release decides its retention
      }
      ++pending_;
      return;
    }
    settle(b, hint);
  }

  /// Where an unreferenced block goes: back to the allocator, or kept cached per the eviction policy.
  void settle(block_id b, retention_hint hint) noexcept {
    KVPAGER_ASSERT(pool_.refcount(b) == 0, "settle: block is still referenced");
    if (share_.is_cached(b)) {
      if constexpr (indexed) {
        evict_.insert(b, hint);
        return;
      } else if constexpr (E::retention == retention_mode::none) {
        drop_content(b);
      }
    }
    pool_.recycle(b);
  }

  void plan_copy(block_id src, block_id dst) {
    plan_.add_copy(block_copy{src, dst});
    mark_busy(src);
    mark_busy(dst);
  }

  void mark_busy(block_id b) {
    std::uint8_t& f = busy_[static_cast<std::size_t>(b)];
    if (f == 0) {
      f = busy_flag;
      busy_list_.push_back(b);
    }
  }

  void record_append(std::int32_t h, seq_state& s, std::int32_t first_pos, std::int32_t count) {
    plan_.add_append(token_range{s.id, first_pos, count});
    append_owner_.push_back(h);
    s.append_step = step_;
  }

  /// Validation shared by swap_out (want_swapped = false) and swap_in (true); changes nothing.
  status check_group(std::span<const seq_id> group, bool want_swapped, const char* /*call*/) const noexcept {
    for (std::size_t i = 0; i < group.size(); ++i) {
      const std::int32_t h = index_.find(group[i]);
      if (h < 0) return status{errc::unknown_sequence, "swap: unknown sequence id"};
      for (std::size_t j = 0; j < i; ++j)
        if (group[j] == group[i]) return status{errc::invalid_argument, "swap: a sequence id is listed twice"};
      const seq_state& s = seqs_[static_cast<std::size_t>(h)];
      if (s.swapped != want_swapped)
        return status{errc::sequence_swapped, want_swapped ? "swap_in: the sequence is not swapped out"
                                                           : "swap_out: the sequence is already swapped out"};
      if (!want_swapped && s.append_step == step_)
        return status{errc::pending_append, "swap_out: the sequence's bytes for this step are not in place; swap after begin_step"};
    }
    return ok_status();
  }

  /// Fills scratch_ with the distinct blocks the tables of `group` reference, in first-use order, marking each in
  /// `map` (which must hold -1 for all of them) with -2. The caller resets the marks.
  void collect_distinct(std::span<const seq_id> group, std::vector<block_id>& map) {
    scratch_.clear();
    for (const seq_id id : group)
      for (const block_id b : seqs_[static_cast<std::size_t>(index_.find(id))].blocks)
        if (map[static_cast<std::size_t>(b)] == -1) {
          map[static_cast<std::size_t>(b)] = -2;
          scratch_.push_back(b);
        }
  }

  /// Drops one reference to host block `hb`; at zero it returns to the host pool at the next step (a swap-in in this
  /// step may still read it).
  void release_host_ref(block_id hb) {
    if (--host_refs_[static_cast<std::size_t>(hb)] == 0) host_deferred_.push_back(hb);
  }

  /// Before sequence `h` is freed: its appended ranges of this step are cancelled (slot -1, and a block those
  /// tokens would fill is not cached), except in blocks that another sequence shares (a prefix hit in this step
  /// on a block this sequence fills): those slots are kept.
  void cancel_appends(std::int32_t h, const seq_state& s) {
    const std::span<const token_range> ranges = plan_.appends();
    const std::int64_t bs = cfg_.block_size;
    frozen_offset_.resize(ranges.size(), -1);  // sized lazily: only steps that free an appending sequence pay
    for (std::size_t r = 0; r < ranges.size(); ++r) {
      if (append_owner_[r] != h) continue;
      append_owner_[r] = -1;
      const token_range& tr = ranges[r];
      const std::int64_t end = std::int64_t{tr.first_pos} + tr.count;
      bool any_shared = false;
      for (std::int64_t i = tr.first_pos / bs; i * bs < end; ++i) {  // per block the range touches
        const block_id b = s.blocks[static_cast<std::size_t>(i)];
        if (pool_.refcount(b) > 1) {
          any_shared = true;
          mark_busy(b);  // its kept writes are pending: if the sharers let go too, park it until the step ran
        } else if (share_.is_cached(b)) {
          drop_content(b);  // its content will never be written
        }
      }
      if (!any_shared) continue;  // frozen_offset_ stays -1: every slot exports as -1
      frozen_offset_[r] = static_cast<std::int64_t>(frozen_slots_.size());
      for (std::int64_t p = tr.first_pos; p < end; ++p) {
        const block_id b = s.blocks[static_cast<std::size_t>(p / bs)];
        frozen_slots_.push_back(pool_.refcount(b) > 1 ? std::int64_t{b} * bs + p % bs : -1);
      }
    }
  }

  static constexpr std::uint8_t busy_flag = 1;      ///< source or destination of a copy planned this step
  static constexpr std::uint8_t deferred_flag = 2;  ///< and unreferenced: in deferred_

  cache_config cfg_;
  block_pool<A> pool_;
  [[no_unique_address]] E evict_;
  [[no_unique_address]] S share_;
  [[no_unique_address]] W swap_;
  std::vector<seq_state> seqs_;
  std::vector<std::int32_t> free_handles_;
  id_map index_;
  step_plan plan_;
  std::vector<std::int32_t> append_owner_;  ///< handle per plan_.appends() entry; -1 once that sequence is freed
  std::vector<std::int64_t> frozen_offset_;  ///< per freed entry: where its slots start in frozen_slots_; -1 = all -1
  std::vector<std::int64_t> frozen_slots_;   ///< slots (or -1) of entries whose sequence was freed in this step
  std::vector<std::uint8_t> busy_;          ///< per block: busy_flag | deferred_flag
  std::vector<block_id> busy_list_;
  std::vector<std::pair<block_id, retention_hint>> deferred_;  ///< settled at the next begin_step
  std::vector<block_id> hits_;              ///< scratch for add_sequence's lookup
  std::int32_t pending_ = 0;                ///< deferred blocks still unreferenced
  std::vector<block_id> dev_map_;           ///< swap_out scratch: device block -> host block (-1 unset)
  std::vector<block_id> host_map_;          ///< swap_in scratch: host block -> device block (-1 unset)
  std::vector<std::uint8_t> host_first_use_;  ///< swap_in scratch
  std::vector<std::int32_t> host_refs_;     ///< references to each host block from swapped sequences
  std::vector<block_id> host_deferred_;     ///< host blocks freed in this step, returned at the next
  std::vector<block_id> scratch_;
  std::vector<block_id> id_scratch_;
  std::int32_t swapped_ = 0;
  std::int64_t swapped_out_blocks_ = 0;
  std::int64_t swapped_in_blocks_ = 0;
  std::int64_t preempted_swap_ = 0;
  std::int64_t preempted_recompute_ = 0;
  std::uint64_t step_ = 0;
  std::int64_t tokens_ = 0;
  std::int64_t cow_copies_ = 0;
  std::int64_t fork_copies_ = 0;
  std::int64_t evictions_ = 0;
  std::int64_t prefix_query_tokens_ = 0;
  std::int64_t prefix_hit_tokens_ = 0;
};

KVPAGER_NAMESPACE_END
