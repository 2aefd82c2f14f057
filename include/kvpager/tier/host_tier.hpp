// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// host_tier: a second tier of prefix-cache blocks in host memory, below the device pool: which content has a host
/// copy, in which host block, in what state, and which copy goes when a store needs room (a tier_policy: lru_tier,
/// arc_tier). It decides; it never moves bytes (the engine copies a store's device blocks into the host blocks it
/// names, and a load's host blocks into device blocks, through the kernels' block moves) and reports back.
///
/// The semantics are vLLM 0.22.0's offloading manager (`vllm/v1/kv_offload/cpu/manager.py`), so the same calls give
/// the same host blocks, evictions and answers (checked against vLLM's own manager: docs/host_tier.md):
///   - a block is known by its key (a content hash; one per KV cache group: hybrid_kv_cache::cached_key);
///   - each host block is being written (a store prepared, not complete: never read, never evicted), ready (state 0:
///     loadable and evictable) or being read (state n > 0: n loads in flight; not evictable);
///   - lookup(key): hit (ready), pending (being written: ask again later) or miss; with store_threshold k >= 2 it
///     also counts the key's lookups (in a tracker of the max_tracker_size most recent keys), and only keys looked
///     up at least k times are stored (selective write);
///   - prepare_load pins ready blocks (nothing else changes), complete_load unpins them;
///   - prepare_store takes the keys of blocks to offload, keeps those not held yet, and gives each a host block:
///     a never used one first (in order), then the last freed; when the free blocks do not suffice the policy
///     evicts exactly the shortfall among ready, unread blocks whose keys are not in this store (all of it, or the
///     call fails with errc::host_pool_full and nothing changes); complete_store(ok) makes them ready, or (a failed
///     copy) forgets and frees them;
///   - fail_load(keys) completes failed loads and drops their copies; forget(key) drops one ready copy;
///   - reset forgets everything (the caller guarantees no load or store is in flight).
/// Beyond vLLM: bad input is an error value that changes nothing (a load of a key not held or not ready, a
/// completion of a load never prepared, duplicate keys), and the tier reports KV cache events (medium "CPU") into a
/// caller's buffer, as vLLM's offloading connector does: a block_stored when a store completes, a block_removed
/// when a ready block is evicted or reset.
///
/// Memory, allocated by create only: per host block 4 bytes of state, 1 of protection, 12 of the name events give
/// it, the policy's (lru_tier 32, arc_tier about 90 bytes with its ghosts); the tracker 40 bytes per tracked key
/// when store_threshold >= 2. After create the tier allocates nothing of its own: its outputs go to caller-owned
/// vectors, and its events to the caller's buffer, each growing until it holds what one call needs (an append
/// that cannot allocate inside these noexcept calls ends the program, as the caches' event appends do).

#include <algorithm>
#include <cstdint>
#include <new>
#include <span>
#include <utility>
#include <vector>

#include "kvpager/concepts/tier_policy.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/id_map.hpp"
#include "kvpager/core/index_list.hpp"
#include "kvpager/core/kv_events.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/core/types.hpp"
#include "kvpager/tier/lru_tier.hpp"

KVPAGER_NAMESPACE_BEGIN

/// What a host tier lookup finds.
enum class tier_hit : std::uint8_t {
  miss,     ///< not held
  hit,      ///< held and ready: loadable now
  pending,  ///< held, still being written: loadable once its store completes
};

struct host_tier_config {
  std::int32_t num_blocks = 0;          ///< host blocks of the tier (> 0)
  std::int32_t store_threshold = 1;     ///< store only keys looked up at least this many times (1: every key)
  std::int32_t max_tracker_size = 64000;  ///< keys whose lookups are counted (store_threshold >= 2), most recent kept
  /// Store only blocks of requests whose retention priority (sequence_options::priority) is at least this
  /// (TensorRT-LLM's secondary offload minimum priority); the lowest int32: every block.
  std::int32_t min_priority = INT32_MIN;
  /// Inclusive (vLLM's tier): a loaded block keeps its host copy, so a hot prefix is never copied down twice.
  /// Exclusive (false): a block leaves the tier when its last load completes (it moved up; the host block is free
  /// again), which holds more distinct content at the price of a store when it is evicted from the device again.
  bool inclusive = true;
};

/// How the KV cache events name a block: its chained hash and its KV cache group (a tier keyed by
/// hybrid_kv_cache::cached_key(hash, group) reports the hash and group, as the device pool's events do).
struct kv_block_name {
  std::uint64_t hash = 0;
  std::int32_t group = 0;
};

/// What prepare_store decided: the keys to copy now and their host blocks (the same order), and the keys evicted to
/// make room (in eviction order). Reused between calls: nothing is allocated once it has grown.
struct tier_store_plan {
  std::vector<std::uint64_t> keys;
  std::vector<block_id> host_blocks;
  std::vector<std::uint64_t> evicted;
  void clear() noexcept {
    keys.clear();
    host_blocks.clear();
    evicted.clear();
  }
};

/// The tier's counts. Cumulative except the gauges.
struct host_tier_stats {
  std::int32_t num_blocks = 0;
  std::int32_t held = 0;        ///< gauge: host blocks holding a key (ready, being read or written)
  std::int32_t writing = 0;     ///< gauge: stores prepared, not complete
  std::int32_t reading = 0;     ///< gauge: blocks with loads in flight
  std::int64_t lookups = 0, hits = 0, pending_hits = 0;
  std::int64_t stored = 0;          ///< stores completed
  std::int64_t failed_stores = 0;   ///< blocks whose store failed (forgotten)
  std::int64_t loads = 0;           ///< blocks loads were prepared for
  std::int64_t failed_loads = 0;    ///< blocks whose load failed (fail_load)
  std::int64_t evicted = 0;
  std::int64_t refused_stores = 0;  ///< prepare_store calls that found no room (host_pool_full)
  std::int64_t below_priority = 0;  ///< blocks not stored for their request's priority (min_priority)
  std::int64_t moved_up = 0;        ///< blocks that left an exclusive tier when their load completed
  friend bool operator==(const host_tier_stats&, const host_tier_stats&) = default;
};

template <tier_policy P = lru_tier>
class host_tier {
 public:
  using policy_type = P;
  /// The most host blocks a tier has (arc_tier keeps up to 3 x num_blocks + 1 ghosts in int32 indices).
  static constexpr std::int32_t max_blocks = std::int32_t{1} << 28;

  /// An empty tier of cfg.num_blocks host blocks. Errors: errc::invalid_pool_size (num_blocks < 1),
  /// errc::invalid_argument (store_threshold < 1, max_tracker_size < 1 while store_threshold >= 2),
  /// errc::out_of_memory (detail = num_blocks).
  [[nodiscard]] static result<host_tier> create(host_tier_config cfg, P policy = P{}) {
    if (cfg.num_blocks < 1 || cfg.num_blocks > max_blocks)
      return status{errc::invalid_pool_size, "host_tier::create: num_blocks must be in [1, 2^28]", cfg.num_blocks};
    if (cfg.store_threshold < 1)
      return status{errc::invalid_argument, "host_tier::create: store_threshold must be at least 1",
                    cfg.store_threshold};
    if (cfg.store_threshold >= 2 && cfg.max_tracker_size < 1)
      return status{errc::invalid_argument, "host_tier::create: max_tracker_size must be at least 1",
                    cfg.max_tracker_size};
#if KVPAGER_HAS_EXCEPTIONS
    try {
#endif
      host_tier t;
      t.cfg_ = cfg;
      t.policy_ = std::move(policy);
      t.policy_.reset(cfg.num_blocks);
      const auto n = static_cast<std::size_t>(cfg.num_blocks);
      t.state_.assign(n, 0);
      t.protect_.assign(n, 0);
      t.names_.assign(n, kv_block_name{});
      t.free_.reserve(n);
      t.victims_.reserve(n);
      t.seen_.reserve(cfg.num_blocks);
      if (cfg.store_threshold >= 2) {
        t.counts_index_.reserve(cfg.max_tracker_size);
        t.count_keys_.assign(static_cast<std::size_t>(cfg.max_tracker_size), 0);
        t.counts_.assign(static_cast<std::size_t>(cfg.max_tracker_size), 0);
        t.count_order_.reset(cfg.max_tracker_size);
      }
      t.stats_.num_blocks = cfg.num_blocks;
      return t;
#if KVPAGER_HAS_EXCEPTIONS
    } catch (const std::bad_alloc&) {
      return status{errc::out_of_memory, "host_tier::create: not enough host memory for the tier's bookkeeping",
                    cfg.num_blocks};
    }
#endif
  }

  [[nodiscard]] const host_tier_config& config() const noexcept { return cfg_; }
  [[nodiscard]] const P& policy() const noexcept { return policy_; }
  [[nodiscard]] host_tier_stats stats() const noexcept { return stats_; }
  /// Host blocks no key holds (never used or freed).
  [[nodiscard]] std::int32_t free_blocks() const noexcept {
    return static_cast<std::int32_t>(free_.size()) + cfg_.num_blocks - fresh_;
  }

  /// Reports KV cache events (medium host) into `*out` from now on (nullptr: none), each block by the name its store
  /// gave it (prepare_store's `names`; without them its key, in group 0).
  void set_kv_event_buffer(kv_event_buffer* out) noexcept { events_ = out; }

  // ------------------------------------------------------------------------------------------------ lookups

  /// Whether `key` is held, and ready. Counts the lookup for selective storing (store_threshold >= 2). O(1).
  tier_hit lookup(std::uint64_t key) noexcept {
    ++stats_.lookups;
    if (cfg_.store_threshold >= 2) count_lookup(key);
    const std::int32_t s = policy_.find(key);
    if (s < 0) return tier_hit::miss;
    if (state_[static_cast<std::size_t>(s)] < 0) {
      ++stats_.pending_hits;
      return tier_hit::pending;
    }
    ++stats_.hits;
    return tier_hit::hit;
  }

  /// The leading keys of `keys` that are held and ready, looked up one by one until the first that is not (as a
  /// connector asks): returns their count; `*stop` (if given) receives what ended the run (miss or pending; hit
  /// when every key hit).
  std::int32_t lookup_prefix(std::span<const std::uint64_t> keys, tier_hit* stop = nullptr) noexcept {
    std::int32_t n = 0;
    tier_hit h = tier_hit::hit;
    for (const std::uint64_t k : keys) {
      h = lookup(k);
      if (h != tier_hit::hit) break;
      ++n;
    }
    if (stop != nullptr) *stop = h;
    return n;
  }

  /// lookup(key) without counting it (no state changes): what a load could use now.
  [[nodiscard]] tier_hit peek(std::uint64_t key) const noexcept {
    const std::int32_t s = policy_.find(key);
    if (s < 0) return tier_hit::miss;
    return state_[static_cast<std::size_t>(s)] < 0 ? tier_hit::pending : tier_hit::hit;
  }

  /// Whether `key` is held (in any state), without counting a lookup.
  [[nodiscard]] bool holds(std::uint64_t key) const noexcept { return policy_.find(key) >= 0; }
  /// The host block holding `key`, or no_block.
  [[nodiscard]] block_id host_block(std::uint64_t key) const noexcept {
    const std::int32_t s = policy_.find(key);
    return s < 0 ? no_block : s;
  }
  /// -1 being written, 0 ready, n > 0 loads in flight; the block must be held.
  [[nodiscard]] std::int32_t state(block_id host_block) const noexcept {
    return state_[static_cast<std::size_t>(host_block)];
  }

  /// Marks `keys` used, last to first (so the first ends most recent), held or not (arc_tier adapts to ghosts).
  void touch(std::span<const std::uint64_t> keys) noexcept {
    for (std::size_t i = keys.size(); i-- > 0;) {
      const std::int32_t s = policy_.find(keys[i]);
      policy_.touch(keys[i], s >= 0 && state_[static_cast<std::size_t>(s)] >= 0);
    }
  }

  // ------------------------------------------------------------------------------------------------ loads

  /// Pins the host blocks of `keys` for loading and writes them to `host_blocks` (same length). Errors:
  /// errc::invalid_argument (lengths differ), errc::invalid_block (a key not held, or still being written; detail =
  /// its index): nothing changed.
  status prepare_load(std::span<const std::uint64_t> keys, std::span<block_id> host_blocks) noexcept {
    if (keys.size() != host_blocks.size())
      return status{errc::invalid_argument, "host_tier::prepare_load: one host block per key",
                    static_cast<std::int64_t>(host_blocks.size())};
    for (std::size_t i = 0; i < keys.size(); ++i) {  // checked whole before anything is written
      const std::int32_t s = policy_.find(keys[i]);
      if (s < 0) return status{errc::invalid_block, "host_tier::prepare_load: a key the tier does not hold",
                               static_cast<std::int64_t>(i)};
      if (state_[static_cast<std::size_t>(s)] < 0)
        return status{errc::invalid_block, "host_tier::prepare_load: a key whose store is not complete",
                      static_cast<std::int64_t>(i)};
    }
    for (std::size_t i = 0; i < keys.size(); ++i) {
      host_blocks[i] = policy_.find(keys[i]);
      if (state_[static_cast<std::size_t>(host_blocks[i])]++ == 0) ++stats_.reading;  // its first reader
    }
    stats_.loads += static_cast<std::int64_t>(keys.size());
    return ok_status();
  }

  /// Unpins the host blocks of `keys` (a load prepared for each is complete: `loaded`; or failed or abandoned); in an
  /// exclusive tier a block whose last load completed with `loaded` leaves it (a removal on the host medium), one
  /// whose load failed stays. Error:
  /// errc::invalid_block (a key not held or with no load in flight; counted over the call, so a key listed more
  /// often than it was loaded fails too; detail = its index): nothing changed.
  status complete_load(std::span<const std::uint64_t> keys, bool loaded = true) noexcept {
    std::size_t i = 0;
    std::int32_t done = 0;  // blocks whose last reader this call is
    for (; i < keys.size(); ++i) {
      const std::int32_t s = policy_.find(keys[i]);
      if (s < 0 || state_[static_cast<std::size_t>(s)] <= 0) break;
      if (--state_[static_cast<std::size_t>(s)] == 0) ++done;
    }
    if (i < keys.size()) {
      for (std::size_t j = 0; j < i; ++j) ++state_[static_cast<std::size_t>(policy_.find(keys[j]))];
      return status{errc::invalid_block, "host_tier::complete_load: a key with no load in flight",
                    static_cast<std::int64_t>(i)};
    }
    stats_.reading -= done;
    if (!cfg_.inclusive && loaded) {  // exclusive: a block whose last load completed moved up; its host block is free
      for (const std::uint64_t k : keys) {
        const std::int32_t s = policy_.find(k);
        if (s < 0 || state_[static_cast<std::size_t>(s)] != 0) continue;
        announce_removed(s);
        release(k, s);
        ++stats_.moved_up;
      }
    }
    return ok_status();
  }

  // ------------------------------------------------------------------------------------------------ stores

  /// Plans the stores of `keys` (the blocks a request offloads) into `plan` (cleared first): the keys not held
  /// (with store_threshold >= 2, only those looked up that often), in order, each with its host block, now being
  /// written; evicting the shortfall of free blocks (plan.evicted). A key listed twice is stored once. `names`
  /// (empty, or one per key): how the events name each block. `priority`: the request's retention priority; below
  /// min_priority nothing is stored. Errors: errc::host_pool_full when not enough blocks
  /// can be evicted (detail = blocks short), errc::invalid_argument (names neither empty nor one per key): nothing
  /// changed.
  status prepare_store(std::span<const std::uint64_t> keys, tier_store_plan& plan,
                       std::span<const kv_block_name> names = {}, std::int32_t priority = 0) noexcept {
    plan.clear();
    if (!names.empty() && names.size() != keys.size())
      return status{errc::invalid_argument, "host_tier::prepare_store: names must be empty or one per key",
                    static_cast<std::int64_t>(names.size())};
    if (priority < cfg_.min_priority) {  // not worth keeping: nothing stored, nothing evicted
      stats_.below_priority += static_cast<std::int64_t>(keys.size());
      return ok_status();
    }
    // Keys to store: not held, past the threshold, first occurrence. `seen_` marks them (no allocation: at most
    // num_blocks are kept; more than that cannot fit anyway and is refused below).
    std::int32_t want = 0;
    for (const std::uint64_t k : keys) {
      if (cfg_.store_threshold >= 2 && lookups_of(k) < cfg_.store_threshold) continue;
      if (policy_.find(k) >= 0 || seen_.find(k) >= 0) continue;
      ++want;
      if (want > cfg_.num_blocks) break;
      seen_.insert(k, 0);
    }
    if (want == 0) return ok_status();
    const std::int32_t shortfall = want - free_blocks();
    if (shortfall > 0) {
      // The keys of this store that are held stay (vLLM protects the keys past the threshold filter).
      protect_keys(keys, 1);
      const bool found = want <= cfg_.num_blocks &&
                         policy_.evict(shortfall, tier_evictable{state_.data(), protect_.data()}, victims_);
      protect_keys(keys, 0);
      if (!found) {
        forget_seen(keys);
        ++stats_.refused_stores;
        return status{errc::host_pool_full, "host_tier::prepare_store: not enough evictable host blocks", shortfall};
      }
      for (const std::int32_t s : victims_) {
        plan.evicted.push_back(policy_.key_of(s));
        free_.push_back(s);
        announce_removed(s);
      }
      stats_.evicted += shortfall;
      stats_.held -= shortfall;
    }
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const std::uint64_t k = keys[i];
      if (seen_.find(k) < 0) continue;
      seen_.erase(k);
      std::int32_t s;
      if (fresh_ < cfg_.num_blocks) {
        s = fresh_++;
      } else {
        s = free_.back();
        free_.pop_back();
      }
      state_[static_cast<std::size_t>(s)] = -1;
      names_[static_cast<std::size_t>(s)] = names.empty() ? kv_block_name{k, 0} : names[i];
      policy_.insert(k, s);
      plan.keys.push_back(k);
      plan.host_blocks.push_back(s);
    }
    stats_.held += want;
    stats_.writing += want;
    return ok_status();
  }

  /// The stores of `keys` are complete (ok: their host blocks are ready) or failed (their blocks are forgotten and
  /// freed: the content is recomputed when needed). Keys not being written are ignored (as vLLM does).
  void complete_store(std::span<const std::uint64_t> keys, bool ok) noexcept {
    for (const std::uint64_t k : keys) {
      const std::int32_t s = policy_.find(k);
      if (s < 0 || state_[static_cast<std::size_t>(s)] >= 0) continue;
      --stats_.writing;
      if (ok) {
        state_[static_cast<std::size_t>(s)] = 0;
        ++stats_.stored;
        if (events_ != nullptr) {
          const kv_block_name& n = names_[static_cast<std::size_t>(s)];
          events_->block_stored_unchained(kv_medium::host, n.group, n.hash);
        }
      } else {
        state_[static_cast<std::size_t>(s)] = 0;
        release(k, s);
        ++stats_.failed_stores;
      }
    }
  }

  /// The loads of `keys` failed: complete_load(keys, false), counted in failed_loads, and each copy no other load
  /// still reads is forgotten (not trusted again: a removal on the host medium). Same error as complete_load.
  status fail_load(std::span<const std::uint64_t> keys) noexcept {
    if (status st = complete_load(keys, false); !st) return st;
    stats_.failed_loads += static_cast<std::int64_t>(keys.size());
    for (const std::uint64_t k : keys) (void)forget(k);
    return ok_status();
  }

  /// Forgets `key`'s copy if it is held, ready and not being read: a removal on the host medium; its block is free.
  /// Returns whether it did (nothing changes otherwise).
  bool forget(std::uint64_t key) noexcept {
    const std::int32_t s = policy_.find(key);
    if (s < 0 || state_[static_cast<std::size_t>(s)] != 0) return false;
    announce_removed(s);
    release(key, s);
    return true;
  }

  /// Forgets every block and all history (vLLM's reset_cache); the caller guarantees that no load or store is in
  /// flight. Reports a block_removed for each ready block (not all_blocks_cleared, which would empty the device
  /// pool's medium too).
  void reset() noexcept {
    for (std::int32_t s = 0; s < fresh_; ++s)
      if (policy_.find(policy_.key_of(s)) == s && state_[static_cast<std::size_t>(s)] >= 0) announce_removed(s);
    policy_.clear();
    std::fill(state_.begin(), state_.end(), 0);
    free_.clear();
    fresh_ = 0;
    stats_.held = stats_.writing = stats_.reading = 0;
  }

 private:
  host_tier() = default;

  void count_lookup(std::uint64_t key) noexcept {
    std::int32_t n = counts_index_.find(key);
    if (n >= 0) {
      count_order_.erase(n);
      count_order_.push_back(n);
      ++counts_[static_cast<std::size_t>(n)];
      return;
    }
    if (counts_index_.size() >= cfg_.max_tracker_size) {
      n = count_order_.pop_front();
      counts_index_.erase(count_keys_[static_cast<std::size_t>(n)]);
    } else {
      n = counts_index_.size();
    }
    count_keys_[static_cast<std::size_t>(n)] = key;
    counts_[static_cast<std::size_t>(n)] = 1;
    counts_index_.insert(key, n);
    count_order_.push_back(n);
  }
  [[nodiscard]] std::int64_t lookups_of(std::uint64_t key) const noexcept {
    const std::int32_t n = counts_index_.find(key);
    return n < 0 ? 0 : counts_[static_cast<std::size_t>(n)];
  }
  /// Key `k` no longer holds host block `s` (state 0), which is free again.
  void release(std::uint64_t k, std::int32_t s) noexcept {
    policy_.remove(k);
    free_.push_back(s);
    --stats_.held;
  }
  void announce_removed(std::int32_t s) {
    if (events_ == nullptr) return;
    const kv_block_name& n = names_[static_cast<std::size_t>(s)];
    events_->block_removed(kv_medium::host, n.group, n.hash);
  }
  void protect_keys(std::span<const std::uint64_t> keys, std::uint8_t on) noexcept {
    for (const std::uint64_t k : keys) {
      if (cfg_.store_threshold >= 2 && lookups_of(k) < cfg_.store_threshold) continue;
      if (const std::int32_t s = policy_.find(k); s >= 0) protect_[static_cast<std::size_t>(s)] = on;
    }
  }
  void forget_seen(std::span<const std::uint64_t> keys) noexcept {
    for (const std::uint64_t k : keys) seen_.erase(k);
  }

  host_tier_config cfg_{};
  P policy_{};
  std::vector<std::int32_t> state_;    ///< per host block: -1 being written, 0 ready, n > 0 loads in flight
  std::vector<std::uint8_t> protect_;  ///< per host block: a key of the store being prepared (scratch)
  std::vector<std::int32_t> free_;     ///< freed host blocks, the last freed reused first
  std::int32_t fresh_ = 0;             ///< host blocks [0, fresh_) have been used
  std::vector<std::int32_t> victims_;  ///< evict's output (scratch)
  id_map seen_;                        ///< prepare_store's keys to store (scratch, empty between calls)
  id_map counts_index_;                ///< tracked key -> node (store_threshold >= 2)
  std::vector<std::uint64_t> count_keys_;
  std::vector<std::int64_t> counts_;
  index_list count_order_;             ///< tracked nodes, least recently looked up first
  host_tier_stats stats_{};
  std::vector<kv_block_name> names_;  ///< per host block: how the events name it
  kv_event_buffer* events_ = nullptr;
};

KVPAGER_NAMESPACE_END
