// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// tier_link: a paged_kv_cache's host tier (cache_config::host_tier) and what the cache does with it. It owns the
/// host_tier<P>, turns its decisions into step-plan entries (a load is a swap-in from the tier's host block, a store
/// a swap-out to it; tier block i is host block num_host_blocks + i), and completes them when the plan has run (the
/// next begin_step). Write-through stores a block at the begin_step after it was cached; write-back stores the blocks
/// the device pool evicts, in the step it evicts them (the swap-outs run before anything of the step writes).
/// tier_link<no_tier> is empty and does nothing.

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "kvpager/cache/cache_types.hpp"
#include "kvpager/cache/detail/step_ledger.hpp"
#include "kvpager/concepts/tier_policy.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/kv_events.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/core/types.hpp"
#include "kvpager/tier/host_tier.hpp"

KVPAGER_NAMESPACE_BEGIN
namespace detail {

/// No host tier: nothing to do (the cache compiles its tier code out).
template <class T>
class tier_link {
 public:
  static constexpr bool enabled = false;
  /// errc::invalid_argument when cfg asks for host tier blocks without a tier policy.
  static result<tier_link> create(const cache_config& cfg, const T& /*policy*/) {
    if (cfg.host_tier.num_blocks != 0)
      return status{errc::invalid_argument,
                    "paged_kv_cache::create: host_tier.num_blocks is set but the cache has no tier policy (no_tier)",
                    cfg.host_tier.num_blocks};
    return tier_link{};
  }
};

template <tier_policy P>
class tier_link<P> {
 public:
  static constexpr bool enabled = true;
  using tier_type = host_tier<P>;

  /// The tier of cfg.host_tier. Errors: errc::invalid_pool_size (no tier blocks), host_tier::create's.
  static result<tier_link> create(const cache_config& cfg, P policy) {
    const host_tier_options& o = cfg.host_tier;
    if (o.num_blocks <= 0)
      return status{errc::invalid_pool_size,
                    "paged_kv_cache::create: a cache with a tier policy needs host_tier.num_blocks > 0", o.num_blocks};
    auto t = tier_type::create({o.num_blocks, o.store_threshold, o.max_tracker_size, o.min_priority, o.inclusive},
                               std::move(policy));
    if (!t) return t.error();
    tier_link l(std::move(*t));
    l.base_ = cfg.num_host_blocks;
    l.write_ = o.write;
    const auto n = static_cast<std::size_t>(cfg.num_blocks);
    l.priority_.assign(n, 0);
    l.queued_.assign(n, 0);
    l.committed_.reserve(n);
    l.keys_.reserve(n);
    l.host_.reserve(n);
    l.loading_.reserve(n);
    l.storing_.reserve(n);
    return l;
  }

  [[nodiscard]] const tier_type& tier() const noexcept { return tier_; }
  /// Changes whenever a lookup's answer may have changed (a store completed, a block left the tier).
  [[nodiscard]] std::uint64_t generation() const noexcept { return generation_; }
  /// Loads and stores planned and not yet complete.
  [[nodiscard]] bool in_flight() const noexcept { return !loading_.empty() || !storing_.empty(); }
  void set_events(kv_event_buffer* out) noexcept { tier_.set_kv_event_buffer(out); }

  /// Whether a load of `key` could be planned now (held and its store complete).
  [[nodiscard]] bool ready(std::uint64_t key) const noexcept { return tier_.peek(key) == tier_hit::hit; }

  /// Scratch for an admission's keys: the blocks after the device hits, up to and including the first the tier
  /// cannot serve.
  std::vector<std::uint64_t>& keys() noexcept { return keys_; }

  /// An admission took device blocks `dst` for the first dst.size() keys (all ready): counts the lookups of keys()
  /// for selective storing, pins the host blocks and plans their loads, marks them used.
  void load(std::span<const block_id> dst, step_ledger& ledger, cache_stats& counts) {
    (void)tier_.lookup_prefix(keys_);
    const std::span<const std::uint64_t> loaded = std::span<const std::uint64_t>(keys_).first(dst.size());
    if (loaded.empty()) return;
    host_.resize(loaded.size());
    [[maybe_unused]] const status st = tier_.prepare_load(loaded, host_);
    KVPAGER_ASSERT(st.ok(), "tier_link::load: a key that was ready is not loadable");
    tier_.touch(loaded);
    for (std::size_t i = 0; i < dst.size(); ++i) ledger.plan_swap_in(block_swap{dst[i], base_ + host_[i]});
    loading_.insert(loading_.end(), loaded.begin(), loaded.end());
    counts.tier_loaded_blocks += static_cast<std::int64_t>(dst.size());
  }

  /// Block `b` was just cached by a sequence of retention priority `priority`: write-through stores it at the next
  /// begin_step (its bytes are in place then).
  void committed(block_id b, std::int32_t priority) {
    priority_[static_cast<std::size_t>(b)] = priority;
    if (write_ != tier_write::through) return;
    std::uint8_t& q = queued_[static_cast<std::size_t>(b)];
    if (q != 0) return;
    q = 1;
    committed_.push_back(b);  // at most one entry per block: within the reserved room
  }

  /// After an operation that took device blocks: write-back stores what the device evicted for them, in this step.
  template <class Store>
  void evicted(Store& blocks, step_ledger& ledger, cache_stats& counts) {
    if (write_ == tier_write::back)
      for (const auto& e : blocks.evicted()) store(e.block, e.hash, ledger, counts);
    blocks.clear_evicted();
  }

  /// The previous plan has run: its loads and stores are complete. Then write-through plans the stores of the blocks
  /// cached in the previous step that are still cached (`hash_of(b, key)`: false when `b` no longer is, else true
  /// with its content's key in `key`).
  template <class HashOf>
  void begin_step(HashOf&& hash_of, step_ledger& ledger, cache_stats& counts) {
    if (!loading_.empty()) {
      [[maybe_unused]] const status st = tier_.complete_load(loading_, true);
      KVPAGER_ASSERT(st.ok(), "tier_link::begin_step: a load the tier does not know");
      loading_.clear();
      if (!tier_.config().inclusive) ++generation_;
    }
    if (!storing_.empty()) {
      tier_.complete_store(storing_, true);
      storing_.clear();
      ++generation_;
    }
    for (const block_id b : committed_) {
      queued_[static_cast<std::size_t>(b)] = 0;
      std::uint64_t key = 0;
      if (hash_of(b, key)) store(b, key, ledger, counts);
    }
    committed_.clear();
  }

  /// Forgets every host block (reset_prefix_cache); the caller has checked that nothing is in flight.
  void reset() noexcept {
    tier_.reset();
    for (const block_id b : committed_) queued_[static_cast<std::size_t>(b)] = 0;
    committed_.clear();
    ++generation_;
  }

 private:
  explicit tier_link(tier_type t) : tier_(std::move(t)) {}

  /// Stores device block `b` holding content `key` unless the tier holds it already (or refuses it: full of blocks
  /// being read or written, below min_priority, under store_threshold; counted by the tier).
  void store(block_id b, std::uint64_t key, step_ledger& ledger, cache_stats& counts) {
    if (!tier_.prepare_store(std::span<const std::uint64_t>(&key, 1), plan_, {},
                             priority_[static_cast<std::size_t>(b)]))
      return;
    if (!plan_.evicted.empty()) ++generation_;
    for (const block_id h : plan_.host_blocks) {
      ledger.plan_swap_out(block_swap{b, base_ + h});
      ++counts.tier_stored_blocks;
    }
    storing_.insert(storing_.end(), plan_.keys.begin(), plan_.keys.end());
  }

  tier_type tier_;
  block_id base_ = 0;  ///< host block of tier block 0 (after the swap pool's)
  tier_write write_ = tier_write::through;
  std::uint64_t generation_ = 0;
  std::vector<std::int32_t> priority_;  ///< per device block: the retention priority of the sequence that cached it
  std::vector<std::uint8_t> queued_;    ///< per device block: listed in committed_
  std::vector<block_id> committed_;     ///< blocks cached in this step (write-through)
  std::vector<std::uint64_t> keys_;     ///< scratch (keys())
  std::vector<block_id> host_;          ///< scratch: the host blocks of a load
  std::vector<std::uint64_t> loading_;  ///< keys of the loads planned in this step
  std::vector<std::uint64_t> storing_;  ///< keys of the stores planned in this step
  tier_store_plan plan_;
};

}  // namespace detail
KVPAGER_NAMESPACE_END
