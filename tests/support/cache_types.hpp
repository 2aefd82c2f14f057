// SPDX-License-Identifier: Apache-2.0
#pragma once
// The compositions every behavioural test runs against: shipped policies and user-written ones.

#include <kvpager/kvpager.hpp>

#include <gtest/gtest.h>

#include <utility>

#include "support/cache_snapshot.hpp"
#include "support/custom_policies.hpp"

namespace kvtest {

using default_cache = kvpager::paged_kv_cache<>;
using lifo_cache = kvpager::paged_kv_cache<kvpager::lifo_allocator>;
using lowest_id_cache = kvpager::paged_kv_cache<kvpager::lowest_id_allocator>;
using copy_fork_cache = kvpager::paged_kv_cache<kvpager::free_list_allocator, kvpager::no_eviction, kvpager::no_sharing>;
using user_cache = kvpager::paged_kv_cache<highest_id_allocator, user_lru_index, user_sharing, user_swap>;

using all_caches = ::testing::Types<default_cache, lifo_cache, lowest_id_cache, copy_fork_cache, user_cache>;

template <class Cache>
Cache make_cache(std::int32_t num_blocks, std::int32_t block_size = 16, std::int32_t reserved = 0,
                 std::int32_t max_blocks_per_seq = 0) {
  auto r = Cache::create(kvpager::cache_config{block_size, num_blocks, reserved, max_blocks_per_seq});
  EXPECT_TRUE(r.ok()) << r.error().message();
  return std::move(*r);
}

template <class Cache>
inline constexpr bool shares_on_fork = Cache::sharing_policy_type::fork == kvpager::fork_mode::share;

}  // namespace kvtest

/// Runs `call` (returning kvpager::status) and checks it failed with `expected` and changed nothing observable
/// about `cache` (probing the sequence ids in `ids`).
#define KVTEST_EXPECT_FAILS_UNCHANGED(cache, ids, call, expected)                       \
  do {                                                                                  \
    const auto kvtest_before = ::kvtest::take_snapshot((cache), (ids));                 \
    const ::kvpager::status kvtest_st = (call);                                         \
    EXPECT_EQ(kvtest_st.code(), (expected)) << kvtest_st.message();                     \
    EXPECT_STRNE(kvtest_st.message(), "ok");                                            \
    EXPECT_TRUE(::kvtest::take_snapshot((cache), (ids)) == kvtest_before)               \
        << "a failed call changed the cache: " << #call;                                \
  } while (0)
