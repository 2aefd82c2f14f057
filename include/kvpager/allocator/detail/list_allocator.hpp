// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The one implementation behind free_list_allocator (FIFO) and lifo_allocator: an index_list whose pop end is
/// the head and whose push end is the tail (FIFO) or the head (LIFO). Every operation O(1), no allocation after
/// reset.

#include <cstdint>

#include "kvpager/concepts/block_allocator.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/index_list.hpp"

KVPAGER_NAMESPACE_BEGIN
namespace detail {

template <free_order Order>
class list_allocator {
  static_assert(Order == free_order::fifo || Order == free_order::lifo,
                "list_allocator implements the fifo and lifo orders only");

 public:
  static constexpr free_order order = Order;

  void reset(std::int32_t n) { list_.reset(n); }
  void push(block_id b) noexcept {
    if constexpr (Order == free_order::fifo) {
      list_.push_back(b);
    } else {
      list_.push_front(b);
    }
  }
  block_id pop() noexcept { return list_.pop_front(); }
  void erase(block_id b) noexcept { list_.erase(b); }
  [[nodiscard]] bool contains(block_id b) const noexcept { return list_.contains(b); }
  [[nodiscard]] std::int32_t size() const noexcept { return list_.size(); }

  /// Read-only view of the free blocks in allocation order, next first (for inspection and tests).
  [[nodiscard]] const index_list& queue() const noexcept { return list_; }

 private:
  index_list list_;
};

}  // namespace detail
KVPAGER_NAMESPACE_END
