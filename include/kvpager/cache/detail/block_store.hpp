// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// block_store: the device blocks of a paged_kv_cache and their life cycle. It composes the block_pool (refcounts,
/// the allocator's free set) with the eviction policy (cached, unreferenced blocks kept for reuse) and the sharing
/// policy (which blocks carry cached content). Handing blocks out, a prefix hit reviving a block wherever it is,
/// releasing a reference, settling an unreferenced block, and every discard of cached content go through here, so
/// the three policies always agree on a block's state. Whether a released block must wait for the step (a planned
/// copy uses it) is the step ledger's call, passed in as `park`.

#include <cstdint>
#include <new>
#include <span>
#include <utility>
#include <vector>

#include "kvpager/cache/cache_types.hpp"
#include "kvpager/concepts/block_allocator.hpp"
#include "kvpager/concepts/eviction_policy.hpp"
#include "kvpager/concepts/sharing_policy.hpp"
#include "kvpager/core/assert.hpp"
#include "kvpager/core/block_pool.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/kv_events.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/core/types.hpp"

KVPAGER_NAMESPACE_BEGIN
namespace detail {

/// Whether eviction policy E can run over allocator A: a policy that evicts in the allocator's free order names
/// the order it needs (lru_eviction: free_list_allocator's FIFO). The caches static_assert it.
template <block_allocator A, eviction_policy E>
inline constexpr bool free_order_fits = [] {
  if constexpr (requires { E::required_free_order; }) {
    return allocator_traits<A>::order == static_cast<free_order>(E::required_free_order);
  } else {
    return true;
  }
}();

template <block_allocator A, eviction_policy E, sharing_policy S>
class block_store {
 public:
  static constexpr bool indexed = E::retention == retention_mode::indexed;

  block_store(block_pool<A> pool, E eviction, S sharing)
      : pool_(std::move(pool)), evict_(std::move(eviction)), share_(std::move(sharing)) {}

  /// Resets both policies for pool geometry `g`.
  void reset(const pool_geometry& g) {
    evict_.reset(g);
    share_.reset(g);
  }

  /// KV cache events (core/kv_events.hpp) go to `out` from now on (nullptr: none): the caches'
  /// set_kv_event_buffer. Allocates the per-block record of what was announced (a hash and a group per block) on the
  /// first attach. Errors (nothing changed): errc::invalid_argument (attaching while blocks are cached: the events
  /// would miss them), errc::out_of_memory.
  status attach_events(kv_event_buffer* out) {
    if (out != nullptr && sink_.out == nullptr && num_cached() > 0)
      return status{errc::invalid_argument, "set_kv_event_buffer: blocks are cached already", num_cached()};
    const bool again = out != nullptr && sink_.out == nullptr && !announced_.empty();
#if KVPAGER_HAS_EXCEPTIONS
    try {
#endif
      if (out != nullptr && announced_.size() != static_cast<std::size_t>(pool_.num_blocks()))
        announced_.assign(static_cast<std::size_t>(pool_.num_blocks()), announced{});
      // Attached again after a time without events (or a copy of a cache that had them): what the consumer was told
      // before may be stale, and nothing is cached now: say so, and forget what was announced.
      if (again) out->all_blocks_cleared();
#if KVPAGER_HAS_EXCEPTIONS
    } catch (const std::bad_alloc&) {
      return status{errc::out_of_memory, "set_kv_event_buffer: no memory for the per-block record",
                    pool_.num_blocks()};
    }
#endif
    if (again)
      for (announced& a : announced_) a.live = false;
    sink_.out = out;
    return ok_status();
  }
  /// Cached blocks (0 without a content cache).
  [[nodiscard]] std::int32_t num_cached() const noexcept {
    if constexpr (content_cache<S>) return share_.num_cached();
    return 0;
  }
  [[nodiscard]] kv_event_buffer* events() const noexcept { return sink_.out; }
  /// Records that `b`, just cached (the sharing policy holds it), was stored: its hash as events name it (without
  /// a group's mixing), its parent's, group and tokens. A block the policy did not cache is not announced.
  void announce_stored(block_id b, std::uint64_t hash, bool has_parent, std::uint64_t parent, std::int32_t group,
                       std::span<const token_id> tokens) noexcept {
    if (sink_.out == nullptr || !share_.is_cached(b)) return;
    announced_[static_cast<std::size_t>(b)] = announced{hash, group, true};
    sink_.out->block_stored(kv_medium::device, group, hash, has_parent, parent, tokens);
  }

  [[nodiscard]] const block_pool<A>& pool() const noexcept { return pool_; }
  [[nodiscard]] const E& eviction() const noexcept { return evict_; }
  [[nodiscard]] const S& sharing() const noexcept { return share_; }
  [[nodiscard]] S& sharing() noexcept { return share_; }
  /// Cached blocks whose content was discarded to reuse the block, cumulative.
  [[nodiscard]] std::int64_t evictions() const noexcept { return evictions_; }
  [[nodiscard]] std::int32_t refcount(block_id b) const noexcept { return pool_.refcount(b); }
  [[nodiscard]] bool is_cached(block_id b) const noexcept { return share_.is_cached(b); }
  /// Cached, unreferenced blocks the eviction policy holds (0 unless indexed).
  [[nodiscard]] std::int32_t evictable() const noexcept {
    if constexpr (indexed) return evict_.size();
    return 0;
  }
  /// Blocks an allocation can use now: free + evictable. O(1).
  [[nodiscard]] std::int64_t available() const noexcept { return std::int64_t{pool_.num_free()} + evictable(); }

  /// Fills the pool's gauges of `s` (total, free, used, logical, shared), evictable, evictions and cached.
  void report(cache_stats& s) const noexcept {
    const pool_stats p = pool_.stats();
    s.total = p.total;
    s.free = p.free;
    s.used = p.used;
    s.logical = p.references;
    s.shared = p.shared;
    s.evictable = evictable();
    s.evictions = evictions_;
    if constexpr (content_cache<S>) s.cached = share_.num_cached();
  }

  /// Whether a hit on `b` takes a block from available() (it is free or evictable, not in use or parked).
  [[nodiscard]] bool consumes_capacity(block_id b) const noexcept {
    if (pool_.refcount(b) > 0) return false;
    if constexpr (indexed) {
      if (evict_.contains(b)) return true;
    }
    return pool_.is_free(b);
  }

  /// Adds a reference to in-use block `b`.
  void add_ref(block_id b) noexcept { pool_.add_ref(b); }

  /// A prefix hit takes a reference on `b`, wherever it is: in use, in the free queue, in the eviction index, or
  /// parked until the next step; returns true in the last case (the caller's ledger no longer counts it pending).
  bool touch(block_id b) noexcept {
    bool parked_for_copy = false;
    if (pool_.refcount(b) > 0) {
      pool_.add_ref(b);
    } else if (pool_.is_free(b)) {
      pool_.take(b);
    } else {
      parked_for_copy = true;
      if constexpr (indexed) {
        if (evict_.contains(b)) {
          evict_.erase(b);
          parked_for_copy = false;
        }
      }
      pool_.adopt(b);
    }
    if constexpr (indexed) evict_.on_hit(b);
    return parked_for_copy;
  }

  /// Fills `out` with blocks; the caller has checked out.size() <= available(). Clean free blocks first, then
  /// (indexed retention) victims of the eviction policy. A reused block that still holds cached content is
  /// evicted here, lazily (vLLM's order with retention_mode::in_free_list).
  void take(std::span<block_id> out) noexcept {
    KVPAGER_ASSERT(static_cast<std::int64_t>(out.size()) <= available(), "take_blocks: capacity not checked");
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

  /// Reuses cached block `b` for other content (counted in evictions()); logged (log_evictions) before its content
  /// is forgotten.
  void evict(block_id b) noexcept {
    if constexpr (prehashed_content_cache<S>) {
      if (log_on_ && evicted_.size() < evicted_.capacity())  // bounded: drained after every operation
        evicted_.push_back(evicted_block{b, share_.block_hash(b)});
    }
    drop_content(b);
    ++evictions_;
  }

  /// A block whose cached content an eviction discarded, and that content's chained hash.
  struct evicted_block {
    block_id block = no_block;
    std::uint64_t hash = 0;
  };
  /// From now on each eviction is logged (a host tier stores on eviction), until clear_evicted() empties the log;
  /// the log's room for a whole pool is allocated here. A prehashed content cache only (others log nothing).
  void log_evictions() {
    evicted_.reserve(static_cast<std::size_t>(pool_.num_blocks()));
    log_on_ = true;
  }
  [[nodiscard]] std::span<const evicted_block> evicted() const noexcept { return evicted_; }
  void clear_evicted() noexcept { evicted_.clear(); }

  /// Every discard of a block's cached content goes through here (eviction, a write into an owned cached block,
  /// an append cancelled before its bytes were written, a release without retention): the sharing policy forgets
  /// the content and the eviction policy the per-content state it keeps (hits, first-use stamp), so the block's
  /// next content starts afresh. `b` is not in the eviction index.
  void drop_content(block_id b) noexcept {
    forget_content(b);
    if (sink_.out != nullptr) {
      announced& a = announced_[static_cast<std::size_t>(b)];
      if (a.live) sink_.out->block_removed(kv_medium::device, a.group, a.hash);
      a.live = false;
    }
  }

  /// Drops the cached content of every unreferenced block (a prefix-cache reset; the caller has checked that no
  /// block is referenced or parked): each goes back to the allocator, and the events report one
  /// all_blocks_cleared instead of a removal per block. O(num_blocks).
  void clear_content() noexcept {
    for (block_id b = 0; b < pool_.num_blocks(); ++b) {
      if (!share_.is_cached(b)) continue;
      KVPAGER_ASSERT(pool_.refcount(b) == 0, "clear_content: a cached block is still referenced");
      bool recycle = false;
      if constexpr (indexed) {
        if (evict_.contains(b)) {
          evict_.erase(b);
          recycle = true;
        }
      }
      forget_content(b);
      if (recycle) pool_.recycle(b);
      if (sink_.out != nullptr) announced_[static_cast<std::size_t>(b)].live = false;
    }
    if (sink_.out != nullptr) sink_.out->all_blocks_cleared();
  }

  /// Drops one reference; at zero the block is parked if `park(b, hint)` says a planned copy uses it, else settled.
  template <class Park>
  void release(block_id b, retention_hint hint, Park&& park) {
    if (pool_.drop_ref(b) > 0) return;
    if (!park(b, hint)) settle(b, hint);
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

 private:
  block_pool<A> pool_;
  /// The sharing policy forgets `b`'s content and the eviction policy its per-content state (both discards).
  void forget_content(block_id b) noexcept {
    share_.uncache(b);
    if constexpr (detail::forgets_content<E>) evict_.forget(b);
  }

  [[no_unique_address]] E evict_;
  [[no_unique_address]] S share_;
  std::int64_t evictions_ = 0;
  /// What the events said of each block while it is cached (attach_events).
  struct announced {
    std::uint64_t hash = 0;
    std::int32_t group = 0;
    bool live = false;
  };
  /// The events' buffer; a copy of the store starts without one (it would report into the original's buffer).
  struct event_sink {
    kv_event_buffer* out = nullptr;
    event_sink() = default;
    event_sink(const event_sink&) noexcept {}
    event_sink(event_sink&& o) noexcept : out(o.out) { o.out = nullptr; }
    event_sink& operator=(const event_sink&) noexcept {
      out = nullptr;
      return *this;
    }
    event_sink& operator=(event_sink&& o) noexcept {
      out = o.out;
      o.out = nullptr;
      return *this;
    }
  };
  event_sink sink_;
  std::vector<announced> announced_;
  std::vector<evicted_block> evicted_;  ///< evictions since clear_evicted (log_evictions)
  bool log_on_ = false;
};

}  // namespace detail
KVPAGER_NAMESPACE_END
