// SPDX-License-Identifier: Apache-2.0
// Compile-time tests: every shipped policy and archetype models its concept, user-written policies do too, and
// types that break a requirement (missing member, wrong result type, missing noexcept) are rejected.
#include <kvpager/kvpager.hpp>

#include <gtest/gtest.h>

#include <span>

#include "support/custom_policies.hpp"

using namespace kvpager;

// ------------------------------------------------------------------------------------------- positive
static_assert(block_allocator<free_list_allocator>);
static_assert(block_allocator<lifo_allocator>);
static_assert(block_allocator<lowest_id_allocator>);
static_assert(block_allocator<block_allocator_archetype>);
static_assert(block_allocator<kvtest::highest_id_allocator>);

static_assert(eviction_policy<no_eviction>);
static_assert(eviction_policy<eviction_policy_archetype>);
static_assert(eviction_policy<kvtest::user_lru_index>);

static_assert(sharing_policy<refcount_sharing>);
static_assert(sharing_policy<no_sharing>);
static_assert(sharing_policy<sharing_policy_archetype>);
static_assert(sharing_policy<kvtest::user_sharing>);

static_assert(swap_policy<no_swap>);
static_assert(swap_policy<swap_policy_archetype>);
static_assert(swap_policy<kvtest::user_swap>);
static_assert(swap_policy<host_swap> && swap_policy<recompute> && swap_policy<hybrid_swap>);

// Stateless policies cost nothing inside the cache.
static_assert(std::is_empty_v<no_eviction> && std::is_empty_v<refcount_sharing> && std::is_empty_v<no_sharing> &&
              std::is_empty_v<no_swap> && std::is_empty_v<host_swap> && std::is_empty_v<recompute> &&
              std::is_empty_v<hybrid_swap>);

// ------------------------------------------------------------------------------------------- negative
namespace neg {
struct pop_may_throw {  // pop() not noexcept
  void reset(std::int32_t);
  void push(block_id) noexcept;
  block_id pop();
  void erase(block_id) noexcept;
  bool contains(block_id) const noexcept;
  std::int32_t size() const noexcept;
};
struct no_erase {
  void reset(std::int32_t);
  void push(block_id) noexcept;
  block_id pop() noexcept;
  bool contains(block_id) const noexcept;
  std::int32_t size() const noexcept;
};
struct size_is_size_t {
  void reset(std::int32_t);
  void push(block_id) noexcept;
  block_id pop() noexcept;
  void erase(block_id) noexcept;
  bool contains(block_id) const noexcept;
  std::size_t size() const noexcept;
};
struct not_default_constructible {
  explicit not_default_constructible(int);
  void reset(std::int32_t);
  void push(block_id) noexcept;
  block_id pop() noexcept;
  void erase(block_id) noexcept;
  bool contains(block_id) const noexcept;
  std::int32_t size() const noexcept;
};
static_assert(!block_allocator<pop_may_throw>);
static_assert(!block_allocator<no_erase>);
static_assert(!block_allocator<size_is_size_t>);
static_assert(!block_allocator<not_default_constructible>);
static_assert(!block_allocator<int>);
// The value requirements (concepts/value_concepts.hpp): a policy the cache cannot move, or a group kind it cannot
// copy, is not one.
struct not_movable : block_allocator_archetype {  // every member an allocator needs, and no move
  not_movable() = default;
  not_movable(not_movable&&) = delete;
  not_movable& operator=(not_movable&&) = delete;
};
static_assert(!block_allocator<not_movable>);
struct move_only_kind {
  static constexpr const char* kind_name = "move only";
  move_only_kind() = default;
  move_only_kind(move_only_kind&&) = default;
  move_only_kind& operator=(move_only_kind&&) = default;
  std::int64_t skipped_tokens(std::int64_t) const noexcept;
  status validate() const noexcept;
};
static_assert(!group_kind<move_only_kind>);
static_assert(group_kind<sliding_window> && group_kind<any_group_kind>);

struct indexed_without_victim {  // says indexed but cannot pick a victim
  static constexpr retention_mode retention = retention_mode::indexed;
  void reset(const pool_geometry&);
  void insert(block_id, retention_hint) noexcept;
  void erase(block_id) noexcept;
  void on_hit(block_id) noexcept;
  bool contains(block_id) const noexcept;
  std::int32_t size() const noexcept;
};
struct no_retention_constant {
  void reset(const pool_geometry&);
};
struct lazy_only {  // in_free_list needs nothing beyond reset
  static constexpr retention_mode retention = retention_mode::in_free_list;
  void reset(const pool_geometry&);
};
struct eviction_reset_by_count {  // reset must take the pool geometry
  static constexpr retention_mode retention = retention_mode::in_free_list;
  void reset(std::int32_t);
};
struct forget_may_throw {  // the optional forget must be noexcept, or it is not the concept's forget
  static constexpr retention_mode retention = retention_mode::in_free_list;
  void reset(const pool_geometry&);
  void forget(block_id);
};
struct forgets {
  static constexpr retention_mode retention = retention_mode::none;
  void reset(const pool_geometry&);
  void forget(block_id) noexcept;
};
static_assert(!eviction_policy<forget_may_throw>);
static_assert(eviction_policy<forgets> && detail::forgets_content<forgets>);
static_assert(!detail::forgets_content<lazy_only>);
static_assert(!eviction_policy<indexed_without_victim>);
static_assert(!eviction_policy<no_retention_constant>);
static_assert(eviction_policy<lazy_only>);
static_assert(!eviction_policy<eviction_reset_by_count>);

struct sharing_without_fork_mode {
  void reset(const pool_geometry&);
  bool is_cached(block_id) const noexcept;
  void uncache(block_id) noexcept;
};
struct sharing_is_cached_throws {
  static constexpr fork_mode fork = fork_mode::share;
  void reset(const pool_geometry&);
  bool is_cached(block_id) const;
  void uncache(block_id) noexcept;
};
static_assert(!sharing_policy<sharing_without_fork_mode>);
static_assert(!sharing_policy<sharing_is_cached_throws>);

// A swap policy written for 0.1 (its own host pool, action(n) without the free host blocks) no longer models the
// concept: the host pool is the cache's since 0.2.0.
struct swap_policy_of_0_1 {
  void reset(const pool_geometry&);
  preempt_action action(std::int32_t) const noexcept;
  std::int32_t host_capacity() const noexcept;
  std::int32_t host_free() const noexcept;
  bool allocate_host(std::span<block_id>) noexcept;
  void release_host(block_id) noexcept;
};
struct swap_action_may_throw {
  preempt_action action(std::int32_t, std::int32_t) const;
};
struct swap_action_returns_bool {
  bool action(std::int32_t, std::int32_t) const noexcept;
};
static_assert(!swap_policy<swap_policy_of_0_1>);
static_assert(!swap_policy<swap_action_may_throw>);
static_assert(!swap_policy<swap_action_returns_bool>);

// An indexed eviction policy missing any one member is rejected; each member is its own concept (see
// eviction_member_diagnostic below for the compiler's message).
enum class eviction_member { none, insert, erase, pop_victim, on_hit, contains, size };
template <eviction_member M>
struct indexed_without {
  static constexpr retention_mode retention = retention_mode::indexed;
  void reset(const pool_geometry&);
  void insert(block_id, retention_hint) noexcept
    requires(M != eviction_member::insert);
  void erase(block_id) noexcept
    requires(M != eviction_member::erase);
  block_id pop_victim() noexcept
    requires(M != eviction_member::pop_victim);
  void on_hit(block_id) noexcept
    requires(M != eviction_member::on_hit);
  bool contains(block_id) const noexcept
    requires(M != eviction_member::contains);
  std::int32_t size() const noexcept
    requires(M != eviction_member::size);
};
static_assert(eviction_policy<indexed_without<eviction_member::none>>);
static_assert(!eviction_policy<indexed_without<eviction_member::insert>>);
static_assert(!eviction_policy<indexed_without<eviction_member::erase>>);
static_assert(!eviction_policy<indexed_without<eviction_member::pop_victim>>);
static_assert(!eviction_policy<indexed_without<eviction_member::on_hit>>);
static_assert(!detail::eviction_on_hit<indexed_without<eviction_member::on_hit>>);  // the member, by name
static_assert(!eviction_policy<indexed_without<eviction_member::contains>>);
static_assert(!eviction_policy<indexed_without<eviction_member::size>>);
// The same members are not required of a policy that keeps nothing indexed.
static_assert(eviction_policy<lazy_only> && !detail::eviction_on_hit<lazy_only>);

// A sharing policy declares what it is: `caches_content = true` makes every member of the content_cache refinement
// required, and a declared content cache missing one is rejected (not accepted with prefix caching silently off).
enum class content_member { none, first_cursor, lookup, commit, cursor_after, valid, num_cached };
template <content_member M, bool Declared = true>
struct declared_content_cache {
  static constexpr fork_mode fork = fork_mode::share;
  static constexpr bool caches_content = Declared;
  struct cursor {
    friend bool operator==(const cursor&, const cursor&) = default;
  };
  void reset(const pool_geometry&);
  bool is_cached(block_id) const noexcept;
  void uncache(block_id) noexcept;
  cursor first_cursor(std::uint64_t) const noexcept
    requires(M != content_member::first_cursor);
  block_id lookup(cursor&, std::span<const token_id>) const noexcept
    requires(M != content_member::lookup);
  void commit(block_id, cursor&, std::span<const token_id>) noexcept
    requires(M != content_member::commit);
  cursor cursor_after(block_id) const noexcept
    requires(M != content_member::cursor_after);
  bool valid(const cursor&) const noexcept
    requires(M != content_member::valid);
  std::int32_t num_cached() const noexcept
    requires(M != content_member::num_cached);
};
static_assert(content_cache<declared_content_cache<content_member::none>>);
static_assert(!sharing_policy<declared_content_cache<content_member::first_cursor>>);
static_assert(!sharing_policy<declared_content_cache<content_member::lookup>>);
static_assert(!sharing_policy<declared_content_cache<content_member::commit>>);
static_assert(!detail::content_commit<declared_content_cache<content_member::commit>>);  // the member, by name
static_assert(!sharing_policy<declared_content_cache<content_member::cursor_after>>);
static_assert(!sharing_policy<declared_content_cache<content_member::valid>>);
static_assert(!sharing_policy<declared_content_cache<content_member::num_cached>>);
static_assert(!content_cache<declared_content_cache<content_member::num_cached>>);
// Declared `false`: a plain sharing policy whatever members it has; the cache does not cache content.
static_assert(sharing_policy<declared_content_cache<content_member::none, false>> &&
              !content_cache<declared_content_cache<content_member::none, false>>);
static_assert(sharing_policy<declared_content_cache<content_member::commit, false>>);
// prehashed_content_cache: optional members (a content cache without them is still one, the cache hashes itself).
static_assert(prehashed_content_cache<prehashed_content_cache_archetype>);
static_assert(content_cache<content_cache_archetype> && !prehashed_content_cache<content_cache_archetype>);
static_assert(!prehashed_content_cache<declared_content_cache<content_member::none>>);
static_assert(!detail::content_hash<content_cache_archetype> && !detail::content_lookup_hashed<content_cache_archetype> &&
              !detail::content_commit_hashed<content_cache_archetype> && !detail::content_block_hash<content_cache_archetype>);
// stamped_content_cache: optional too (without it the hybrid cache redoes the head's lookup every time).
static_assert(stamped_content_cache<stamped_content_cache_archetype>);
static_assert(!stamped_content_cache<prehashed_content_cache_archetype>);

struct cursor_without_equality {
  static constexpr fork_mode fork = fork_mode::share;
  static constexpr bool caches_content = true;
  struct cursor {};
  void reset(const pool_geometry&);
  bool is_cached(block_id) const noexcept;
  void uncache(block_id) noexcept;
  cursor first_cursor(std::uint64_t) const noexcept;
  block_id lookup(cursor&, std::span<const token_id>) const noexcept;
  void commit(block_id, cursor&, std::span<const token_id>) noexcept;
  cursor cursor_after(block_id) const noexcept;
  bool valid(const cursor&) const noexcept;
  std::int32_t num_cached() const noexcept;
};
static_assert(!sharing_policy<cursor_without_equality>);

// A type that looks like a content cache (a cursor, a lookup or a commit) but declares nothing is rejected: it
// must say which it is.
struct undeclared_with_cursor {
  static constexpr fork_mode fork = fork_mode::share;
  struct cursor {};
  void reset(const pool_geometry&);
  bool is_cached(block_id) const noexcept;
  void uncache(block_id) noexcept;
};
struct undeclared_with_commit {
  static constexpr fork_mode fork = fork_mode::share;
  void reset(const pool_geometry&);
  bool is_cached(block_id) const noexcept;
  void uncache(block_id) noexcept;
  void commit(block_id, int, std::span<const token_id>) noexcept;
};
static_assert(!sharing_policy<undeclared_with_cursor>);
static_assert(!sharing_policy<undeclared_with_commit>);
static_assert(!detail::declares_whether_it_caches_content<undeclared_with_commit>);
struct caches_content_not_constant {
  static constexpr fork_mode fork = fork_mode::share;
  static bool caches_content;  // not a constant expression: not a declaration
  struct cursor {};
  void reset(const pool_geometry&);
  bool is_cached(block_id) const noexcept;
  void uncache(block_id) noexcept;
};
static_assert(!sharing_policy<caches_content_not_constant>);

// The shipped and archetype policies declare what they are.
static_assert(content_cache<content_cache_archetype> && !content_cache<sharing_policy_archetype>);
static_assert(!content_cache<refcount_sharing> && !content_cache<no_sharing> && !content_cache<kvtest::user_sharing>);
#if __has_include(<xxhash.h>)
static_assert(content_cache<prefix_caching>);
static_assert(prehashed_content_cache<prefix_caching>);
static_assert(stamped_content_cache<prefix_caching>);
#endif

// paged_kv_cache is constrained: a non-conforming policy does not name a valid specialization.
template <class A>
concept cache_accepts_allocator = requires { typename paged_kv_cache<A>; };
static_assert(cache_accepts_allocator<lifo_allocator>);
static_assert(!cache_accepts_allocator<no_erase>);
}  // namespace neg

using user_cache = paged_kv_cache<kvtest::highest_id_allocator, kvtest::user_lru_index, kvtest::user_sharing,
                                  kvtest::user_swap>;

// Runtime part: the user-written policies behave inside the cache (the typed behavioural suites in cache_test run
// them too); here, that their state is really the one the cache uses.
TEST(Concepts, UserPoliciesAreTheOnesTheCacheUses) {
  auto r = user_cache::create({16, 32, 0, 0, kvtest::user_swap::host_blocks}, {.swap = {.reserve = 3}});
  ASSERT_TRUE(r.ok());
  auto& c = *r;
  ASSERT_TRUE(c.add_sequence(1, 40));
  const auto t = *c.block_table(1);
  EXPECT_EQ(std::vector<block_id>(t.begin(), t.end()), (std::vector<block_id>{31, 30, 29}));  // highest id first
  EXPECT_EQ(c.swap().reserve, 3);
  EXPECT_EQ(c.stats().host_total, kvtest::user_swap::host_blocks);
  EXPECT_EQ(c.stats().host_free, kvtest::user_swap::host_blocks);
  EXPECT_EQ(c.eviction().size(), 0);
  EXPECT_EQ(c.stats().evictable, 0);
}

// The swap policy decides from the free host blocks the cache passes it (the cache's own host pool).
TEST(Concepts, UserSwapDecisionSeesTheFreeHostBlocks) {
  auto r = user_cache::create({16, 32, 0, 0, 5}, {.swap = {.reserve = 3}});
  ASSERT_TRUE(r.ok());
  auto& c = *r;
  ASSERT_TRUE(c.add_sequence(1, 16));  // 1 block: 1 + 3 <= 5 free host blocks
  ASSERT_TRUE(c.add_sequence(2, 48));  // 3 blocks: 3 + 3 > 4 once 1 is out
  c.begin_step();
  EXPECT_EQ(*c.preempt(1), preempt_action::swap);
  EXPECT_EQ(c.stats().host_free, 4);
  EXPECT_EQ(*c.preempt(2), preempt_action::recompute);
  EXPECT_FALSE(c.contains(2));
}
