#pragma once
/// \file
/// lifo_allocator: a free stack. The most recently freed block is handed out first, so its bytes are likely
/// still in the GPU's L2 and the host's page tables are warm. Initially pops the highest id first (blocks are
/// pushed in id order), which is the order of the seed's `free_blocks.pop()` demo.
/// Complexity: every operation O(1) (an intrusive list used at one end), no allocation after reset.

#include <cstdint>

#include "kvpager/concepts/block_allocator.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/index_list.hpp"

KVPAGER_NAMESPACE_BEGIN

class lifo_allocator {
 public:
  static constexpr free_order order = free_order::lifo;

  void reset(std::int32_t n) { list_.reset(n); }
  void push(block_id b) noexcept { list_.push_front(b); }
  block_id pop() noexcept { return list_.pop_front(); }
  void erase(block_id b) noexcept { list_.erase(b); }
  [[nodiscard]] bool contains(block_id b) const noexcept { return list_.contains(b); }
  [[nodiscard]] std::int32_t size() const noexcept { return list_.size(); }

 private:
  index_list list_;
};

KVPAGER_NAMESPACE_END
