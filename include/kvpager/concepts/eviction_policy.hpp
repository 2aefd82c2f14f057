// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The eviction_policy concept: what happens to a block whose last reference is dropped while the sharing policy
/// still caches its content (a prefix-cache entry), and which such block is reclaimed first.
///
/// `E::retention` (a `retention_mode` constant) selects one of three compositions:
/// - `retention_mode::none`: nothing is kept; the content is forgotten (`S::uncache`) and the block goes back to the
///   allocator clean. Sharing then only happens between live sequences.
/// - `retention_mode::in_free_list`: the cached block goes back to the allocator's free set keeping its content, and is
///   evicted lazily when the allocator hands it out. Allocation order *is* eviction order: with a FIFO allocator
///   this is exactly vLLM v1's LRU (free tail, allocate head, a hit unlinks from the middle).
/// - `retention_mode::indexed`: the policy keeps its own index of cached, unreferenced blocks; the allocator only
///   holds clean blocks. Allocation uses clean blocks first and asks the policy for victims when none are left
///   (vLLM V0's evictor; keeps partial, never-hit-able blocks out of the cache order, vLLM PR #42656).
///
/// All policies:
///
/// | expression     | result | noexcept | complexity | semantics                                  |
/// |----------------|--------|----------|------------|--------------------------------------------|
/// | `E{}`          | `E`    | -        | O(1)       |                                            |
/// | `E::retention` | `retention_mode` constant | - | -   | the composition above                      |
/// | `e.reset(g)`   | `void` | no       | O(g.num_blocks) | empty policy for pool geometry `g`; may allocate |
///
/// Additionally, when `E::retention == retention_mode::indexed`:
///
/// | expression          | result         | noexcept | complexity (see policy) | semantics                                   |
/// |---------------------|----------------|----------|-------------------------|---------------------------------------------|
/// | `e.insert(b, hint)` | `void`         | yes      | O(1) .. O(log n)        | `b` became unreferenced and stays cached    |
/// | `e.erase(b)`        | `void`         | yes      | O(1) .. O(log n)        | `b` was hit and is referenced again         |
/// | `e.pop_victim()`    | `block_id`     | yes      | O(1) .. O(log n)        | removes and returns the block to reclaim; precondition `size() > 0` |
/// | `e.on_hit(b)`       | `void`         | yes      | O(1)                    | `b` was hit (frequency-aware policies count it) |
/// | `ce.contains(b)`    | `bool`         | yes      | O(1)                    | `b` is in the index                         |
/// | `ce.size()`         | `std::int32_t` | yes      | O(1)                    | number of indexed blocks                    |
///
/// Optional, any retention mode (the cache detects it with `detail::forgets_content`; a `forget` callable with
/// another signature, e.g. not noexcept, makes the type fail the concept rather than be skipped silently):
///
/// | expression    | result | noexcept | complexity | semantics                                                        |
/// |---------------|--------|----------|------------|------------------------------------------------------------------|
/// | `e.forget(b)` | `void` | yes      | O(1)       | `b`'s cached content was discarded (evicted, overwritten, never written, released without retention); `b` is not indexed. A policy that keeps per-content state (hit counts, first-use stamps) resets it here, so the next content starts afresh. Called for every discard, and only then. |

#include <concepts>
#include <cstdint>
#include <type_traits>

#include "kvpager/concepts/value_concepts.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/types.hpp"

KVPAGER_NAMESPACE_BEGIN

/// How cached, unreferenced blocks are kept (see the concept documentation).
enum class retention_mode { none, in_free_list, indexed };

/// Per-request context given to an indexed policy when a block becomes evictable.
struct retention_hint {
  std::int32_t priority = 0;  ///< larger = keep longer (TensorRT-LLM style retention priority)
};

/// The smallest indexed eviction policy: declarations only, for concept tests and as a template to copy.
struct eviction_policy_archetype {
  static constexpr retention_mode retention = retention_mode::indexed;
  void reset(const pool_geometry& g);
  void insert(block_id b, retention_hint hint) noexcept;
  void erase(block_id b) noexcept;
  block_id pop_victim() noexcept;
  void on_hit(block_id b) noexcept;
  [[nodiscard]] bool contains(block_id b) const noexcept;
  [[nodiscard]] std::int32_t size() const noexcept;
};

namespace detail {
template <class E>
concept has_retention = requires {
  { E::retention } -> std::convertible_to<retention_mode>;
};
template <class E>
concept eviction_reset = requires(E& e, const pool_geometry& g) {
  { e.reset(g) } -> std::same_as<void>;
};

// One concept per member of the indexed refinement, joined by conjunctions only: a policy missing one gets a
// diagnostic naming that member's expression (a disjunction would only report "no operand is satisfied").
template <class E>
concept eviction_insert = requires(E& e, block_id b, retention_hint h) {
  { e.insert(b, h) } noexcept -> std::same_as<void>;
};
template <class E>
concept eviction_erase = requires(E& e, block_id b) {
  { e.erase(b) } noexcept -> std::same_as<void>;
};
template <class E>
concept eviction_pop_victim = requires(E& e) {
  { e.pop_victim() } noexcept -> std::same_as<block_id>;
};
template <class E>
concept eviction_on_hit = requires(E& e, block_id b) {
  { e.on_hit(b) } noexcept -> std::same_as<void>;
};
template <class E>
concept eviction_contains = requires(const E& ce, block_id b) {
  { ce.contains(b) } noexcept -> std::same_as<bool>;
};
template <class E>
concept eviction_size = requires(const E& ce) {
  { ce.size() } noexcept -> std::same_as<std::int32_t>;
};
template <class E>
concept indexed_eviction_ops = eviction_insert<E> && eviction_erase<E> && eviction_pop_victim<E> &&
                               eviction_on_hit<E> && eviction_contains<E> && eviction_size<E>;

/// The type whose indexed operations eviction_policy checks: `E` when it declares retention_mode::indexed, the
/// archetype (which has them all) otherwise. This keeps the concept a plain conjunction.
template <class E>
using indexed_subject =
    std::conditional_t<static_cast<retention_mode>(E::retention) == retention_mode::indexed, E,
                       eviction_policy_archetype>;

/// The optional `forget` of the eviction_policy concept.
template <class E>
concept forgets_content = requires(E& e, block_id b) {
  { e.forget(b) } noexcept -> std::same_as<void>;
};
/// Whether `E` declares some `forget(b)`, whatever its signature.
template <class E>
concept declares_forget = requires(E& e, block_id b) { e.forget(b); };
/// The type whose `forget` eviction_policy checks: `E` when it declares one (which must then be the one above, as a
/// throwing one would be skipped silently), a type with the right one otherwise.
struct forget_archetype {
  void forget(block_id b) noexcept;
};
template <class E>
using forget_subject = std::conditional_t<declares_forget<E>, E, forget_archetype>;
}  // namespace detail

template <class E>
concept eviction_policy = detail::default_value<E> && detail::movable_value<E> && detail::has_retention<E> &&
                          detail::eviction_reset<E> && detail::forgets_content<detail::forget_subject<E>> &&
                          detail::indexed_eviction_ops<detail::indexed_subject<E>>;

KVPAGER_NAMESPACE_END
