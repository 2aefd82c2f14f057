// SPDX-License-Identifier: Apache-2.0
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
///   cache.append_token(other_id, next_token);    // decode: a new block exactly when the last one is full
///   run copies in cache.plan().copies();         // copy_blocks
///   cache.export_slot_mapping(slots);            // kv_append
///   cache.export_block_table(ids, table, stride, seq_lens);   // paged attention
/// \endcode

#include <algorithm>
#include <cstdint>
#include <new>
#include <span>
#include <utility>
#include <vector>

#include "kvpager/allocator/free_list_allocator.hpp"
#include "kvpager/cache/detail/block_store.hpp"
#include "kvpager/cache/cache_types.hpp"
#include "kvpager/cache/detail/copy_on_write.hpp"
#include "kvpager/cache/detail/exports.hpp"
#include "kvpager/cache/detail/external_book.hpp"
#include "kvpager/cache/detail/prefix_cursor.hpp"
#include "kvpager/cache/detail/sequence_table.hpp"
#include "kvpager/cache/detail/step_ledger.hpp"
#include "kvpager/cache/detail/swap_book.hpp"
#include "kvpager/cache/detail/tier_link.hpp"
#include "kvpager/concepts/block_allocator.hpp"
#include "kvpager/concepts/eviction_policy.hpp"
#include "kvpager/concepts/sharing_policy.hpp"
#include "kvpager/concepts/swap_policy.hpp"
#include "kvpager/concepts/tier_policy.hpp"
#include "kvpager/core/block_pool.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/kv_events.hpp"
#include "kvpager/core/span_of.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/core/types.hpp"
#include "kvpager/eviction/no_eviction.hpp"
#include "kvpager/sharing/refcount_sharing.hpp"
#include "kvpager/swap/no_swap.hpp"

KVPAGER_NAMESPACE_BEGIN

/// The composer of the public operations. Its state lives in parts with one job each: the sequence_table (ids,
/// block tables, one checked lookup), the block_store (device blocks across pool, eviction and sharing), the
/// step_ledger (the plan, parked blocks, cancelled appends), the swap_book (host-side bookkeeping), and the
/// prefix_cursors (hash-chain positions and the prefix lookup). Its read side (token counts, block tables, kernel
/// exports) comes from its base detail::cache_exports (detail/exports.hpp). The parts live in cache/detail/
/// (namespace kvpager::detail): implementation, tested alone, not API. Every public operation validates first, then mutates.
template <block_allocator A = free_list_allocator, eviction_policy E = no_eviction,
          sharing_policy S = refcount_sharing, swap_policy W = no_swap, cache_tier T = no_tier>
class paged_kv_cache : public detail::cache_exports<paged_kv_cache<A, E, S, W, T>> {
  friend class detail::cache_exports<paged_kv_cache>;
  static_assert(detail::free_order_fits<A, E>,
                "this eviction policy evicts in the allocator's free order: pair it with the allocator it names "
                "(lru_eviction needs free_list_allocator)");
  static_assert(std::same_as<T, no_tier> || chained_content_cache<S>,
                "a host tier keeps prefix-cache blocks by their chained hashes: pair it with prefix_caching (a "
                "chained_content_cache)");

  using tier_type = detail::tier_link<T>;
  using cursor_type = detail::prefix_cursor_t<S>;
  using cursor_ops = detail::prefix_cursors<S>;
  using table_type = detail::sequence_table<cursor_type>;
  using seq_state = typename table_type::state;

 public:
  using allocator_policy = A;
  using eviction_policy_type = E;
  using sharing_policy_type = S;
  using swap_policy_type = W;
  using tier_policy_type = T;
  /// The policy objects create takes, by name (cache_types.hpp).
  using policies = cache_policies<A, E, S, W, T>;

  /// Validates `cfg` and builds an empty cache from the policy objects `p`, by name, defaults for those left out
  /// (`create(cfg, {.sharing = prefix_caching(h)})`); never throws (an exception other than an allocation failure
  /// that a user-written policy's reset throws passes through). Errors: errc::invalid_block_size (not a positive
  /// power of two), errc::invalid_pool_size (no usable block, negative num_host_blocks), errc::invalid_argument
  /// (negative max_blocks_per_seq), errc::out_of_memory (the bookkeeping below could not be allocated,
  /// std::bad_alloc; everything allocated so far is freed again, detail = num_blocks. Built
  /// without exceptions, a failed allocation ends the program instead). All sizes are computed in 64 bits.
  ///
  /// Host memory allocated here, per device block: 4 bytes of reference count plus the allocator's links (8 bytes
  /// for free_list_allocator), 5 bytes of step bookkeeping, and each policy's per-block state: 0 for lru_eviction
  /// and no_eviction, about 36 bytes for the heap-ordered indexed policies, 12 bytes for prefix_caching (its
  /// content entries, with block_size token ids each for hit verification, are allocated later, as blocks are
  /// cached: see prefix_caching.hpp); plus 21 bytes per host block (the host block_pool's refcount and links, the
  /// swap book's maps). With a host tier (T not no_tier): about 37 bytes per device block (the retention priority of
  /// its content, the write-through queue, scratch for a step's loads and stores) and the tier's own per host block
  /// (host_tier::create). Errors for the tier (cfg.host_tier, nothing created): errc::invalid_argument (tier blocks
  /// without a tier policy; options that contradict, validate), errc::invalid_pool_size (a tier policy without
  /// blocks). Per sequence, its block table and (content caches) the token ids of its last, partial block.
  [[nodiscard]] static result<paged_kv_cache> create(cache_config cfg, policies p = {});

  // Copyable and movable (nothrow) as its members are; declared here so that they too are compiled once with the
  // named compositions (KVPAGER_EXTERN_COMPOSITIONS, core/config.hpp).
  paged_kv_cache(const paged_kv_cache&);
  paged_kv_cache(paged_kv_cache&&) noexcept;
  paged_kv_cache& operator=(const paged_kv_cache&);
  paged_kv_cache& operator=(paged_kv_cache&&) noexcept;
  ~paged_kv_cache();

  /// create, with the pool's geometry (cfg.geometry()) checked by `check` first (after validate(cfg)): its error is
  /// returned as it is and nothing is created. `create(cfg, kvpager::can_implement)` refuses a pool the compiled
  /// kernels cannot run, so an engine learns it at creation, not at its first kernel call.
  [[nodiscard]] static result<paged_kv_cache> create(cache_config cfg, geometry_check check, policies p = {});

  // ------------------------------------------------------------------------------------------------ sequences

  /// Prefill by count: adds sequence `id` with a `num_tokens`-token prompt, taking ceil(num_tokens / block_size)
  /// blocks in one all-or-nothing batch, and plans the prompt's slots. Its blocks are not content-cached (no token
  /// ids). Errors: errc::invalid_argument (num_tokens <= 0 or over max_blocks_per_seq),
  /// errc::duplicate_sequence, errc::out_of_blocks (detail = blocks needed).
  status add_sequence(seq_id id, std::int32_t num_tokens);

  /// Prefill with token ids: like the count overload, but first reuses the longest cached prefix of full blocks
  /// (with a content_cache sharing policy; capped so the last token is always computed), takes the remaining
  /// blocks, and commits every full block to the cache. With a host tier, the blocks after the device's hit that
  /// the tier holds ready are loaded into new blocks (swap-ins of the plan from host blocks num_host_blocks + i),
  /// within the same cap. Only the tokens after the hit (device and host) get slots in the plan.
  /// `*hit` (if given) receives what the lookup found. `known`: the chained hashes of the tokens' first full
  /// blocks from an earlier admission (block_hashes, before a preemption by recompute), not computed again.
  /// Same errors as the count overload.
  status add_sequence(seq_id id, std::span<const token_id> tokens, sequence_options options = {},
                      prefix_match* hit = nullptr, std::span<const std::uint64_t> known = {});

  /// The prefix-cache lookup add_sequence(id, tokens, options) would do, without changing anything: the hit and
  /// the number of blocks the admission would take. errc::invalid_argument for an empty prompt.
  [[nodiscard]] result<prefix_match> match_prefix(std::span<const token_id> tokens,
                                                  sequence_options options = {}) const noexcept;

  /// match_prefix, keeping the hit (its blocks, the block hashes it computed, the cache's generation) in `hit` for
  /// add_sequence(id, tokens, options, hit), in the same single pass over the blocks; `known` as in add_sequence.
  /// errc::invalid_argument for an empty prompt (hit emptied). Allocates only when `hit`'s buffers grow.
  status match_prefix(std::span<const token_id> tokens, sequence_options options, prefix_hit& hit,
                      std::span<const std::uint64_t> known = {}) const;

  /// Prefill consuming `hit`, a match_prefix of (at least) these tokens with these options: no block is looked up
  /// again (a shorter prefix of the looked-up tokens takes the hit blocks it can use, capped below its last token).
  /// errc::stale_prefix_hit when a block was cached or evicted since the lookup, or `hit` was made for other
  /// options or fewer tokens (nothing changed: look up again); otherwise as add_sequence(id, tokens, options).
  status add_sequence(seq_id id, std::span<const token_id> tokens, sequence_options options, const prefix_hit& hit,
                      prefix_match* out = nullptr);

  /// Decode by count: appends `n` tokens (default 1) to sequence `id`. Takes a new block exactly when the token
  /// count exceeds blocks x block_size; writing into a shared, partly filled last block first copies it
  /// (copy-on-write: a fresh block and a (src, dst) pair in the plan). All or nothing. The sequence's later blocks
  /// are no longer content-cached (their token ids are unknown). The count is a token_count, so a token id cannot
  /// be passed by mistake (see append_token). Errors: errc::invalid_argument (n <= 0, or over
  /// max_blocks_per_seq), errc::unknown_sequence, errc::sequence_swapped, errc::out_of_blocks.
  status append_tokens(seq_id id, token_count n = token_count{1});

  /// Decode one token with its id: append_tokens(id, {&token, 1}). Same errors.
  status append_token(seq_id id, token_id token) { return append_tokens(id, std::span<const token_id>(&token, 1)); }

  /// Decode with token ids: like the count overload; every block the tokens fill is committed to the content
  /// cache (for sequences added with token ids). Errors as the count overload (an empty span is invalid).
  status append_tokens(seq_id id, std::span<const token_id> tokens);

  /// Forks `child` from `parent`: the child starts with the parent's first `num_tokens` tokens (all of them when
  /// num_tokens is 0; a shared system prompt when fewer). With fork_mode::share the child references the
  /// parent's blocks; with fork_mode::copy it gets fresh blocks and the plan copies them (all or nothing).
  /// Errors: errc::unknown_sequence (parent), errc::duplicate_sequence (child is live or equals parent),
  /// errc::invalid_argument (num_tokens < 0 or over the parent's length), errc::sequence_swapped (parent),
  /// errc::pending_append (the parent's tokens appended in this step are not written yet: fork after begin_step),
  /// errc::out_of_blocks (copy mode).
  status fork(seq_id parent, seq_id child, std::int32_t num_tokens = 0);

  /// Frees sequence `id`: references are dropped last block first (so with LRU the tail of a chain is reclaimed
  /// before its head); a block whose count reaches zero returns to the pool (or stays cached, per the eviction
  /// policy). Tokens it appended in this step are not computed: their slots export as -1 and blocks they would
  /// have filled are not cached, except in blocks another sequence already shares through a prefix hit in this
  /// step, whose content that sequence needs: those slots are kept, and the engine must still write them.
  /// Error: errc::unknown_sequence (never added or already freed).
  status free_sequence(seq_id id);

  // ------------------------------------------------------------------------------------------------ memory pressure

  /// Swaps the sequences in `group` out to host memory together: every distinct device block they reference gets
  /// one host block (a block shared within the group is swapped once, and shared again on swap-in), the plan lists
  /// the (device, host) copies, and their device references are dropped (blocks still used by other sequences stay
  /// on device). All or nothing. Errors: errc::unsupported (no host pool), errc::unknown_sequence,
  /// errc::invalid_argument (an id listed twice), errc::sequence_swapped (already out), errc::pending_append
  /// (bytes of this step not in place yet: swap after begin_step), errc::host_pool_full (detail = blocks needed).
  /// A swapped sequence stops prefix-caching its later blocks.
  status swap_out(std::span<const seq_id> group);
  status swap_out(seq_id id) { return swap_out(std::span<const seq_id>(&id, 1)); }

  /// Swaps the sequences in `group` back in, all or nothing: each distinct host block gets one device block
  /// (sharing within the group is restored) and the plan lists the (host, device) copies. Their bytes arrive with
  /// this step's plan, so they can be forked or swapped out again only from the next step. Errors:
  /// errc::unknown_sequence, errc::invalid_argument (an id listed twice), errc::sequence_swapped (not swapped out),
  /// errc::out_of_blocks (detail = device blocks needed).
  status swap_in(std::span<const seq_id> group);
  status swap_in(seq_id id) { return swap_in(std::span<const seq_id>(&id, 1)); }

  /// Preempts sequence `id` as the swap policy decides for its block count: preempt_action::swap swaps it out
  /// (it stays live, swapped); preempt_action::recompute frees it (the engine re-adds its tokens later). Errors:
  /// errc::unsupported (the policy does not preempt), errc::unknown_sequence, errc::sequence_swapped, and those of
  /// swap_out.
  /// What preempt(id) would do now, changing nothing (preempt_action::unsupported where the policy does not
  /// preempt). Errors: errc::unknown_sequence, errc::sequence_swapped.
  [[nodiscard]] result<preempt_action> preempt_decision(seq_id id) const;
  result<preempt_action> preempt(seq_id id);

  /// Starts a new step: the previous plan is taken as executed, it is cleared, and blocks that planned copies
  /// kept busy become reusable. O(blocks touched by the previous plan).
  void begin_step();

  /// The byte movement planned since the last begin_step().
  [[nodiscard]] const step_plan& plan() const noexcept { return ledger_.plan(); }

  // ------------------------------------------------------------------------------------------------ host tier

  /// Host tier transfers (host_tier_options::async) the engine finished: each entry is a load (a swap-in) or store
  /// (a swap-out) of the plan into a tier host block, as planned, ok or failed, reported once, in any step after it
  /// was planned. A store completes (its host copy loadable) or is forgotten (failed: recomputed when needed), and
  /// a write-through store's source block is released. A load unpins its host block (a failed one's copy is
  /// forgotten: it is never loaded again); when a waiting sequence's loads are all in, its loaded blocks are
  /// committed to the prefix cache and tier_load_state says none: it runs as any other; when one fails it says
  /// failed (the blocks that arrived before are committed): free it and admit it again. The block of a load whose
  /// sequence was freed is released now. Errors (nothing changed): errc::unsupported (no tier, or synchronous
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
    if (!seqs_.contains(id)) return status{errc::unknown_sequence, "load_state: unknown sequence id"};
    if (const detail::external_wait* w = external_.find(id)) return w->state;
    if constexpr (tier_type::enabled) return tier_.load_state(id);
    return tier_load_state::none;
  }

  // ------------------------------------------------------------------------------------------------ external KV

  /// The blocks of sequence `id` waiting for KV from outside (sequence_options::external_tokens): where in its
  /// block table (export_block_table) the engine receives them. errc::unknown_sequence for an id not live;
  /// errc::invalid_argument for a sequence that waits for none (never did, or was reported).
  [[nodiscard]] result<external_range> external_blocks(seq_id id) const noexcept {
    return external_.range(id, seqs_.contains(id));
  }

  /// The engine received sequence `id`'s external KV (`ok`): its blocks are committed to the prefix cache (and
  /// announced as KV cache events) and load_state says none: it runs as a prefix hit of those tokens. Not `ok`
  /// (the transfer failed or timed out): load_state says failed and nothing is committed: free the sequence and
  /// admit it again without external tokens (the scheduler does). A sequence freed while it waited keeps its
  /// external blocks (a read in flight may still write into them) until this call reports it: they are freed then.
  /// Errors (nothing changed): errc::unknown_sequence; errc::invalid_argument for a sequence not waiting for
  /// external KV.
  status complete_external(seq_id id, bool ok) {
    return external_.complete(
        id, ok, seqs_.contains(id), [this](block_id b) { release(b, retention_hint{}); },
        [this](const detail::external_wait& w) {
          seq_state& s = seqs_.at(w.id);
          commit_arrived(s, w.range.first, detail::span_of(w.tokens), prompt_hashes{}, s.extra_key);
        });
  }

  // ------------------------------------------------------------------------------------------------ KV cache events

  /// From now on the cache reports what its prefix cache holds into `*out` (core/kv_events.hpp; nullptr stops it):
  /// a block_stored for blocks as they are cached, a block_removed as their content is discarded, all on the
  /// device medium, group 0, hashes as block_hashes() gives them. The caller takes the events (once per step) and
  /// clears the buffer; recording allocates only while the buffer grows. Attach before anything is cached, so the
  /// events describe the whole cache. Errors: errc::invalid_argument (blocks are cached already: the events would
  /// miss them), errc::unsupported (a content cache without block hashes), errc::out_of_memory (the per-block
  /// record, 16 bytes a block, allocated on the first attach); nothing changed.
  status set_kv_event_buffer(kv_event_buffer* out) {
    if constexpr (content_cache<S> && !prehashed_content_cache<S>) {
      if (out != nullptr)
        return status{errc::unsupported, "set_kv_event_buffer: the sharing policy gives no block hashes"};
    }
    status st = blocks_.attach_events(out);
    if constexpr (tier_type::enabled) {
      if (st) tier_.set_events(out);
    }
    return st;
  }

  /// Forgets every cached block (vLLM's reset_prefix_cache): their content is discarded and they return to the
  /// free blocks; the events report one all_blocks_cleared. A host tier forgets its blocks too. Only when no block is
  /// in use: errc::invalid_block while a sequence is live, a block waits for a planned copy or a host tier load or
  /// store is in flight (call begin_step first); nothing changed.
  status reset_prefix_cache() {
    if (seqs_.size() > 0 || ledger_.pending_free() > 0 || !external_.empty())
      return status{errc::invalid_block, "reset_prefix_cache: blocks are in use", stats().used};
    if constexpr (tier_type::enabled) {
      if (tier_.in_flight())
        return status{errc::invalid_block, "reset_prefix_cache: host tier loads or stores are in flight (begin_step)"};
      tier_.reset();
    }
    if constexpr (content_cache<S>) blocks_.clear_content();
    return ok_status();
  }

  // ------------------------------------------------------------------------------------------------ queries

  [[nodiscard]] bool contains(seq_id id) const noexcept { return seqs_.contains(id); }
  [[nodiscard]] std::int32_t num_sequences() const noexcept { return seqs_.size(); }
  [[nodiscard]] std::int32_t block_size() const noexcept { return cfg_.block_size; }
  [[nodiscard]] const cache_config& config() const noexcept { return cfg_; }
  /// The pool's geometry (config().geometry()): what the kernels' views and layouts of this cache derive from.
  [[nodiscard]] constexpr kv_geometry geometry() const noexcept { return cfg_.geometry(); }

  /// Reference count of block `b` (0 when free, parked, reserved or out of range).
  [[nodiscard]] std::int32_t refcount(block_id b) const noexcept { return blocks_.refcount(b); }
  /// Whether `b` is in the allocator's free set.
  [[nodiscard]] bool is_free(block_id b) const noexcept { return blocks_.pool().is_free(b); }

  /// Blocks an allocation can use now (free + evictable).
  [[nodiscard]] std::int64_t available_blocks() const noexcept { return blocks_.available(); }
  /// Blocks a prompt of `num_tokens` tokens needs (without prefix hits).
  [[nodiscard]] std::int64_t blocks_needed(std::int64_t num_tokens) const noexcept {
    return blocks_for_tokens(num_tokens, cfg_.block_size);
  }

  /// A snapshot of the counts, each part reporting its own. O(1).
  [[nodiscard]] cache_stats stats() const noexcept;

  [[nodiscard]] const block_pool<A>& pool() const noexcept { return blocks_.pool(); }
  [[nodiscard]] const E& eviction() const noexcept { return blocks_.eviction(); }
  [[nodiscard]] const S& sharing() const noexcept { return blocks_.sharing(); }
  [[nodiscard]] const W& swap() const noexcept { return book_.policy(); }
  /// The host tier (a cache with a tier policy): which content it holds, its states and counts (host_tier_stats).
  /// Its host blocks are the executors' host blocks num_host_blocks + i (cache_config::host_pool_blocks()).
  [[nodiscard]] const auto& tier() const noexcept
    requires tier_type::enabled
  {
    return tier_.tier();
  }
  /// The host (swap) pool, whose refcounts are the references of swapped-out tables; nullptr without one.
  [[nodiscard]] const block_pool<lifo_allocator>* host_pool() const noexcept { return book_.host_pool(); }

 private:
  paged_kv_cache(cache_config cfg, block_pool<A> pool, E e, S s, W w, detail::tier_link<T> t);
  /// Reports block `b` (block `i` of `s`), just committed, to the KV cache events (if attached and it was cached).
  void announce_stored(const seq_state& s, block_id b, std::int32_t i, std::span<const token_id> tokens) noexcept {
    if constexpr (prehashed_content_cache<S>) {
      if (blocks_.events() == nullptr) return;
      const S& share = blocks_.sharing();
      const block_id parent = i > 0 ? s.blocks[static_cast<std::size_t>(i - 1)] : no_block;
      const bool has_parent = parent != no_block && share.is_cached(parent);
      blocks_.announce_stored(b, share.block_hash(b), has_parent, has_parent ? share.block_hash(parent) : 0, 0,
                              tokens);
    } else {
      (void)s, (void)b, (void)i, (void)tokens;
    }
  }
  /// The commit hook of sequence `s` (prefix_cursors::commit_prompt, extend): announce_stored of each block.
  [[nodiscard]] auto announcer(const seq_state& s) noexcept {
    return [this, &s](block_id b, std::int32_t i, std::span<const token_id> t) {
      announce_stored(s, b, i, t);
      if constexpr (tier_type::enabled) tier_.committed(b, s.priority);
    };
  }

  /// The host tier's part of a prompt's lookup: the chained hashes of its full blocks after the device's `k` hits
  /// (`last_hit` the last of them), below the cap that keeps the last token computed, each passed to `visit(key)`
  /// until it returns false. `ph`: hashes known from the request or the device lookup (not computed again).
  template <class Visit>
  void tier_keys(std::span<const token_id> tokens, std::uint64_t extra_key, std::int32_t k, block_id last_hit,
                 const prompt_hashes& ph, Visit&& visit) const {
    if constexpr (tier_type::enabled) {
      const S& share = blocks_.sharing();
      const std::int32_t cap = (static_cast<std::int32_t>(tokens.size()) - 1) / cfg_.block_size;
      std::uint64_t prev = k > 0 ? share.block_hash(last_hit) : 0;
      for (std::int32_t i = k; i < cap; ++i) {
        const auto t = cursors_.block_tokens(tokens, i);
        const std::uint64_t* known = ph.find(i);
        const std::uint64_t h = known != nullptr ? *known
                                : i == 0         ? share.hash(share.first_cursor(extra_key), t)
                                                 : share.chained_hash(prev, t);
        if (!visit(h)) return;
        prev = h;
      }
    } else {
      (void)tokens, (void)extra_key, (void)k, (void)last_hit, (void)ph, (void)visit;
    }
  }

  /// Adds the host tier's part to device lookup `m` (its last hit block `last_hit`): the blocks after the device's
  /// that the tier can load now.
  void add_tier_part(prefix_match& m, std::span<const token_id> tokens, std::uint64_t extra_key, block_id last_hit,
                     const prompt_hashes& ph) const {
    if constexpr (tier_type::enabled) {
      std::int32_t t = 0;
      tier_keys(tokens, extra_key, m.blocks, last_hit, ph, [&](std::uint64_t h) {
        if (!tier_.ready(h)) return false;
        ++t;
        return true;
      });
      m.host_blocks = t;
      m.tokens = (m.blocks + t) * cfg_.block_size;
    } else {
      (void)m, (void)tokens, (void)extra_key, (void)last_hit, (void)ph;
    }
  }

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

  /// Blocks [first, tokens.size() / block_size) of sequence `s` arrived (host tier loads, external KV): committed
  /// to the prefix cache as its admission would have (their KV cache events too), chained after block first - 1.
  void commit_arrived(seq_state& s, std::int32_t first, std::span<const token_id> tokens, const prompt_hashes& ph,
                      std::uint64_t extra_key) {
    if constexpr (content_cache<S>) {
      const S& share = blocks_.sharing();
      cursor_type cur = first == 0 ? share.first_cursor(extra_key)
                                   : share.cursor_after(s.blocks[static_cast<std::size_t>(first - 1)]);
      cursors_.commit_prompt(blocks_.sharing(), s, cur, tokens, first, ph, announcer(s));
    } else {
      (void)s, (void)first, (void)tokens, (void)ph, (void)extra_key;
    }
  }

  /// A sequence's loads are resolved (all in, or one failed or timed out): the blocks that arrived before the first
  /// that did not are committed to the prefix cache, as its admission would have (their KV cache events too).
  void commit_loaded(const detail::pending_load& p) {
    if constexpr (tier_type::enabled) {
      const std::int32_t g = p.good();
      if (g == 0) return;
      const auto tokens = std::span<const token_id>(p.tokens).first(static_cast<std::size_t>(p.first + g) *
                                                                    static_cast<std::size_t>(cfg_.block_size));
      commit_arrived(seqs_.at(p.id), p.first, tokens, prompt_hashes{detail::span_of(p.hashes)}, p.extra_key);
    } else {
      (void)p;
    }
  }



  [[nodiscard]] bool exceeds_table_limit(std::int64_t blocks) const noexcept {
    return cfg_.max_blocks_per_seq > 0 && blocks > cfg_.max_blocks_per_seq;
  }

  /// Whether a hit block takes allocatable capacity (cursor_ops::match).
  [[nodiscard]] auto consumes() const noexcept {
    return [this](block_id b) noexcept { return blocks_.consumes_capacity(b); };
  }

  /// Prefill shared by the add_sequence overloads; `tokens` is empty for the count overload; `given`: a
  /// match_prefix hit to consume instead of looking the blocks up.
  status add_impl(seq_id id, std::int32_t n, std::span<const token_id> tokens, sequence_options options,
                  prefix_match* hit, const prefix_hit* given = nullptr, std::span<const std::uint64_t> known = {});

  /// Slots for `n` more tokens of sequence `h` (copy-on-write of a shared partial last block, new blocks), all or
  /// nothing, and their range in the plan.
  status grow(std::int32_t h, std::int32_t n);

  /// Drops one reference to device block `b`; at zero it is parked while a planned copy uses it, else settled.
  void release(block_id b, retention_hint hint);

  cache_config cfg_;
  detail::block_store<A, E, S> blocks_;
  detail::swap_book<W> book_;
  detail::step_ledger ledger_;
  table_type seqs_;
  cursor_ops cursors_;
  std::vector<block_id> hits_;  ///< scratch for add_sequence's lookup
  cache_stats counts_;           ///< the counters of stats() the composer keeps (tokens, copies, prefix, preempts)
  tier_type tier_;               ///< the host tier (empty without one)
  detail::external_book external_;  ///< sequences waiting for (or failed to get) external KV
};

// ------------------------------------------------------------------------------------------------ definitions

template <block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE paged_kv_cache<A, E, S, W, T>::paged_kv_cache(const paged_kv_cache&) = default;
template <block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE paged_kv_cache<A, E, S, W, T>::paged_kv_cache(paged_kv_cache&&) noexcept = default;
template <block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto paged_kv_cache<A, E, S, W, T>::operator=(const paged_kv_cache&) -> paged_kv_cache& = default;
template <block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto paged_kv_cache<A, E, S, W, T>::operator=(paged_kv_cache&&) noexcept -> paged_kv_cache& = default;
template <block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE paged_kv_cache<A, E, S, W, T>::~paged_kv_cache() = default;

template <block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto paged_kv_cache<A, E, S, W, T>::create(cache_config cfg, policies p) -> result<paged_kv_cache> {
  return create(cfg, geometry_check{nullptr}, std::move(p));
}

template <block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto paged_kv_cache<A, E, S, W, T>::create(cache_config cfg, geometry_check check, policies p)
    -> result<paged_kv_cache> {
  if (status st = validate(cfg); !st) return st;
  if (check.fn != nullptr) {
    if (status st = check.fn(cfg.geometry()); !st) return st;
  }
#if KVPAGER_HAS_EXCEPTIONS
  try {
#endif
    auto link = tier_type::create(cfg, std::move(p.tier));
    if (!link) return link.error();
    auto pool = block_pool<A>::create({cfg.num_blocks, cfg.reserved_blocks}, std::move(p.allocator));
    if (!pool) return pool.error();
    return paged_kv_cache(cfg, std::move(*pool), std::move(p.eviction), std::move(p.sharing), std::move(p.swap),
                          std::move(*link));
#if KVPAGER_HAS_EXCEPTIONS
  } catch (const std::bad_alloc&) {
    return status{errc::out_of_memory, "paged_kv_cache::create: not enough host memory for the cache's bookkeeping",
                  cfg.num_blocks};
  }  // std::length_error cannot come from here: every container holds at most an int32 count of small elements
#endif
}

template <block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto paged_kv_cache<A, E, S, W, T>::add_sequence(seq_id id, std::int32_t num_tokens) -> status {
  if (num_tokens <= 0)
    return status{errc::invalid_argument, "add_sequence: num_tokens must be positive", num_tokens};
  return add_impl(id, num_tokens, {}, sequence_options{}, nullptr);
}

template <block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto paged_kv_cache<A, E, S, W, T>::add_sequence(seq_id id, std::span<const token_id> tokens,
                                                                  sequence_options options, prefix_match* hit,
                                                                  std::span<const std::uint64_t> known) -> status {
  if (status st = cursor_ops::template check_prompt<"add_sequence">(tokens); !st) return st;
  return add_impl(id, static_cast<std::int32_t>(tokens.size()), tokens, options, hit, nullptr, known);
}

template <block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto paged_kv_cache<A, E, S, W, T>::match_prefix(std::span<const token_id> tokens,
                                                                  sequence_options options)
    const noexcept -> result<prefix_match> {
  if (status st = cursor_ops::template check_prompt<"match_prefix">(tokens); !st) return st;
  block_id last = no_block;
  prefix_match m =
      cursors_.match(blocks_.sharing(), tokens, options.extra_key, consumes(), [&last](block_id b) noexcept { last = b; });
  add_tier_part(m, tokens, options.extra_key, last, {});
  return m;
}

template <block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto paged_kv_cache<A, E, S, W, T>::match_prefix(std::span<const token_id> tokens,
                                                                  sequence_options options, prefix_hit& hit,
                                                                  std::span<const std::uint64_t> known)
    const -> status {
  hit.blocks.clear();
  hit.known_hashes.assign(known.begin(), known.end());
  hit.num_tokens = 0;
  if (status st = cursor_ops::template check_prompt<"match_prefix">(tokens); !st) return st;
  prompt_hashes ph{known};
  hit.match = cursors_.match(
      blocks_.sharing(), tokens, options.extra_key, consumes(), [&](block_id b) { hit.blocks.push_back(b); }, &ph);
  hit.miss_hash = ph.miss;
  hit.miss_at = ph.miss_at;
  add_tier_part(hit.match, tokens, options.extra_key, hit.blocks.empty() ? no_block : hit.blocks.back(), ph);
  hit.generation = cursor_ops::generation(blocks_.sharing());
  if constexpr (tier_type::enabled) hit.tier_generation = tier_.generation();
  hit.extra_key = options.extra_key;
  hit.num_tokens = static_cast<std::int32_t>(tokens.size());
  return ok_status();
}

template <block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto paged_kv_cache<A, E, S, W, T>::add_sequence(seq_id id, std::span<const token_id> tokens,
                                                                  sequence_options options, const prefix_hit& hit,
                                                                  prefix_match* out) -> status {
  bool tier_fresh = true;
  if constexpr (tier_type::enabled) tier_fresh = hit.tier_generation == tier_.generation();
  if (!tier_fresh || !cursor_ops::fresh(blocks_.sharing(), hit, tokens.size(), options.extra_key))
    return status{errc::stale_prefix_hit, "add_sequence: the prefix hit is stale (the cache changed since "
                                          "match_prefix) or was made for other tokens or options"};
  if (status st = cursor_ops::template check_prompt<"add_sequence">(tokens); !st) return st;
  // A sharing policy without generation() cannot tell a stale hit: look the blocks up again for it.
  return add_impl(id, static_cast<std::int32_t>(tokens.size()), tokens, options, out,
                  cursor_ops::has_generation ? &hit : nullptr);
}

template <block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto paged_kv_cache<A, E, S, W, T>::append_tokens(seq_id id, token_count n) -> status {
  if (n.value <= 0) return status{errc::invalid_argument, "append_tokens: token count must be positive", n.value};
  const auto h = seqs_.template checked<"append_tokens">(id);
  if (!h) return h.error();
  if (status st = not_waiting<"append_tokens">(id); !st) return st;
  if (status st = grow(*h, n.value); !st) return st;
  cursors_.stop(seqs_[*h]);
  return ok_status();
}

template <block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto paged_kv_cache<A, E, S, W, T>::append_tokens(seq_id id, std::span<const token_id> tokens)
    -> status {
  if (tokens.empty() || tokens.size() > static_cast<std::size_t>(INT32_MAX))
    return status{errc::invalid_argument, "append_tokens: token count must be positive",
                  static_cast<std::int64_t>(tokens.size())};
  const auto h = seqs_.template checked<"append_tokens">(id);
  if (!h) return h.error();
  if (status st = not_waiting<"append_tokens">(id); !st) return st;
  const std::int32_t first = seqs_[*h].num_tokens;
  if (status st = grow(*h, static_cast<std::int32_t>(tokens.size())); !st) return st;
  seq_state& s = seqs_[*h];
  cursors_.extend(blocks_.sharing(), s, tokens, first, announcer(s));
  return ok_status();
}

template <block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto paged_kv_cache<A, E, S, W, T>::fork(seq_id parent, seq_id child, std::int32_t num_tokens)
    -> status {
  const auto ph = seqs_.template checked<"fork">(parent, detail::residency::any);
  if (!ph) return ph.error();
  if (child == parent || seqs_.contains(child))
    return status{errc::duplicate_sequence, "fork: child sequence id is already live"};
  const seq_state& p = seqs_[*ph];
  if (num_tokens < 0 || num_tokens > p.num_tokens)
    return status{errc::invalid_argument, "fork: num_tokens must be in [0, parent length]", num_tokens};
  if (p.swapped) return status{errc::sequence_swapped, "fork: the parent is swapped out; swap it in first"};
  if (p.append_step == ledger_.step())
    return status{errc::pending_append, "fork: the parent has tokens appended in this step; fork after begin_step"};
  if (status st = not_waiting<"fork">(parent); !st) return st;
  const std::int32_t tokens = num_tokens == 0 ? p.num_tokens : num_tokens;
  const auto k = static_cast<std::size_t>(blocks_for_tokens(tokens, cfg_.block_size));
  if constexpr (S::fork == fork_mode::copy) {
    if (static_cast<std::int64_t>(k) > available_blocks())
      return status{errc::out_of_blocks, "fork: not enough free blocks to copy the parent",
                    static_cast<std::int64_t>(k)};
  }

  const std::int32_t h = seqs_.insert(child);  // may reallocate the states: index by handle from here on
  seq_state& c = seqs_[h];
  const seq_state& ps = seqs_[*ph];
  c.blocks.resize(k);
  counts_.fork_copies += fork_blocks<S::fork>(blocks_, ledger_, ps.blocks, c.blocks);
  tier_evicted();
  if constexpr (S::fork == fork_mode::copy) c.append_step = ledger_.step();  // bytes arrive with the copies
  c.num_tokens = tokens;
  c.priority = ps.priority;
  cursors_.inherit(blocks_.sharing(), c, ps, tokens);
  counts_.tokens += tokens;
  return ok_status();
}

template <block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto paged_kv_cache<A, E, S, W, T>::free_sequence(seq_id id) -> status {
  const auto h = seqs_.template checked<"free_sequence">(id, detail::residency::any);
  if (!h) return h.error();
  seq_state& s = seqs_[*h];
  if (s.swapped) {
    book_.drop_table(s.blocks);
  } else {
    if (s.append_step == ledger_.step()) {  // not computed: slots -1, their blocks uncached, unless shared
      ledger_.cancel_appends(
          *h, s.blocks, cfg_.block_size, [this](block_id b) { return blocks_.refcount(b) > 1; },
          [this](block_id b) {
            if (blocks_.is_cached(b)) blocks_.drop_content(b);  // its content will never be written
          });
    }
    if constexpr (tier_type::enabled) tier_.drop_sequence(id, s.blocks);  // loads in flight keep their blocks
    // A read in flight may still write into the external blocks: they stay held (uncommitted, findable by nobody)
    // until complete_external(id) reports it. A failed read has ended: its blocks are freed now.
    detail::external_wait* w = external_.find(id);
    const bool orphan = w != nullptr && w->state == tier_load_state::loading;
    const auto in_flight = [&](std::size_t i) {
      return orphan && i >= static_cast<std::size_t>(w->range.first) &&
             i < static_cast<std::size_t>(w->range.first + w->range.count);
    };
    const retention_hint hint{s.priority};
    for (std::size_t i = s.blocks.size(); i-- > 0;) {
      if (s.blocks[i] == no_block) continue;
      if (in_flight(i)) {
        w->orphans.push_back(s.blocks[i]);
        continue;
      }
      release(s.blocks[i], hint);
    }
    if (w != nullptr && !orphan) external_.erase(id);
  }
  counts_.tokens -= s.num_tokens;
  seqs_.erase(*h);  // keeps the vectors' capacity for the next sequence in this handle
  return ok_status();
}

template <block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto paged_kv_cache<A, E, S, W, T>::swap_out(std::span<const seq_id> group) -> status {
  if (!book_.has_host_pool())
    return status{errc::unsupported, "swap_out: the cache has no host pool (num_host_blocks 0)"};
  if (status st = seqs_.template checked_group<"swap_out">(group, detail::residency::device, ledger_.step()); !st) return st;
  for (const seq_id id : group)
    if (status st = not_waiting<"swap_out">(id); !st) return st;
  const auto release_ref = [this](block_id b, retention_hint hint) { release(b, hint); };
  if (status st = book_.swap_out(group, seqs_, ledger_, release_ref); !st) return st;
  for (const seq_id id : group) cursors_.stop(seqs_.at(id));
  return ok_status();
}

template <block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto paged_kv_cache<A, E, S, W, T>::swap_in(std::span<const seq_id> group) -> status {
  if (status st = seqs_.template checked_group<"swap_in">(group, detail::residency::swapped, ledger_.step()); !st) return st;
  status st = book_.swap_in(group, seqs_, blocks_, ledger_);
  if (st) tier_evicted();
  return st;
}

template <block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto paged_kv_cache<A, E, S, W, T>::preempt_decision(seq_id id) const -> result<preempt_action> {
  const auto h = seqs_.template checked<"preempt">(id);
  if (!h) return h.error();
  if (status st = not_waiting<"preempt">(id); !st) return st;
  return book_.decide(static_cast<std::int32_t>(seqs_[*h].blocks.size()));
}

template <block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto paged_kv_cache<A, E, S, W, T>::preempt(seq_id id) -> result<preempt_action> {
  const auto d = preempt_decision(id);
  if (!d) return d;
  const preempt_action a = *d;
  switch (a) {
    case preempt_action::swap:
      if (status st = swap_out(id); !st) return st;
      ++counts_.preempted_swap;
      return a;
    case preempt_action::recompute:
      (void)free_sequence(id);
      ++counts_.preempted_recompute;
      return a;
    default:
      return status{errc::unsupported, "preempt: the swap policy does not preempt (no_swap)"};
  }
}

template <block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto paged_kv_cache<A, E, S, W, T>::begin_step() -> void {
  ledger_.begin_step([this](block_id b, retention_hint hint) {
    if (blocks_.refcount(b) == 0) blocks_.settle(b, hint);  // a prefix hit may have revived it
  });
  book_.begin_step();
  if constexpr (tier_type::enabled) {
    tier_.begin_step(
        [this](block_id b, std::uint64_t& key) {
          if (!blocks_.is_cached(b)) return false;
          key = blocks_.sharing().block_hash(b);
          return true;
        },
        [this](block_id b) {
          if (blocks_.touch(b)) ledger_.unpark();
        },
        [this](detail::pending_load& p) { commit_loaded(p); }, ledger_.step(), ledger_, counts_);
  }
}

template <block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto paged_kv_cache<A, E, S, W, T>::stats() const noexcept -> cache_stats {
  cache_stats s = counts_;
  s.block_size = cfg_.block_size;
  s.pending_free = ledger_.pending_free();
  s.sequences = seqs_.size();
  blocks_.report(s);
  book_.report(s);
  if constexpr (tier_type::enabled) s.tier_in_flight = tier_.num_in_flight();
  return s;
}

template <block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE paged_kv_cache<A, E, S, W, T>::paged_kv_cache(cache_config cfg, block_pool<A> pool, E e, S s, W w,
                                                                 detail::tier_link<T> t)
    : cfg_(cfg), blocks_(std::move(pool), std::move(e), std::move(s)), book_(std::move(w)), cursors_{cfg.block_size},
      tier_(std::move(t)) {
  const pool_geometry g{cfg.num_blocks, cfg.block_size, cfg.reserved_blocks};
  blocks_.reset(g);
  if constexpr (tier_type::enabled) {
    if (cfg.host_tier.write == tier_write::back) blocks_.log_evictions();
  }
  book_.reset(g, cfg.num_host_blocks);
  ledger_.reset(cfg.num_blocks);
}

template <block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto paged_kv_cache<A, E, S, W, T>::add_impl(seq_id id, std::int32_t n,
                                                              std::span<const token_id> tokens,
                                                              sequence_options options, prefix_match* hit,
                                                              const prefix_hit* given,
                                                              std::span<const std::uint64_t> known) -> status {
  if (seqs_.contains(id)) return status{errc::duplicate_sequence, "add_sequence: sequence id is already live"};
  if (external_.find(id) != nullptr)
    return status{errc::duplicate_sequence, "add_sequence: the id's external read is not reported yet (complete_external)"};
  if (options.external_tokens < 0 || (options.external_tokens > 0 && tokens.empty()))
    return status{errc::invalid_argument,
                  "add_sequence: external_tokens must be >= 0, and needs the prompt's token ids", options.external_tokens};
  const std::int64_t total = blocks_for_tokens(n, cfg_.block_size);
  if (exceeds_table_limit(total))
    return status{errc::invalid_argument, "add_sequence: prompt needs more than max_blocks_per_seq blocks", total};
  // Lookup (no mutation): the longest cached prefix, capped at n - 1 tokens.
  hits_.clear();
  std::int64_t needed = total;
  cursor_type cur{};
  const auto take = [&](block_id b) {
    hits_.push_back(b);
    if (!blocks_.consumes_capacity(b)) --needed;
  };
  prompt_hashes ph{known};
  if (given != nullptr) {  // the lookup is done: take its blocks, continue the chain after the last one
    cursors_.take(blocks_.sharing(), cur, *given, n, options.extra_key, take);
    ph = prompt_hashes{detail::span_of(given->known_hashes), given->miss_hash, given->miss_at};
  } else if (!tokens.empty()) {
    cursors_.walk(blocks_.sharing(), cur, tokens, options.extra_key, take, &ph);
  }
  if (needed > available_blocks())
    return status{errc::out_of_blocks, "add_sequence: not enough free blocks for the prompt", needed};
  // KV from outside (no mutation yet): the full blocks after the device hit up to options.external_tokens, below
  // the last token. The host tier then loads nothing: the transfer supplies those blocks.
  std::int32_t ext = 0;
  if (options.external_tokens > 0) {  // with token ids (checked above)
    const std::int64_t cap = std::min<std::int64_t>(options.external_tokens, n - 1) / cfg_.block_size;
    ext = static_cast<std::int32_t>(std::max<std::int64_t>(0, cap - static_cast<std::int64_t>(hits_.size())));
  }
  // The host tier's part (no mutation yet): the blocks after the device hits it can load, and the key it missed.
  std::int32_t loads = 0;
  if constexpr (tier_type::enabled) {
    std::vector<std::uint64_t>& keys = tier_.keys();
    keys.clear();
    if (!tokens.empty() && ext == 0)
      tier_keys(tokens, options.extra_key, static_cast<std::int32_t>(hits_.size()),
                hits_.empty() ? no_block : hits_.back(), ph, [&](std::uint64_t key) {
                  keys.push_back(key);
                  if (!tier_.ready(key)) return false;
                  ++loads;
                  return true;
                });
  }

  // With async transfers a sequence with loads takes only its hit's blocks for now: it waits for them.
  bool waits = ext > 0;
  if constexpr (tier_type::enabled) waits = waits || (loads > 0 && tier_.async());
  std::vector<token_id> ext_tokens;  // allocated before anything changes
  if (ext > 0) {
    external_.reserve_one();
    ext_tokens.assign(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(hits_.size() + static_cast<std::size_t>(ext)) *
                                                         cfg_.block_size);
  }
  const std::int32_t h = seqs_.insert(id);
  seq_state& s = seqs_[h];
  s.blocks.resize(waits ? hits_.size() + static_cast<std::size_t>(loads + ext) : static_cast<std::size_t>(total));
  // Hits first (they leave the free queue before anything is popped from it), then new blocks.
  for (std::size_t i = 0; i < hits_.size(); ++i) {
    if (blocks_.touch(hits_[i])) ledger_.unpark();
    s.blocks[i] = hits_[i];
  }
  blocks_.take(std::span<block_id>(s.blocks).subspan(hits_.size()));
  s.num_tokens = n;
  s.priority = options.priority;
  s.extra_key = options.extra_key;
  const auto device_tokens = static_cast<std::int32_t>(hits_.size()) * cfg_.block_size;
  const std::int32_t hit_tokens = device_tokens + (loads + ext) * cfg_.block_size;  // served: not computed
  if (waits) s.num_tokens = hit_tokens;  // it holds its hit and waits for the loads (tier_load_state)
  if (!tokens.empty()) {
    if constexpr (tier_type::enabled) {  // the loaded blocks get their bytes from the host tier
      const auto dst = std::span<const block_id>(s.blocks).subspan(hits_.size(), static_cast<std::size_t>(loads));
      tier_.load(dst, ledger_, counts_);
      if (waits && loads > 0)
        tier_.wait_for_loads(
            id, static_cast<std::int32_t>(hits_.size()), dst, tokens,
            [this, &s](std::int32_t i) { return blocks_.sharing().block_hash(s.blocks[static_cast<std::size_t>(i)]); },
            cfg_.block_size, options.extra_key, ledger_.step());
    }
    // Write-back stores what the device evicted for the new blocks after the loads are pinned (a store may evict in
    // the tier) and before the new blocks are committed (each store takes its block's old retention priority).
    tier_evicted();
    if (ext > 0) {  // its external blocks are committed when the engine reports them (complete_external)
      external_.add(id, external_range{static_cast<std::int32_t>(hits_.size()), ext}, std::move(ext_tokens));
    }
    // A waiting sequence's loaded blocks are committed once they are in (commit_loaded), not now.
    if (!waits)
      cursors_.commit_prompt(blocks_.sharing(), s, cur, tokens, static_cast<std::int32_t>(hits_.size()), ph,
                             announcer(s));
    counts_.prefix_query_tokens += n;
    counts_.prefix_hit_tokens += device_tokens;
    counts_.prefix_hit_tokens_host += loads * cfg_.block_size;
  }
  counts_.tokens += s.num_tokens;
  if (!waits) s.append_step = ledger_.record_append(h, id, hit_tokens, n - hit_tokens);
  if (tokens.empty()) tier_evicted();
  if (hit != nullptr)
    *hit = prefix_match{static_cast<std::int32_t>(hits_.size()), hit_tokens, static_cast<std::int64_t>(needed), loads,
                        ext};
  return ok_status();
}

template <block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto paged_kv_cache<A, E, S, W, T>::grow(std::int32_t h, std::int32_t n) -> status {
  seq_state& s = seqs_[h];
  const auto blocks = detail::blocks_after_growth(s.num_tokens, n, cfg_.block_size, cfg_.max_blocks_per_seq);
  if (!blocks) return blocks.error();
  const std::int64_t new_total = std::int64_t{s.num_tokens} + n, total_blocks = *blocks;
  const retention_hint hint{s.priority};
  detail::write_growth g;
  if (status st = grow_for_write(blocks_, ledger_, s.blocks, s.num_tokens, cfg_.block_size, total_blocks,
                                 [&](block_id b) { release(b, hint); }, g);
      !st)
    return st;
  if (g.copied) ++counts_.cow_copies;
  tier_evicted();
  s.append_step = ledger_.record_append(h, s.id, s.num_tokens, n);
  s.num_tokens = static_cast<std::int32_t>(new_total);
  counts_.tokens += n;
  return ok_status();
}

template <block_allocator A, eviction_policy E, sharing_policy S, swap_policy W, cache_tier T>
KVPAGER_OUT_OF_LINE auto paged_kv_cache<A, E, S, W, T>::release(block_id b, retention_hint hint) -> void {
  blocks_.release(b, hint, [this](block_id x, retention_hint xh) { return ledger_.park(x, xh); });
}

KVPAGER_NAMESPACE_END
