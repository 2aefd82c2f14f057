// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// block_pool: the global pool of fixed-size KV blocks. Reference counts per block, the free set (kept by a
/// block_allocator policy), all-or-nothing batch allocation and O(1) statistics. It knows nothing of sequences;
/// paged_kv_cache builds block tables, sharing and eviction on top of it, and engines can use it directly.
///
/// Block states: *free* (in the allocator's set, refcount 0), *in use* (refcount > 0), and *parked* (refcount 0
/// but held outside the free set by the caller: a cached block kept by an indexed eviction policy, or a block
/// whose bytes a pending copy still reads). free + in use + parked = usable blocks, always.

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "kvpager/core/assert.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/core/types.hpp"

KVPAGER_NAMESPACE_BEGIN

/// Pool geometry.
struct block_pool_config {
  /// Blocks in the pool, including reserved ones.
  std::int32_t num_blocks = 0;
  /// Blocks [0, reserved_blocks) are never handed out (vLLM reserves block 0 as its null block).
  std::int32_t reserved_blocks = 0;
};

/// Counts maintained incrementally; reading them is O(1).
struct pool_stats {
  std::int32_t total = 0;       ///< usable blocks (num_blocks - reserved)
  std::int32_t free = 0;        ///< blocks in the free set
  std::int32_t used = 0;        ///< physical blocks in use (refcount > 0)
  std::int32_t parked = 0;      ///< refcount 0, held outside the free set (total - free - used)
  std::int32_t shared = 0;      ///< blocks with refcount > 1
  std::int64_t references = 0;  ///< sum of refcounts = logical block references (block-table entries)
  friend bool operator==(const pool_stats&, const pool_stats&) = default;
};

/// The pool over allocator `A`, which must model `block_allocator` (concepts/block_allocator.hpp): core sits below
/// the concepts and the policies, so the requirement is checked where a pool is composed (paged_kv_cache, or
/// `static_assert(block_allocator<A>)` in your code), and there is no default allocator here. Pick one explicitly,
/// e.g. `block_pool<free_list_allocator>` (vLLM's FIFO free queue).
template <class A>
class block_pool {
 public:
  using allocator_type = A;

  /// Validates `cfg` and builds the pool: errc::invalid_pool_size for a negative size, a negative reservation,
  /// or no usable block.
  [[nodiscard]] static result<block_pool> create(block_pool_config cfg, A allocator = A{}) {
    if (cfg.num_blocks <= 0 || cfg.reserved_blocks < 0)
      return status{errc::invalid_pool_size, "block_pool::create: num_blocks must be > 0 and reserved_blocks >= 0",
                    cfg.num_blocks};
    if (cfg.reserved_blocks >= cfg.num_blocks)
      return status{errc::invalid_pool_size, "block_pool::create: reserved_blocks leaves no usable block",
                    cfg.reserved_blocks};
    return block_pool(cfg, std::move(allocator));
  }

  [[nodiscard]] std::int32_t num_blocks() const noexcept { return cfg_.num_blocks; }
  [[nodiscard]] std::int32_t reserved_blocks() const noexcept { return cfg_.reserved_blocks; }
  [[nodiscard]] std::int32_t usable_blocks() const noexcept { return cfg_.num_blocks - cfg_.reserved_blocks; }
  [[nodiscard]] std::int32_t num_free() const noexcept { return alloc_.size(); }
  [[nodiscard]] std::int32_t num_used() const noexcept { return used_; }

  /// Reference count of `b`, 0 for free, parked, reserved or out-of-range ids.
  [[nodiscard]] std::int32_t refcount(block_id b) const noexcept {
    return in_range(b) ? refcount_[static_cast<std::size_t>(b)] : 0;
  }
  [[nodiscard]] bool is_free(block_id b) const noexcept { return alloc_.contains(b); }
  /// Whether `b` is a usable (non-reserved) block id of this pool.
  [[nodiscard]] bool in_range(block_id b) const noexcept { return b >= cfg_.reserved_blocks && b < cfg_.num_blocks; }

  [[nodiscard]] pool_stats stats() const noexcept {
    const std::int32_t total = usable_blocks();
    return pool_stats{total, num_free(), used_, total - num_free() - used_, shared_, references_};
  }

  /// Allocates `out.size()` blocks with refcount 1 into `out`, in allocator order. All or nothing:
  /// errc::out_of_blocks (detail = blocks requested) and no change when fewer are free. O(n).
  status allocate(std::span<block_id> out) noexcept {
    if (std::cmp_greater(out.size(), alloc_.size()))
      return status{errc::out_of_blocks, "block_pool::allocate: not enough free blocks",
                    static_cast<std::int64_t>(out.size())};
    for (block_id& b : out) {
      b = alloc_.pop();
      set_in_use(b);
    }
    return ok_status();
  }

  /// Allocates one block. O(1).
  result<block_id> allocate() noexcept {
    block_id b = no_block;
    if (status s = allocate(std::span<block_id>(&b, 1)); !s) return s;
    return b;
  }

  /// Adds a reference to block `b`, which must be in use (errc::invalid_block otherwise, nothing changed).
  status retain(block_id b) noexcept {
    if (!in_range(b) || refcount_[static_cast<std::size_t>(b)] == 0)
      return status{errc::invalid_block, "block_pool::retain: block is not in use", b};
    add_ref(b);
    return ok_status();
  }

  /// Drops a reference to `b`; at zero the block returns to the free set. errc::double_free if `b` is not in
  /// use, errc::invalid_block if it is not a usable id; nothing changed on error.
  status release(block_id b) noexcept {
    if (!in_range(b)) return status{errc::invalid_block, "block_pool::release: block id out of range", b};
    if (refcount_[static_cast<std::size_t>(b)] == 0)
      return status{errc::double_free, "block_pool::release: block is already free", b};
    if (drop_ref(b) == 0) recycle(b);
    return ok_status();
  }

  /// \name Unchecked primitives for compositions (paged_kv_cache); preconditions are asserted.
  /// \{
  /// Pops the allocator's next block and gives it refcount 1. Precondition: num_free() > 0.
  block_id pop_free() noexcept {
    const block_id b = alloc_.pop();
    set_in_use(b);
    return b;
  }
  /// Removes free block `b` from the free set and gives it refcount 1 (a hit on a cached free block).
  void take(block_id b) noexcept {
    alloc_.erase(b);
    set_in_use(b);
  }
  /// Gives parked block `b` (refcount 0, not free) refcount 1.
  void adopt(block_id b) noexcept {
    KVPAGER_ASSERT(in_range(b) && !alloc_.contains(b), "block_pool::adopt of a free or out-of-range block");
    set_in_use(b);
  }
  /// Adds a reference to an in-use block.
  void add_ref(block_id b) noexcept {
    std::int32_t& rc = refcount_[static_cast<std::size_t>(b)];
    KVPAGER_ASSERT(rc > 0, "block_pool::add_ref on a block that is not in use");
    if (++rc == 2) ++shared_;
    ++references_;
  }
  /// Drops a reference to an in-use block without recycling it; returns the new count. At 0 the block is parked
  /// until the caller recycles or adopts it.
  std::int32_t drop_ref(block_id b) noexcept {
    std::int32_t& rc = refcount_[static_cast<std::size_t>(b)];
    KVPAGER_ASSERT(rc > 0, "block_pool::drop_ref on a block that is not in use");
    if (rc == 2) --shared_;
    --references_;
    if (--rc == 0) --used_;
    return rc;
  }
  /// Returns parked block `b` to the free set.
  void recycle(block_id b) noexcept {
    KVPAGER_ASSERT(in_range(b) && refcount_[static_cast<std::size_t>(b)] == 0,
                   "block_pool::recycle of a block that is in use or out of range");
    alloc_.push(b);
  }
  /// \}

  [[nodiscard]] const A& allocator() const noexcept { return alloc_; }

 private:
  block_pool(block_pool_config cfg, A allocator) : cfg_(cfg), alloc_(std::move(allocator)) {
    refcount_.assign(static_cast<std::size_t>(cfg.num_blocks), 0);
    alloc_.reset(cfg.num_blocks);
    for (block_id b = cfg.reserved_blocks; b < cfg.num_blocks; ++b) alloc_.push(b);
  }

  void set_in_use(block_id b) noexcept {
    std::int32_t& rc = refcount_[static_cast<std::size_t>(b)];
    KVPAGER_ASSERT(rc == 0, "block_pool: a block handed out was still referenced");
    rc = 1;
    ++used_;
    ++references_;
  }

  block_pool_config cfg_;
  [[no_unique_address]] A alloc_;
  std::vector<std::int32_t> refcount_;
  std::int32_t used_ = 0;
  std::int32_t shared_ = 0;
  std::int64_t references_ = 0;
};

KVPAGER_NAMESPACE_END
