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
/// | `s.reset(g)`     | `void`               | no       | O(g.num_blocks) | empty policy for pool geometry `g`; may allocate |
/// | `cs.is_cached(b)`| `bool`               | yes      | O(1)       | `b` holds content the policy can hand out again (keep it when unreferenced, subject to the eviction policy) |
/// | `s.uncache(b)`   | `void`               | yes      | O(1)       | `b`'s content is discarded (evicted or reused): forget it; precondition `is_cached(b)` |
///
/// Content caches (prefix caching) model the refinement `content_cache` below; the cache detects it, so policies
/// without it keep working unchanged.

#include <concepts>
#include <cstdint>
#include <span>

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
                         } && requires(S& s, const S& cs, block_id b, const pool_geometry& g) {
                           { s.reset(g) } -> std::same_as<void>;
                           { cs.is_cached(b) } noexcept -> std::same_as<bool>;
                           { s.uncache(b) } noexcept -> std::same_as<void>;
                         };

/// content_cache: a sharing policy that remembers the content of full blocks so later sequences can reuse them
/// (prefix caching). Content is addressed by a chain: a `cursor` stands for "the blocks so far"; looking up or
/// committing one block's tokens from a cursor gives the cursor after that block. The cache calls `commit` for
/// every block that becomes full, and `lookup` block by block at admission; eviction is the eviction policy's.
///
/// | expression              | result         | noexcept | complexity        | semantics                                   |
/// |-------------------------|----------------|----------|-------------------|---------------------------------------------|
/// | `S::cursor`             | type           | -        | -                 | regular value type                          |
/// | `cs.first_cursor(k)`    | `S::cursor`    | yes      | O(1)              | the empty chain under extra key `k` (tenant salt, adapter id) |
/// | `cs.lookup(c, t)`       | `block_id`     | yes      | O(block_size)     | a cached block holding tokens `t` after `c` (advancing `c`), or `no_block` |
/// | `s.commit(b, c, t)`     | `void`         | yes      | O(block_size)     | block `b` (full, not cached) now holds `t` after `c`; advances `c`. A policy that cannot take more content (memory) may leave `b` uncached and `c` invalid instead |
/// | `cs.cursor_after(b)`    | `S::cursor`    | yes      | O(1)              | the chain ending with cached block `b` (invalid if not cached) |
/// | `cs.valid(c)`           | `bool`         | yes      | O(1)              | whether `c` can still be extended (false after an uncached block) |
/// | `cs.num_cached()`       | `std::int32_t` | yes      | O(1)              | blocks whose content is cached              |
///
/// `t` is a `std::span<const token_id>` of exactly block_size tokens. Complexities exclude hash collisions.
template <class S>
concept content_cache = sharing_policy<S> && std::regular<typename S::cursor> &&
                        requires(S& s, const S& cs, typename S::cursor& c, const typename S::cursor& cc, block_id b,
                                 std::span<const token_id> t, std::uint64_t k) {
                          { cs.first_cursor(k) } noexcept -> std::same_as<typename S::cursor>;
                          { cs.lookup(c, t) } noexcept -> std::same_as<block_id>;
                          { s.commit(b, c, t) } noexcept -> std::same_as<void>;
                          { cs.cursor_after(b) } noexcept -> std::same_as<typename S::cursor>;
                          { cs.valid(cc) } noexcept -> std::same_as<bool>;
                          { cs.num_cached() } noexcept -> std::same_as<std::int32_t>;
                        };

/// The smallest sharing policy: declarations only, for concept tests and as a template to copy.
struct sharing_policy_archetype {
  static constexpr fork_mode fork = fork_mode::share;
  void reset(const pool_geometry& g);
  [[nodiscard]] bool is_cached(block_id b) const noexcept;
  void uncache(block_id b) noexcept;
};

KVPAGER_NAMESPACE_END

KVPAGER_NAMESPACE_BEGIN

/// The smallest content cache: declarations only, for concept tests and as a template to copy.
struct content_cache_archetype : sharing_policy_archetype {
  struct cursor {
    friend bool operator==(const cursor&, const cursor&) = default;
  };
  [[nodiscard]] cursor first_cursor(std::uint64_t extra_key) const noexcept;
  block_id lookup(cursor& c, std::span<const token_id> tokens) const noexcept;
  void commit(block_id b, cursor& c, std::span<const token_id> tokens) noexcept;
  [[nodiscard]] cursor cursor_after(block_id b) const noexcept;
  [[nodiscard]] bool valid(const cursor& c) const noexcept;
  [[nodiscard]] std::int32_t num_cached() const noexcept;
};

KVPAGER_NAMESPACE_END
