// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// swap_book: the host side of swapping for a paged_kv_cache. It owns the host (CPU) block pool, a
/// block_pool<lifo_allocator> whose reference counts are the references swapped-out block tables hold (a block
/// shared within a swapped group is one host block), and the swap policy, which only decides (swap or recompute).
/// A host block whose last reference went returns to the pool at the next step (a swap-in of the step may still
/// read it). It moves a group's block tables between device and host, each distinct block once, so a block shared
/// within the group is shared again on the other side. The device side (taking blocks, dropping references) is
/// the block_store's, the plan the step_ledger's: swap_out and swap_in receive them.

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "kvpager/allocator/lifo_allocator.hpp"
#include "kvpager/cache/cache_types.hpp"
#include "kvpager/cache/detail/sequence_table.hpp"
#include "kvpager/cache/detail/step_ledger.hpp"
#include "kvpager/core/step_plan.hpp"
#include "kvpager/concepts/eviction_policy.hpp"
#include "kvpager/concepts/swap_policy.hpp"
#include "kvpager/core/assert.hpp"
#include "kvpager/core/block_pool.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/span_of.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/core/types.hpp"

KVPAGER_NAMESPACE_BEGIN
namespace detail {

template <swap_policy W>
class swap_book {
 public:
  /// The host pool: most recently freed block first.
  using host_pool_type = block_pool<lifo_allocator>;

  swap_book() = default;
  explicit swap_book(W policy) : swap_(std::move(policy)) {}

  /// Empty book for device pool geometry `g` and a host pool of `num_host_blocks` blocks (none when 0), the first
  /// `host_reserved` of them never handed out (a hybrid cache reserves host block 0: its null entry), which the
  /// caller checked leaves at least one: allocates the host pool and the per-block maps.
  void reset(const pool_geometry& g, std::int32_t num_host_blocks, std::int32_t host_reserved = 0) {
    host_.reset();
    if (num_host_blocks > 0) host_.emplace(std::move(*host_pool_type::create({num_host_blocks, host_reserved})));
    dev_map_.assign(static_cast<std::size_t>(g.num_blocks), -1);
    const auto host = static_cast<std::size_t>(num_host_blocks > 0 ? num_host_blocks : 0);
    host_map_.assign(host, -1);
    host_first_use_.assign(host, 0);
    host_deferred_.clear();
    host_deferred_.reserve(host);  // release_host_ref never reallocates
    swapped_ = 0;
    swapped_out_blocks_ = 0;
    swapped_in_blocks_ = 0;
    swap_outs_ = 0;
    swap_ins_ = 0;
  }

  [[nodiscard]] const W& policy() const noexcept { return swap_; }
  /// The host pool, or nullptr when the cache has none.
  [[nodiscard]] const host_pool_type* host_pool() const noexcept { return host_ ? &*host_ : nullptr; }
  [[nodiscard]] bool has_host_pool() const noexcept { return host_.has_value(); }
  [[nodiscard]] std::int32_t host_capacity() const noexcept { return host_ ? host_->usable_blocks() : 0; }
  /// Host blocks free now (those released in this step count from the next).
  [[nodiscard]] std::int32_t host_free() const noexcept { return host_ ? host_->num_free() : 0; }
  /// The policy's decision for a victim holding `num_blocks` device blocks.
  [[nodiscard]] preempt_action decide(std::int32_t num_blocks) const noexcept {
    return swap_.action(num_blocks, host_free());
  }
  /// Sequences swapped out now.
  [[nodiscard]] std::int32_t swapped() const noexcept { return swapped_; }
  /// Fills the swap counts of `s` (swapped, host_total, host_free, swapped_out_blocks, swapped_in_blocks,
  /// swap_outs, swap_ins, swapped_logical).
  void report(cache_stats& s) const noexcept {
    s.swapped = swapped_;
    s.swap_outs = swap_outs_;
    s.swap_ins = swap_ins_;
    s.swapped_logical = host_ ? host_->stats().references : 0;
    s.host_total = host_capacity();
    s.host_free = host_free();
    s.swapped_out_blocks = swapped_out_blocks_;
    s.swapped_in_blocks = swapped_in_blocks_;
  }
  /// References from swapped-out block tables to host block `hb`.
  [[nodiscard]] std::int32_t host_refs(block_id hb) const noexcept { return host_ ? host_->refcount(hb) : 0; }

  /// Moves the tables of `group` (validated by the caller: live, on device, listed once) to host blocks: plans the
  /// (device, host) copies in `ledger`, drops each device reference tail first through `release(b, hint)`, and
  /// marks the sequences swapped. errc::host_pool_full (detail = host blocks needed) and nothing changed when the
  /// host pool is short. The caller checked has_host_pool(). O(blocks of the group).
  /// `tables`: the sequences' block tables, one per KV cache group (one for a paged_kv_cache; a hybrid cache's
  /// groups in group order, table 0 holding the priority); each swap names the group of its table. Entries equal
  /// to `skip` (a hybrid cache's null block) are not blocks: they stay as they are on both sides.
  template <class Cursor, class Release>
  status swap_out(std::span<const seq_id> group, std::span<sequence_table<Cursor>> tables, step_ledger& ledger,
                  Release&& release, block_id skip = no_block) {
    collect(group, tables, dev_map_, skip);
    const auto need = static_cast<std::int64_t>(from_.size());
    to_.resize(from_.size());
    if (!host_->allocate(span_of(to_))) {  // all or nothing: refcount 1 each, the first table entry's reference
      unmark(dev_map_);
      return status{errc::host_pool_full, "swap_out: not enough free host blocks", need};
    }
    for (std::size_t i = 0; i < from_.size(); ++i) {
      dev_map_[static_cast<std::size_t>(from_[i])] = to_[i];
      ledger.plan_swap_out(block_swap{from_[i], to_[i], from_group_[i]});
    }
    for (const seq_id id : group) {
      const retention_hint hint{tables[0].at(id).priority};
      for (sequence_table<Cursor>& table : tables) {
        auto& s = table.at(id);
        for (auto it = s.blocks.rbegin(); it != s.blocks.rend(); ++it) {  // tail first, as a free
          if (*it == skip) continue;
          const block_id hb = dev_map_[static_cast<std::size_t>(*it)];
          if (!first_use(hb)) host_->add_ref(hb);  // shared within the group: one host block
          release(*it, hint);
          *it = hb;
        }
        s.swapped = true;
      }
      ++swapped_;
    }
    for (const block_id hb : to_) host_first_use_[static_cast<std::size_t>(hb)] = 0;
    unmark(dev_map_);
    swapped_out_blocks_ += need;
    swap_outs_ += static_cast<std::int64_t>(group.size());
    return ok_status();
  }
  template <class Cursor, class Release>
  status swap_out(std::span<const seq_id> group, sequence_table<Cursor>& table, step_ledger& ledger,
                  Release&& release) {
    return swap_out(group, std::span<sequence_table<Cursor>>(&table, 1), ledger, std::forward<Release>(release));
  }

  /// Moves the tables of `group` (validated by the caller: live, swapped out, listed once) back to device blocks
  /// taken from `store`, plans the (host, device) copies in `ledger` (whose blocks stay busy for the step), and
  /// marks the sequences' bytes as arriving in this step. errc::out_of_blocks (detail = device blocks needed) and
  /// nothing changed when the store is short. `taken(g, b)` is told each device block taken, with its group.
  /// `tables` and `skip` as for swap_out. O(blocks of the group).
  template <class Cursor, class Store, class Taken>
  status swap_in(std::span<const seq_id> group, std::span<sequence_table<Cursor>> tables, Store& store,
                 step_ledger& ledger, Taken&& taken, block_id skip = no_block) {
    collect(group, tables, host_map_, skip);
    const auto need = static_cast<std::int64_t>(from_.size());
    if (need > store.available()) {
      unmark(host_map_);
      return status{errc::out_of_blocks, "swap_in: not enough free device blocks", need};
    }
    to_.resize(from_.size());
    store.take(to_);
    for (std::size_t i = 0; i < from_.size(); ++i) {
      host_map_[static_cast<std::size_t>(from_[i])] = to_[i];
      ledger.plan_swap_in(block_swap{to_[i], from_[i], from_group_[i]});
      taken(from_group_[i], to_[i]);
    }
    for (const seq_id id : group) {
      for (sequence_table<Cursor>& table : tables) {
        auto& s = table.at(id);
        for (block_id& b : s.blocks) {
          if (b == skip) continue;
          const block_id hb = b;
          b = host_map_[static_cast<std::size_t>(hb)];
          if (!first_use(hb)) store.add_ref(b);  // shared within the group: one device block again
          release_host_ref(hb);
        }
        s.swapped = false;
        s.append_step = ledger.step();  // its bytes arrive with this step's swap-ins
      }
      --swapped_;
    }
    for (const block_id hb : from_) host_first_use_[static_cast<std::size_t>(hb)] = 0;
    unmark(host_map_);
    swapped_in_blocks_ += need;
    swap_ins_ += static_cast<std::int64_t>(group.size());
    return ok_status();
  }
  template <class Cursor, class Store>
  status swap_in(std::span<const seq_id> group, sequence_table<Cursor>& table, Store& store, step_ledger& ledger) {
    return swap_in(group, std::span<sequence_table<Cursor>>(&table, 1), store, ledger, [](std::int32_t, block_id) {});
  }

  /// A swapped-out sequence was freed: drops its table's references to host blocks (entries equal to `skip` are
  /// not blocks). Once per table; then dropped_sequence() once per sequence.
  void drop_refs(std::span<const block_id> host_table, block_id skip = no_block) {
    for (const block_id hb : host_table)
      if (hb != skip) release_host_ref(hb);
  }
  void dropped_sequence() noexcept { --swapped_; }
  /// drop_refs and dropped_sequence for a sequence of one table.
  void drop_table(std::span<const block_id> host_table) {
    drop_refs(host_table);
    dropped_sequence();
  }

  /// Host blocks released in the previous step go back to the pool.
  void begin_step() noexcept {
    if (!host_) return;
    for (const block_id hb : host_deferred_) host_->recycle(hb);
    host_deferred_.clear();
  }

 private:
  /// Fills from_ with the distinct blocks the tables of `group` reference (entries equal to `skip` aside), in
  /// first-use order, and from_group_ with the index of the table each was first found in, marking each in `map`
  /// (which holds -1 for all of them) with -2.
  template <class Cursor>
  void collect(std::span<const seq_id> group, std::span<sequence_table<Cursor>> tables, std::vector<block_id>& map,
               block_id skip) {
    from_.clear();
    from_group_.clear();
    for (const seq_id id : group)
      for (std::size_t t = 0; t < tables.size(); ++t)
        for (const block_id b : tables[t].at(id).blocks)
          if (b != skip && map[static_cast<std::size_t>(b)] == -1) {
            map[static_cast<std::size_t>(b)] = -2;
            from_.push_back(b);
            from_group_.push_back(static_cast<std::int32_t>(t));
          }
  }
  void unmark(std::vector<block_id>& map) noexcept {
    for (const block_id b : from_) map[static_cast<std::size_t>(b)] = -1;
  }
  /// Whether this is the first table entry of the group mapped to host block `hb` (the caller resets the flags).
  bool first_use(block_id hb) noexcept {
    std::uint8_t& f = host_first_use_[static_cast<std::size_t>(hb)];
    const bool first = f == 0;
    f = 1;
    return first;
  }
  /// Drops one reference to host block `hb`; at zero it returns to the pool at the next step.
  void release_host_ref(block_id hb) noexcept {
    if (host_->drop_ref(hb) == 0) host_deferred_.push_back(hb);  // capacity reserved: never reallocates
  }

  [[no_unique_address]] W swap_;
  std::optional<host_pool_type> host_;
  std::vector<block_id> dev_map_;             ///< swap-out: device block -> host block (-1 unset)
  std::vector<block_id> host_map_;            ///< swap-in: host block -> device block (-1 unset)
  std::vector<std::uint8_t> host_first_use_;  ///< host block already mapped once in the group being moved
  std::vector<block_id> host_deferred_;       ///< host blocks freed in this step, returned at the next
  std::vector<block_id> from_;                ///< distinct blocks of the group being swapped
  std::vector<block_id> to_;                  ///< their targets, in the same order
  std::vector<std::int32_t> from_group_;      ///< the table (KV cache group) each of from_ belongs to
  std::int32_t swapped_ = 0;
  std::int64_t swapped_out_blocks_ = 0;
  std::int64_t swapped_in_blocks_ = 0;
  std::int64_t swap_outs_ = 0;  ///< sequences swapped out
  std::int64_t swap_ins_ = 0;   ///< sequences swapped in
};

}  // namespace detail
KVPAGER_NAMESPACE_END
