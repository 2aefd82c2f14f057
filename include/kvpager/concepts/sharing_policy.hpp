// SPDX-License-Identifier: Apache-2.0
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
/// Content caches (prefix caching) model the refinement `content_cache` below. A policy says which it is with
/// `static constexpr bool caches_content = true;` (or `false`): a policy that declares `true` must provide every
/// member of the refinement, and one that is missing is rejected by `sharing_policy` with a diagnostic naming the
/// member's expression, never accepted with prefix caching silently off. The declaration is optional for a plain
/// sharing policy, but a type with a nested `cursor` or a `first_cursor`, `lookup` or `commit` member (it looks
/// like a content cache) must declare either way.
///
/// | expression           | result          | semantics                                                          |
/// |----------------------|-----------------|--------------------------------------------------------------------|
/// | `S::caches_content`  | `bool` constant | optional; `true`: S is a content cache (`content_cache<S>` must hold) |

#include <concepts>
#include <cstdint>
#include <span>
#include <type_traits>

#include "kvpager/concepts/value_concepts.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/types.hpp"

KVPAGER_NAMESPACE_BEGIN

/// What `fork` does with the parent's blocks.
enum class fork_mode {
  share,  ///< the child references the parent's blocks (refcount + 1); writes into shared blocks copy first
  copy,   ///< the child gets its own blocks and the plan copies the parent's content into them
};

/// The smallest sharing policy: declarations only, for concept tests and as a template to copy.
struct sharing_policy_archetype {
  static constexpr fork_mode fork = fork_mode::share;
  void reset(const pool_geometry& g);
  [[nodiscard]] bool is_cached(block_id b) const noexcept;
  void uncache(block_id b) noexcept;
};

/// The smallest content cache: declarations only, for concept tests and as a template to copy.
struct content_cache_archetype : sharing_policy_archetype {
  static constexpr bool caches_content = true;
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

/// The smallest content cache that takes precomputed block hashes (prehashed_content_cache).
struct prehashed_content_cache_archetype : content_cache_archetype {
  [[nodiscard]] std::uint64_t hash(const cursor& c, std::span<const token_id> tokens) const noexcept;
  using content_cache_archetype::lookup;
  block_id lookup(cursor& c, std::uint64_t h, std::span<const token_id> tokens) const noexcept;
  using content_cache_archetype::commit;
  void commit(block_id b, cursor& c, std::uint64_t h, std::span<const token_id> tokens) noexcept;
  [[nodiscard]] std::uint64_t block_hash(block_id b) const noexcept;
};

/// The smallest content cache whose lookups can be re-checked by stamp (stamped_content_cache).
struct stamped_content_cache_archetype : prehashed_content_cache_archetype {
  [[nodiscard]] std::uint64_t first_holder_stamp(block_id b) const noexcept;
  [[nodiscard]] std::uint64_t commits() const noexcept;
};

namespace detail {
template <class S>
concept sharing_fork_mode = requires {
  { S::fork } -> std::convertible_to<fork_mode>;
};
template <class S>
concept sharing_reset = requires(S& s, const pool_geometry& g) {
  { s.reset(g) } -> std::same_as<void>;
};
template <class S>
concept sharing_is_cached = requires(const S& cs, block_id b) {
  { cs.is_cached(b) } noexcept -> std::same_as<bool>;
};
template <class S>
concept sharing_uncache = requires(S& s, block_id b) {
  { s.uncache(b) } noexcept -> std::same_as<void>;
};

/// `S::caches_content`, a bool constant, is present.
template <class S>
concept has_content_declaration = requires {
  { S::caches_content } -> std::convertible_to<bool>;
  typename std::bool_constant<static_cast<bool>(S::caches_content)>;
};
/// What `S` declares itself to be: a content cache (true) or not (false, also when it declares nothing).
template <class S>
inline constexpr bool declares_content_cache = [] {
  if constexpr (has_content_declaration<S>) {
    return static_cast<bool>(S::caches_content);
  } else {
    return false;
  }
}();
/// `S` has a member of the content_cache refinement (a nested cursor, first_cursor, lookup or commit).
template <class S>
concept looks_like_content_cache =
    requires { typename S::cursor; } || requires { &S::first_cursor; } || requires { &S::lookup; } ||
    requires { &S::commit; };
/// A type that looks like a content cache says whether it is one (a partial one would be a plain sharing policy,
/// with prefix caching silently off).
template <class S>
concept declares_whether_it_caches_content = has_content_declaration<S> || !looks_like_content_cache<S>;

// One concept per member of the content_cache refinement, joined by conjunctions only, so a declared content
// cache missing a member gets a diagnostic naming that member's expression.
template <class S>
concept content_cursor = detail::regular_value<typename S::cursor>;
template <class S>
concept content_first_cursor = requires(const S& cs, std::uint64_t k) {
  { cs.first_cursor(k) } noexcept -> std::same_as<typename S::cursor>;
};
template <class S>
concept content_lookup = requires(const S& cs, typename S::cursor& c, std::span<const token_id> t) {
  { cs.lookup(c, t) } noexcept -> std::same_as<block_id>;
};
template <class S>
concept content_commit = requires(S& s, block_id b, typename S::cursor& c, std::span<const token_id> t) {
  { s.commit(b, c, t) } noexcept -> std::same_as<void>;
};
template <class S>
concept content_cursor_after = requires(const S& cs, block_id b) {
  { cs.cursor_after(b) } noexcept -> std::same_as<typename S::cursor>;
};
template <class S>
concept content_valid = requires(const S& cs, const typename S::cursor& cc) {
  { cs.valid(cc) } noexcept -> std::same_as<bool>;
};
template <class S>
concept content_num_cached = requires(const S& cs) {
  { cs.num_cached() } noexcept -> std::same_as<std::int32_t>;
};
template <class S>
concept content_cache_ops = content_cursor<S> && content_first_cursor<S> && content_lookup<S> && content_commit<S> &&
                            content_cursor_after<S> && content_valid<S> && content_num_cached<S>;

// The optional members of prehashed_content_cache, one concept each.
template <class S>
concept content_hash = requires(const S& cs, const typename S::cursor& cc, std::span<const token_id> t) {
  { cs.hash(cc, t) } noexcept -> std::same_as<std::uint64_t>;
};
template <class S>
concept content_lookup_hashed =
    requires(const S& cs, typename S::cursor& c, std::uint64_t h, std::span<const token_id> t) {
      { cs.lookup(c, h, t) } noexcept -> std::same_as<block_id>;
    };
template <class S>
concept content_commit_hashed =
    requires(S& s, block_id b, typename S::cursor& c, std::uint64_t h, std::span<const token_id> t) {
      { s.commit(b, c, h, t) } noexcept -> std::same_as<void>;
    };
template <class S>
concept content_block_hash = requires(const S& cs, block_id b) {
  { cs.block_hash(b) } noexcept -> std::same_as<std::uint64_t>;
};

/// The type whose content-cache members sharing_policy checks: `S` when it declares `caches_content = true`, the
/// archetype (which has them all) otherwise. This keeps the concept a plain conjunction.
template <class S>
using content_subject = std::conditional_t<declares_content_cache<S>, S, content_cache_archetype>;
}  // namespace detail

template <class S>
concept sharing_policy = detail::default_value<S> && detail::movable_value<S> && detail::sharing_fork_mode<S> &&
                         detail::sharing_reset<S> && detail::sharing_is_cached<S> && detail::sharing_uncache<S> &&
                         detail::declares_whether_it_caches_content<S> &&
                         detail::content_cache_ops<detail::content_subject<S>>;

/// content_cache: a sharing policy that remembers the content of full blocks so later sequences can reuse them
/// (prefix caching). Content is addressed by a chain: a `cursor` stands for "the blocks so far"; looking up or
/// committing one block's tokens from a cursor gives the cursor after that block. The cache calls `commit` for
/// every block that becomes full, and `lookup` block by block at admission; eviction is the eviction policy's.
///
/// | expression              | result         | noexcept | complexity        | semantics                                   |
/// |-------------------------|----------------|----------|-------------------|---------------------------------------------|
/// | `S::caches_content`     | `true`         | -        | -                 | the declaration                             |
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
concept content_cache = sharing_policy<S> && detail::declares_content_cache<S>;

/// prehashed_content_cache: a content cache that also takes block hashes computed earlier, so a request keeps its
/// chained block hashes and no block is hashed twice (the cache detects it; these members are optional).
///
/// | expression              | result          | noexcept | complexity    | semantics                                   |
/// |-------------------------|-----------------|----------|---------------|---------------------------------------------|
/// | `cs.hash(c, t)`         | `std::uint64_t` | yes      | O(block_size) | the chained hash of a block holding `t` after `c` |
/// | `cs.lookup(c, h, t)`    | `block_id`      | yes      | O(1)          | `lookup(c, t)` given `h == hash(c, t)` (a wrong `h` must not give a wrong hit where the policy verifies tokens) |
/// | `s.commit(b, c, h, t)`  | `void`          | yes      | O(1)          | `commit(b, c, t)` given `h == hash(c, t)`   |
/// | `cs.block_hash(b)`      | `std::uint64_t` | yes      | O(1)          | the chained hash cached block `b` was committed or found with |
template <class S>
concept prehashed_content_cache = content_cache<S> && detail::content_hash<S> && detail::content_lookup_hashed<S> &&
                                  detail::content_commit_hashed<S> && detail::content_block_hash<S>;

/// stamped_content_cache: a prehashed content cache that can say, in O(1), that a lookup's answer still stands, so a
/// cache can keep a lookup (the waiting request at the head, looked up again every step while the pool is full) and
/// re-check it instead of redoing it (hybrid_kv_cache does; the members are optional, detected by the cache).
///
/// | expression                  | result          | noexcept | complexity | semantics                              |
/// |-----------------------------|-----------------|----------|------------|----------------------------------------|
/// | `cs.first_holder_stamp(b)`  | `std::uint64_t` | yes      | O(1)       | nonzero while `b` is what a lookup from a root cursor (`first_cursor`) answers for `b`'s content, and the same value exactly as long as that stays so (never reused, not even across `reset`); 0 otherwise |
/// | `cs.commits()`              | `std::uint64_t` | yes      | O(1)       | commits that cached a block so far, never reset: a lookup that missed still misses while it is unchanged |
template <class S>
concept stamped_content_cache = prehashed_content_cache<S> && requires(const S& cs, block_id b) {
  { cs.first_holder_stamp(b) } noexcept -> std::same_as<std::uint64_t>;
  { cs.commits() } noexcept -> std::same_as<std::uint64_t>;
};

/// chained_content_cache: a prehashed content cache that hashes a block after any chained hash, cached or not
/// (`cs.chained_hash(parent, tokens)`, the hash lookup and commit would compute after a block whose hash is
/// `parent`). A paged_kv_cache with a host tier needs it: the tier is looked up past the device's last hit.
template <class S>
concept chained_content_cache =
    prehashed_content_cache<S> && requires(const S& cs, std::uint64_t h, std::span<const token_id> t) {
      { cs.chained_hash(h, t) } noexcept -> std::same_as<std::uint64_t>;
    };

KVPAGER_NAMESPACE_END
