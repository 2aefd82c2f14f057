// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// lowest_id_allocator: always hands out the smallest free block id, so live data stays packed at the start of
/// the pool (helps tools that shrink or snapshot the pool, and makes allocation deterministic under any free
/// order). A hierarchical bitmap: one bit per block, one summary bit per 64-bit word above it.
/// Complexity: O(log64 n) per operation (at most 4 levels up to 16M blocks), no allocation after reset.

#include <bit>
#include <cstdint>
#include <vector>

#include "kvpager/concepts/block_allocator.hpp"
#include "kvpager/core/assert.hpp"
#include "kvpager/core/config.hpp"

KVPAGER_NAMESPACE_BEGIN

class lowest_id_allocator {
 public:
  static constexpr free_order order = free_order::lowest_id;

  void reset(std::int32_t n) {
    levels_.clear();
    capacity_ = n;
    size_ = 0;
    std::size_t bits = static_cast<std::size_t>(n > 0 ? n : 1);
    do {  // level 0 has one bit per block; each next level one bit per word below; the top level is one word
      const std::size_t words = (bits + 63) / 64;
      levels_.emplace_back(words, 0);
      bits = words;
    } while (bits > 1);
  }

  void push(block_id b) noexcept {
    KVPAGER_ASSERT(b >= 0 && b < capacity_ && !contains(b), "lowest_id_allocator::push of an invalid or free block");
    std::size_t i = static_cast<std::size_t>(b);
    for (auto& level : levels_) {
      std::uint64_t& w = level[i / 64];
      const bool was_empty = w == 0;
      w |= std::uint64_t{1} << (i % 64);
      if (!was_empty) break;  // summary bits above are already set
      i /= 64;
    }
    ++size_;
  }

  block_id pop() noexcept {
    KVPAGER_ASSERT(size_ > 0, "lowest_id_allocator::pop on an empty set");
    std::size_t i = 0;
    for (std::size_t l = levels_.size(); l-- > 0;)
      i = i * 64 + static_cast<std::size_t>(std::countr_zero(levels_[l][i]));
    const auto b = static_cast<block_id>(i);
    erase(b);
    return b;
  }

  void erase(block_id b) noexcept {
    KVPAGER_ASSERT(contains(b), "lowest_id_allocator::erase of a block that is not free");
    std::size_t i = static_cast<std::size_t>(b);
    for (auto& level : levels_) {
      std::uint64_t& w = level[i / 64];
      w &= ~(std::uint64_t{1} << (i % 64));
      if (w != 0) break;  // the word still has free blocks: summaries above stay set
      i /= 64;
    }
    --size_;
  }

  [[nodiscard]] bool contains(block_id b) const noexcept {
    if (b < 0 || b >= capacity_) return false;
    const auto i = static_cast<std::size_t>(b);
    return (levels_[0][i / 64] >> (i % 64) & 1U) != 0;
  }
  [[nodiscard]] std::int32_t size() const noexcept { return size_; }

 private:
  std::vector<std::vector<std::uint64_t>> levels_;
  std::int32_t capacity_ = 0;
  std::int32_t size_ = 0;
};

KVPAGER_NAMESPACE_END
