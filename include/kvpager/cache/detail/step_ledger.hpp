// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// step_ledger: what one step of a paged_kv_cache has planned and what it still holds back until the step ran. It
/// owns the step_plan, the owner of each appended range (so the slot mapping follows a sequence's block table,
/// and a sequence freed in the step exports -1, or the slots frozen for its sharers), the per-block busy flags of
/// planned copies and swap-ins, and the blocks released while busy (parked until the next begin_step). It knows no
/// policy: the cache passes what it needs (block tables, refcount tests) as arguments.

#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "kvpager/core/step_plan.hpp"
#include "kvpager/concepts/eviction_policy.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/core/types.hpp"

KVPAGER_NAMESPACE_BEGIN
namespace detail {

/// The bookkeeping of the current step. Every member function is O(1) amortized unless noted.
/// A template only so that a translation unit that does not use it analyses none of its members (and none of the
/// standard templates they use): see basic_scheduler_queues in sched/scheduler_queues.hpp.
template <class = void>
class basic_step_ledger {
 public:
  /// Empty ledger for a pool of `num_blocks` blocks (allocates the per-block flags).
  void reset(std::int32_t num_blocks) {
    busy_.assign(static_cast<std::size_t>(num_blocks), 0);
    busy_list_.clear();
    deferred_.clear();
    clear_plan();
    step_ = 0;
  }

  /// Number of the current step (starts at 0, +1 per begin_step).
  [[nodiscard]] std::uint64_t step() const noexcept { return step_; }
  /// The byte movement planned since the last begin_step.
  [[nodiscard]] const step_plan& plan() const noexcept { return plan_; }
  /// Unreferenced blocks parked because a planned copy still uses them (free at the next step).
  [[nodiscard]] std::int32_t pending_free() const noexcept { return pending_; }
  /// Whether a planned copy or swap-in of this step reads or writes `b`.
  [[nodiscard]] bool busy(block_id b) const noexcept { return busy_[static_cast<std::size_t>(b)] != 0; }

  /// Plans a whole-block copy (of group `group`'s layers); both blocks stay busy for the step.
  void plan_copy(block_id src, block_id dst, std::int32_t group = 0) {
    plan_.add_copy(block_copy{src, dst, group});
    mark_busy(src);
    mark_busy(dst);
  }
  /// Plans a device -> host copy (the device block is released by the caller right after: it need not be busy,
  /// the swap-outs run first).
  void plan_swap_out(block_swap s) { plan_.add_swap_out(s); }
  /// Plans a host -> device copy; the device block is busy for the step (not handed out again if freed).
  void plan_swap_in(block_swap s) {
    plan_.add_swap_in(s);
    mark_busy(s.device);
  }
  /// Keeps `b` from being handed out again in this step once unreferenced.
  void mark_busy(block_id b) {
    std::uint8_t& f = busy_[static_cast<std::size_t>(b)];
    if (f == 0) {
      f = busy_flag;
      busy_list_.push_back(b);
    }
  }

  /// Records tokens [first_pos, first_pos + count) of sequence `id` (handle `h`) as appended in this step; returns
  /// the step number for the sequence's append_step.
  std::uint64_t record_append(std::int32_t h, seq_id id, std::int32_t first_pos, std::int32_t count) {
    plan_.add_append(token_range{id, first_pos, count});
    append_owner_.push_back(h);
    return step_;
  }

  /// `b` just lost its last reference: parks it (returns true) if a planned copy still uses it; the latest
  /// release's hint decides its retention when it settles at the next begin_step.
  bool park(block_id b, retention_hint hint) {
    std::uint8_t& f = busy_[static_cast<std::size_t>(b)];
    if (f == 0) return false;
    if ((f & deferred_flag) == 0) {  // listed once per step, even if revived and released again
      f |= deferred_flag;
      deferred_.emplace_back(b, hint);
    } else {
      for (auto& d : deferred_)
        if (d.first == b) d.second = hint;
    }
    ++pending_;
    return true;
  }
  /// A parked block was referenced again (a prefix hit): no longer pending. begin_step skips it if still in use.
  void unpark() noexcept { --pending_; }

  /// Starts a new step: the plan is taken as executed and cleared, busy flags drop, and `settle(b, hint)` is
  /// called for each block parked in the step (the caller skips those referenced again). O(blocks touched).
  template <class Settle>
  void begin_step(Settle&& settle) {
    for (const block_id b : busy_list_) busy_[static_cast<std::size_t>(b)] = 0;
    busy_list_.clear();
    for (const auto& [b, hint] : deferred_) settle(b, hint);
    deferred_.clear();
    clear_plan();
    ++step_;
  }

  /// Before sequence `h` (block table `blocks`) is freed: its appended ranges of this step are cancelled (slot
  /// -1), except in blocks that `shared(b)` says another sequence holds (a prefix hit in this step on a block
  /// this sequence fills): those slots are frozen as they are, and the block stays busy. `unshared(b)` is called
  /// for each other block a cancelled range touches (its content will never be written).
  template <class Shared, class Unshared>
  void cancel_appends(std::int32_t h, std::span<const block_id> blocks, std::int32_t block_size, Shared&& shared,
                      Unshared&& unshared) {
    cancel_appends(
        h, 1, [blocks](std::int32_t) { return blocks; }, block_size, std::forward<Shared>(shared),
        std::forward<Unshared>(unshared));
  }
  /// cancel_appends for a sequence with `num_tables` block tables (a hybrid cache's KV cache groups; their slots
  /// differ per table), `table(t)` giving table t: a range is frozen where any table's block is shared, and its
  /// frozen slots are kept per table (-1 in that table's unshared blocks). O(appended ranges x tables).
  template <class TableOf, class Shared, class Unshared>
  void cancel_appends(std::int32_t h, std::int32_t num_tables, TableOf&& table, std::int32_t block_size,
                      Shared&& shared, Unshared&& unshared) {
    const std::span<const token_range> ranges = plan_.appends();
    const std::int64_t bs = block_size;
    frozen_offset_.resize(ranges.size(), -1);  // sized lazily: only steps that free an appending sequence pay
    for (std::size_t r = 0; r < ranges.size(); ++r) {
      if (append_owner_[r] != h) continue;
      append_owner_[r] = -1;
      const token_range& tr = ranges[r];
      const std::int64_t end = std::int64_t{tr.first_pos} + tr.count;
      bool any_shared = false;
      for (std::int32_t t = 0; t < num_tables; ++t) {
        const std::span<const block_id> blocks = table(t);
        for (std::int64_t i = tr.first_pos / bs; i * bs < end; ++i) {  // per block the range touches
          const block_id b = blocks[static_cast<std::size_t>(i)];
          if (shared(b)) {
            any_shared = true;
            mark_busy(b);  // its kept writes are pending: if the sharers let go too, park it until the step ran
          } else {
            unshared(b);
          }
        }
      }
      if (!any_shared) continue;  // frozen_offset_ stays -1: every slot exports as -1
      frozen_offset_[r] = static_cast<std::int64_t>(frozen_slots_.size());
      for (std::int32_t t = 0; t < num_tables; ++t) {
        const std::span<const block_id> blocks = table(t);
        for (std::int64_t p = tr.first_pos; p < end; ++p) {
          const block_id b = blocks[static_cast<std::size_t>(p / bs)];
          frozen_slots_.push_back(shared(b) ? std::int64_t{b} * bs + p % bs : -1);
        }
      }
    }
  }

  /// Slot mapping of this step's appends, in plan order (see paged_kv_cache::export_slot_mapping), of table
  /// `table` (a hybrid cache's group; 0 for one table). `blocks_of(h)` gives that block-table data of live handle
  /// `h`. errc::buffer_too_small, nothing written.
  template <class BlocksOf>
  status export_slot_mapping(std::span<std::int64_t> out, std::int32_t block_size, BlocksOf&& blocks_of,
                             std::int32_t table = 0) const noexcept {
    if (static_cast<std::int64_t>(out.size()) < plan_.num_append_tokens())
      return status{errc::buffer_too_small, "export_slot_mapping: buffer is shorter than slot_mapping_size()",
                    plan_.num_append_tokens()};
    const std::span<const token_range> ranges = plan_.appends();
    const std::int64_t bs = block_size;
    std::int64_t* o = out.data();
    for (std::size_t r = 0; r < ranges.size(); ++r) {
      const token_range& tr = ranges[r];
      const std::int32_t owner = append_owner_[r];
      if (owner < 0) {  // its sequence was freed: cancelled, or the slots kept for sharers were frozen then
        if (r >= frozen_offset_.size() || frozen_offset_[r] < 0) {
          o = std::fill_n(o, tr.count, std::int64_t{-1});
        } else {
          const auto first = frozen_slots_.begin() + frozen_offset_[r] + std::int64_t{table} * tr.count;
          o = std::copy(first, first + tr.count, o);
        }
        continue;
      }
      const block_id* blocks = blocks_of(owner);
      for (std::int64_t p = tr.first_pos; p < std::int64_t{tr.first_pos} + tr.count; ++p)
        *o++ = std::int64_t{blocks[p / bs]} * bs + p % bs;
    }
    return ok_status();
  }

 private:
  /// The plan and what follows it (append owners, frozen slots, the pending count) start empty.
  void clear_plan() noexcept {
    pending_ = 0;
    plan_.clear();
    append_owner_.clear();
    frozen_offset_.clear();
    frozen_slots_.clear();
  }

  static constexpr std::uint8_t busy_flag = 1;      ///< source or destination of a copy planned this step
  static constexpr std::uint8_t deferred_flag = 2;  ///< and unreferenced: in deferred_

  step_plan plan_;
  std::vector<std::int32_t> append_owner_;   ///< handle per plan_.appends() entry; -1 once that sequence is freed
  std::vector<std::int64_t> frozen_offset_;  ///< per freed entry: where its slots start in frozen_slots_; -1 = all -1
  std::vector<std::int64_t> frozen_slots_;   ///< slots (or -1) of entries whose sequence was freed in this step
  std::vector<std::uint8_t> busy_;           ///< per block: busy_flag | deferred_flag
  std::vector<block_id> busy_list_;
  std::vector<std::pair<block_id, retention_hint>> deferred_;  ///< settled at the next begin_step
  std::int32_t pending_ = 0;                                   ///< deferred blocks still unreferenced
  std::uint64_t step_ = 0;
};

using step_ledger = basic_step_ledger<>;

}  // namespace detail
KVPAGER_NAMESPACE_END
