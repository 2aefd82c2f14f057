// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The block_allocator concept: the set of free blocks of a pool and the order in which they are handed out.
///
/// A block_allocator owns no blocks and no refcounts; the pool (block_pool / paged_kv_cache) tells it which blocks
/// are free and asks it which free block comes next. It decides allocation order only: LIFO for cache-hot reuse,
/// FIFO (vLLM's free queue, which with lazy eviction is the LRU order of cached blocks), lowest id first, ...
///
/// | expression        | result          | noexcept | complexity          | semantics                                                |
/// |-------------------|-----------------|----------|---------------------|----------------------------------------------------------|
/// | `A{}`             | `A`             | -        | O(1)                | empty allocator; usable after reset                      |
/// | `a.reset(n)`      | `void`          | no       | O(n)                | empty set over ids [0, n); allocates; called at creation |
/// | `a.push(b)`       | `void`          | yes      | O(1) (see policy)   | `b` becomes free; precondition `!a.contains(b)`          |
/// | `a.pop()`         | `block_id`      | yes      | O(1) (see policy)   | removes and returns the next block; precondition `size()>0` |
/// | `a.erase(b)`      | `void`          | yes      | O(1) (see policy)   | removes free block `b` (a cached block is hit); precondition `contains(b)` |
/// | `ca.contains(b)`  | `bool`          | yes      | O(1)                | whether `b` is in the free set                           |
/// | `ca.size()`       | `std::int32_t`  | yes      | O(1)                | number of free blocks                                    |
///
/// Optional: `A::order` (a `free_order` constant) tells compositions what order the allocator keeps; read it
/// through `allocator_traits<A>::order` (defaults to `free_order::unspecified`). Per-operation work must not
/// allocate memory: storage is sized once by `reset`.

#include <concepts>
#include <cstdint>

#include "kvpager/concepts/value_concepts.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/types.hpp"

KVPAGER_NAMESPACE_BEGIN

/// The order in which an allocator hands out free blocks.
enum class free_order {
  unspecified,
  fifo,       ///< least recently freed first (a queue); with lazy eviction this is LRU over cached blocks
  lifo,       ///< most recently freed first (a stack); the block is likely still in L2
  lowest_id,  ///< smallest free id first; keeps the used part of the pool compact
};

template <class A>
concept block_allocator = detail::default_value<A> && detail::movable_value<A> &&
                          requires(A& a, const A& ca, block_id b, std::int32_t n) {
                            { a.reset(n) } -> std::same_as<void>;
                            { a.push(b) } noexcept -> std::same_as<void>;
                            { a.pop() } noexcept -> std::same_as<block_id>;
                            { a.erase(b) } noexcept -> std::same_as<void>;
                            { ca.contains(b) } noexcept -> std::same_as<bool>;
                            { ca.size() } noexcept -> std::same_as<std::int32_t>;
                          };

/// Uniform access to the optional parts of a block_allocator.
template <block_allocator A>
struct allocator_traits {
  static constexpr free_order order = [] {
    if constexpr (requires { A::order; }) {
      return static_cast<free_order>(A::order);
    } else {
      return free_order::unspecified;
    }
  }();
};

/// The smallest type that models block_allocator: declarations only, for concept tests and as a template to copy.
struct block_allocator_archetype {
  void reset(std::int32_t n);
  void push(block_id b) noexcept;
  block_id pop() noexcept;
  void erase(block_id b) noexcept;
  [[nodiscard]] bool contains(block_id b) const noexcept;
  [[nodiscard]] std::int32_t size() const noexcept;
};

KVPAGER_NAMESPACE_END
