#pragma once
/// \file
/// The sharing_policy concept: how sequences share physical blocks.
///
/// Reference counting and copy-on-write are done by the cache for every policy: a block referenced by more than
/// one sequence is never written in place; appending into a shared, partly filled block gives the writer a fresh
/// block and records a (src, dst) copy in the step plan. The sharing policy decides what `fork` does and whether
/// block content stays findable after its last reference is dropped (a content cache such as prefix caching).
///
/// | expression       | result               | noexcept | complexity | semantics                                              |
/// |------------------|----------------------|----------|------------|--------------------------------------------------------|
/// | `S{}`            | `S`                  | -        | O(1)       |                                                        |
/// | `S::fork`        | `fork_mode` constant | -        | -          | `share`: the child references the parent's blocks; `copy`: the child gets fresh blocks and the plan copies them |
/// | `s.reset(n)`     | `void`               | no       | O(n)       | empty policy for block ids [0, n); may allocate        |
/// | `cs.is_cached(b)`| `bool`               | yes      | O(1)       | `b` holds content the policy can hand out again (keep it when unreferenced, subject to the eviction policy) |
/// | `s.uncache(b)`   | `void`               | yes      | O(1)       | `b`'s content is discarded (evicted or reused): forget it; precondition `is_cached(b)` |
///
/// Content caches (prefix caching) add lookup and commit operations in a refinement of this concept; the cache
/// detects them, so policies without them keep working unchanged.

#include <concepts>
#include <cstdint>

#include "kvpager/core/config.hpp"
#include "kvpager/core/types.hpp"

KVPAGER_NAMESPACE_BEGIN

/// What `fork` does with the parent's blocks.
enum class fork_mode {
  share,  ///< the child references the parent's blocks (refcount + 1); writes into shared blocks copy first
  copy,   ///< the child gets its own blocks and the plan copies the parent's content into them
};

template <class S>
concept sharing_policy = std::default_initializable<S> && std::movable<S> &&
                         requires {
                           { S::fork } -> std::convertible_to<fork_mode>;
                         } && requires(S& s, const S& cs, block_id b, std::int32_t n) {
                           { s.reset(n) } -> std::same_as<void>;
                           { cs.is_cached(b) } noexcept -> std::same_as<bool>;
                           { s.uncache(b) } noexcept -> std::same_as<void>;
                         };

/// The smallest sharing policy: declarations only, for concept tests and as a template to copy.
struct sharing_policy_archetype {
  static constexpr fork_mode fork = fork_mode::share;
  void reset(std::int32_t n);
  [[nodiscard]] bool is_cached(block_id b) const noexcept;
  void uncache(block_id b) noexcept;
};

KVPAGER_NAMESPACE_END
