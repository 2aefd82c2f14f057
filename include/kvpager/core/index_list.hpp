// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// index_list: an intrusive doubly linked list over the integers [0, capacity), threaded through two int32
/// arrays allocated once. O(1) push/pop at both ends, O(1) erase from the middle, O(1) membership; no allocation
/// per operation. This is the structure of vLLM's FreeKVCacheBlockQueue, with indices instead of pointers.

#include <cstdint>
#include <vector>

#include "kvpager/core/assert.hpp"
#include "kvpager/core/config.hpp"

KVPAGER_NAMESPACE_BEGIN

class index_list {
 public:
  index_list() = default;
  /// An empty list able to hold the indices [0, capacity).
  explicit index_list(std::int32_t capacity) { reset(capacity); }

  /// Empties the list and resizes it for [0, capacity). Allocates; not for hot paths.
  void reset(std::int32_t capacity) {
    KVPAGER_ASSERT(capacity >= 0, "index_list capacity must be non-negative");
    capacity_ = capacity;
    // Slot `capacity` is the sentinel: next_[sentinel] is the head, prev_[sentinel] the tail.
    next_.assign(static_cast<std::size_t>(capacity) + 1, not_linked);
    prev_.assign(static_cast<std::size_t>(capacity) + 1, not_linked);
    next_[sentinel()] = sentinel_index();
    prev_[sentinel()] = sentinel_index();
    size_ = 0;
  }

  [[nodiscard]] std::int32_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::int32_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }

  [[nodiscard]] bool contains(std::int32_t i) const noexcept {
    return i >= 0 && i < capacity_ && next_[static_cast<std::size_t>(i)] != not_linked;
  }

  /// First / last element; the list must not be empty.
  [[nodiscard]] std::int32_t front() const noexcept {
    KVPAGER_ASSERT(size_ > 0, "index_list::front on an empty list");
    return next_[sentinel()];
  }
  [[nodiscard]] std::int32_t back() const noexcept {
    KVPAGER_ASSERT(size_ > 0, "index_list::back on an empty list");
    return prev_[sentinel()];
  }
  /// The element after `i`, or -1 at the end (iteration in list order).
  [[nodiscard]] std::int32_t next(std::int32_t i) const noexcept {
    const std::int32_t n = next_[static_cast<std::size_t>(i)];
    return n == sentinel_index() ? -1 : n;
  }

  void push_back(std::int32_t i) noexcept { link_after(prev_[sentinel()], i); }
  void push_front(std::int32_t i) noexcept { link_after(sentinel_index(), i); }

  std::int32_t pop_front() noexcept {
    const std::int32_t i = front();
    erase(i);
    return i;
  }
  std::int32_t pop_back() noexcept {
    const std::int32_t i = back();
    erase(i);
    return i;
  }

  /// Removes `i`, which must be in the list.
  void erase(std::int32_t i) noexcept {
    KVPAGER_ASSERT(contains(i), "index_list::erase of an index that is not in the list");
    const auto u = static_cast<std::size_t>(i);
    const std::int32_t p = prev_[u];
    const std::int32_t n = next_[u];
    next_[static_cast<std::size_t>(p)] = n;
    prev_[static_cast<std::size_t>(n)] = p;
    next_[u] = not_linked;
    prev_[u] = not_linked;
    --size_;
  }

 private:
  static constexpr std::int32_t not_linked = -1;
  [[nodiscard]] std::size_t sentinel() const noexcept { return static_cast<std::size_t>(capacity_); }
  [[nodiscard]] std::int32_t sentinel_index() const noexcept { return capacity_; }

  void link_after(std::int32_t pos, std::int32_t i) noexcept {
    KVPAGER_ASSERT(i >= 0 && i < capacity_, "index_list: index out of range");
    KVPAGER_ASSERT(!contains(i), "index_list: index is already in the list");
    const auto u = static_cast<std::size_t>(i);
    const std::int32_t n = next_[static_cast<std::size_t>(pos)];
    prev_[u] = pos;
    next_[u] = n;
    next_[static_cast<std::size_t>(pos)] = i;
    prev_[static_cast<std::size_t>(n)] = i;
    ++size_;
  }

  std::vector<std::int32_t> next_;
  std::vector<std::int32_t> prev_;
  std::int32_t capacity_ = 0;
  std::int32_t size_ = 0;
};

KVPAGER_NAMESPACE_END
