// SPDX-License-Identifier: Apache-2.0
// Order and complexity-relevant behaviour of the shipped allocator policies, each against a reference model.
#include <kvpager/kvpager.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <random>
#include <set>
#include <vector>

using namespace kvpager;

static_assert(allocator_traits<free_list_allocator>::order == free_order::fifo);
static_assert(allocator_traits<lifo_allocator>::order == free_order::lifo);
static_assert(allocator_traits<lowest_id_allocator>::order == free_order::lowest_id);
static_assert(allocator_traits<block_allocator_archetype>::order == free_order::unspecified);

TEST(FreeListAllocator, FifoOrderAndMiddleErase) {
  free_list_allocator a;
  a.reset(10);
  for (block_id b : {4, 2, 7, 1}) a.push(b);
  a.erase(7);
  EXPECT_EQ(a.pop(), 4);
  a.push(9);
  EXPECT_EQ(a.pop(), 2);
  EXPECT_EQ(a.pop(), 1);
  EXPECT_EQ(a.pop(), 9);
  EXPECT_EQ(a.size(), 0);
}

TEST(LifoAllocator, MostRecentlyFreedFirst) {
  lifo_allocator a;
  a.reset(10);
  for (block_id b : {4, 2, 7, 1}) a.push(b);
  EXPECT_EQ(a.pop(), 1);
  a.erase(2);
  a.push(3);
  EXPECT_EQ(a.pop(), 3);
  EXPECT_EQ(a.pop(), 7);
  EXPECT_EQ(a.pop(), 4);
}

TEST(LowestIdAllocator, LowestFirstAcrossLevels) {
  lowest_id_allocator a;
  a.reset(300000);  // three bitmap levels
  for (block_id b : {299999, 70000, 4097, 64, 63}) a.push(b);
  EXPECT_EQ(a.size(), 5);
  EXPECT_TRUE(a.contains(4097));
  EXPECT_FALSE(a.contains(4096));
  EXPECT_EQ(a.pop(), 63);
  a.erase(64);
  EXPECT_EQ(a.pop(), 4097);
  a.push(5);
  EXPECT_EQ(a.pop(), 5);
  EXPECT_EQ(a.pop(), 70000);
  EXPECT_EQ(a.pop(), 299999);
  EXPECT_EQ(a.size(), 0);
}

namespace {
// Drives an allocator with random push/pop/erase and checks it against `expected_pop`, a model of its order.
template <class A, class Model>
void randomized(std::int32_t n, Model model, std::uint32_t seed) {
  A a;
  a.reset(n);
  std::vector<block_id> free;  // reference set, in push order
  std::mt19937 rng(seed);
  for (int op = 0; op < 100000; ++op) {
    const auto b = static_cast<block_id>(rng() % static_cast<std::uint32_t>(n));
    const bool in = std::find(free.begin(), free.end(), b) != free.end();
    ASSERT_EQ(a.contains(b), in);
    const auto r = rng() % 3;
    if (r == 0 && !in) {
      a.push(b);
      free.push_back(b);
    } else if (r == 1 && in) {
      a.erase(b);
      free.erase(std::find(free.begin(), free.end(), b));
    } else if (r == 2 && !free.empty()) {
      const block_id want = model(free);
      ASSERT_EQ(a.pop(), want);
      free.erase(std::find(free.begin(), free.end(), want));
    }
    ASSERT_EQ(a.size(), static_cast<std::int32_t>(free.size()));
  }
}
}  // namespace

TEST(Allocators, RandomizedAgainstOrderModels) {
  randomized<free_list_allocator>(97, [](const std::vector<block_id>& f) { return f.front(); }, 1);
  randomized<lifo_allocator>(97, [](const std::vector<block_id>& f) { return f.back(); }, 2);
  randomized<lowest_id_allocator>(
      5000, [](const std::vector<block_id>& f) { return *std::min_element(f.begin(), f.end()); }, 3);
  randomized<lowest_id_allocator>(
      70, [](const std::vector<block_id>& f) { return *std::min_element(f.begin(), f.end()); }, 4);
}
