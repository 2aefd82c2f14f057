// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// indexed_heap: a binary min-heap over the integers [0, capacity) with a two-part key per element (compared
/// lexicographically). O(log n) push, erase of any element and pop; O(1) membership and top; storage allocated
/// once by reset. The ordered index behind the indexed eviction policies (LFU, priority, FIFO).

#include <cstdint>
#include <utility>
#include <vector>

#include "kvpager/core/assert.hpp"
#include "kvpager/core/config.hpp"

KVPAGER_NAMESPACE_BEGIN

class indexed_heap {
 public:
  /// Ordering key: smaller `primary` first, then smaller `secondary`.
  struct key {
    std::uint64_t primary = 0;
    std::uint64_t secondary = 0;
    friend constexpr bool operator<(const key& a, const key& b) noexcept {
      return a.primary != b.primary ? a.primary < b.primary : a.secondary < b.secondary;
    }
  };

  void reset(std::int32_t capacity) {
    heap_.clear();
    heap_.reserve(static_cast<std::size_t>(capacity));
    pos_.assign(static_cast<std::size_t>(capacity), -1);
    keys_.assign(static_cast<std::size_t>(capacity), key{});
  }

  [[nodiscard]] std::int32_t size() const noexcept { return static_cast<std::int32_t>(heap_.size()); }
  [[nodiscard]] bool contains(std::int32_t i) const noexcept {
    return i >= 0 && static_cast<std::size_t>(i) < pos_.size() && pos_[static_cast<std::size_t>(i)] >= 0;
  }
  [[nodiscard]] std::int32_t top() const noexcept {
    KVPAGER_ASSERT(!heap_.empty(), "indexed_heap::top on an empty heap");
    return heap_.front();
  }

  /// Adds `i` (not present) with key `k`. Never reallocates: capacity was reserved by reset.
  void push(std::int32_t i, key k) noexcept {
    KVPAGER_ASSERT(i >= 0 && static_cast<std::size_t>(i) < pos_.size() && !contains(i),
                   "indexed_heap::push of an out-of-range or present element");
    keys_[static_cast<std::size_t>(i)] = k;
    heap_.push_back(i);  // within reserved capacity
    sift_up(heap_.size() - 1);
  }

  std::int32_t pop() noexcept {
    const std::int32_t i = top();
    erase(i);
    return i;
  }

  void erase(std::int32_t i) noexcept {
    KVPAGER_ASSERT(contains(i), "indexed_heap::erase of an element that is not present");
    const auto p = static_cast<std::size_t>(pos_[static_cast<std::size_t>(i)]);
    const std::int32_t last = heap_.back();
    heap_.pop_back();
    pos_[static_cast<std::size_t>(i)] = -1;
    if (p == heap_.size()) return;
    place(p, last);
    sift_down(sift_up(p));
  }

 private:
  [[nodiscard]] bool less(std::int32_t a, std::int32_t b) const noexcept {
    return keys_[static_cast<std::size_t>(a)] < keys_[static_cast<std::size_t>(b)];
  }
  void place(std::size_t p, std::int32_t i) noexcept {
    heap_[p] = i;
    pos_[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(p);
  }
  std::size_t sift_up(std::size_t p) noexcept {
    const std::int32_t i = heap_[p];
    while (p > 0) {
      const std::size_t parent = (p - 1) / 2;
      if (!less(i, heap_[parent])) break;
      place(p, heap_[parent]);
      p = parent;
    }
    place(p, i);
    return p;
  }
  void sift_down(std::size_t p) noexcept {
    const std::int32_t i = heap_[p];
    const std::size_t n = heap_.size();
    for (;;) {
      std::size_t c = 2 * p + 1;
      if (c >= n) break;
      if (c + 1 < n && less(heap_[c + 1], heap_[c])) ++c;
      if (!less(heap_[c], i)) break;
      place(p, heap_[c]);
      p = c;
    }
    place(p, i);
  }

  std::vector<std::int32_t> heap_;
  std::vector<std::int32_t> pos_;
  std::vector<key> keys_;
};

KVPAGER_NAMESPACE_END
