// SPDX-License-Identifier: Apache-2.0
#include <kvpager/kvpager.hpp>

#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "support/custom_policies.hpp"

using namespace kvpager;

template <class A>
class BlockPoolTest : public ::testing::Test {};
using allocators =
    ::testing::Types<free_list_allocator, lifo_allocator, lowest_id_allocator, kvtest::highest_id_allocator>;
TYPED_TEST_SUITE(BlockPoolTest, allocators);

namespace {
template <class A>
block_pool<A> make_pool(std::int32_t n, std::int32_t reserved = 0) {
  auto r = block_pool<A>::create({n, reserved});
  EXPECT_TRUE(r.ok());
  return std::move(*r);
}
template <class A>
std::vector<block_id> drain_order(const block_pool<A>& p) {
  auto copy = p;
  std::vector<block_id> v(static_cast<std::size_t>(copy.num_free()));
  EXPECT_TRUE(copy.allocate(v));
  return v;
}
}  // namespace

TYPED_TEST(BlockPoolTest, CreateValidates) {
  EXPECT_EQ(block_pool<TypeParam>::create({0, 0}).code(), errc::invalid_pool_size);
  EXPECT_EQ(block_pool<TypeParam>::create({-1, 0}).code(), errc::invalid_pool_size);
  EXPECT_EQ(block_pool<TypeParam>::create({3, 3}).code(), errc::invalid_pool_size);
  EXPECT_EQ(block_pool<TypeParam>::create({3, -1}).code(), errc::invalid_pool_size);
  auto p = make_pool<TypeParam>(10, 1);
  EXPECT_EQ(p.num_blocks(), 10);
  EXPECT_EQ(p.usable_blocks(), 9);
  EXPECT_EQ(p.stats(), (pool_stats{9, 9, 0, 0, 0, 0}));
}

TYPED_TEST(BlockPoolTest, BatchAllocationIsAllOrNothing) {
  auto p = make_pool<TypeParam>(10, 1);
  std::vector<block_id> a(6);
  ASSERT_TRUE(p.allocate(a));
  EXPECT_EQ(std::set<block_id>(a.begin(), a.end()).size(), 6U);
  for (block_id b : a) {
    EXPECT_GE(b, 1) << "reserved block handed out";
    EXPECT_EQ(p.refcount(b), 1);
    EXPECT_FALSE(p.is_free(b));
  }
  const auto order_before = drain_order(p);
  const pool_stats before = p.stats();
  std::vector<block_id> b(4, -5);
  const status st = p.allocate(b);
  EXPECT_EQ(st.code(), errc::out_of_blocks);
  EXPECT_EQ(st.detail(), 4);
  EXPECT_EQ(b, std::vector<block_id>(4, -5)) << "output touched on failure";
  EXPECT_EQ(p.stats(), before);
  EXPECT_EQ(drain_order(p), order_before);
  b.resize(3);
  EXPECT_TRUE(p.allocate(b));
  EXPECT_EQ(p.num_free(), 0);
  EXPECT_EQ(p.allocate().code(), errc::out_of_blocks);
}

TYPED_TEST(BlockPoolTest, RefcountsAndStats) {
  auto p = make_pool<TypeParam>(8);
  const block_id a = *p.allocate();
  const block_id b = *p.allocate();
  ASSERT_TRUE(p.retain(a));
  ASSERT_TRUE(p.retain(a));
  EXPECT_EQ(p.refcount(a), 3);
  EXPECT_EQ(p.stats(), (pool_stats{8, 6, 2, 0, 1, 4}));
  ASSERT_TRUE(p.release(a));
  ASSERT_TRUE(p.release(a));
  EXPECT_EQ(p.stats().shared, 0);
  ASSERT_TRUE(p.release(a));
  EXPECT_TRUE(p.is_free(a));
  EXPECT_EQ(p.stats(), (pool_stats{8, 7, 1, 0, 0, 1}));
  ASSERT_TRUE(p.release(b));
  EXPECT_EQ(p.stats(), (pool_stats{8, 8, 0, 0, 0, 0}));
}

TYPED_TEST(BlockPoolTest, BadInputChangesNothing) {
  auto p = make_pool<TypeParam>(8, 1);
  const block_id a = *p.allocate();
  const pool_stats before = p.stats();
  const auto order = drain_order(p);
  auto check = [&](status st, errc code) {
    EXPECT_EQ(st.code(), code) << st.message();
    EXPECT_EQ(p.stats(), before);
    EXPECT_EQ(drain_order(p), order);
  };
  const block_id some_free = order.front();
  check(p.release(some_free), errc::double_free);
  check(p.retain(some_free), errc::invalid_block);
  check(p.release(0), errc::invalid_block);  // reserved
  check(p.release(8), errc::invalid_block);
  check(p.release(-1), errc::invalid_block);
  check(p.retain(100), errc::invalid_block);
  ASSERT_TRUE(p.release(a));
  const pool_stats after = p.stats();
  const status st = p.release(a);
  EXPECT_EQ(st.code(), errc::double_free);
  EXPECT_EQ(p.stats(), after);
}

TYPED_TEST(BlockPoolTest, ParkAdoptRecycle) {
  auto p = make_pool<TypeParam>(4);
  const block_id a = *p.allocate();
  EXPECT_EQ(p.drop_ref(a), 0);
  EXPECT_EQ(p.stats().parked, 1);
  EXPECT_FALSE(p.is_free(a));
  p.adopt(a);
  EXPECT_EQ(p.refcount(a), 1);
  EXPECT_EQ(p.drop_ref(a), 0);
  p.recycle(a);
  EXPECT_TRUE(p.is_free(a));
  p.take(a);
  EXPECT_EQ(p.refcount(a), 1);
  EXPECT_EQ(p.stats(), (pool_stats{4, 3, 1, 0, 0, 1}));
}
