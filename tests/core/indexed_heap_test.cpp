// SPDX-License-Identifier: Apache-2.0
// indexed_heap: a min-heap over the integers [0, capacity) keyed by (primary, secondary), with erase of any
// element; the ordered index behind lfu_eviction, priority_lru and fifo_eviction.
#include <kvpager/kvpager.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <set>
#include <tuple>
#include <vector>

using kvpager::indexed_heap;

namespace {
using key = indexed_heap::key;
std::vector<std::int32_t> drain(indexed_heap& h) {
  std::vector<std::int32_t> v;
  while (h.size() > 0) v.push_back(h.pop());
  return v;
}
}  // namespace

TEST(IndexedHeap, KeysCompareByPrimaryThenSecondary) {
  EXPECT_TRUE((key{1, 9} < key{2, 0}));
  EXPECT_TRUE((key{2, 0} < key{2, 1}));
  EXPECT_FALSE((key{2, 1} < key{2, 1}));
  EXPECT_FALSE((key{3, 0} < key{2, 5}));
}

TEST(IndexedHeap, PopsSmallestKeyFirst) {
  indexed_heap h;
  h.reset(8);
  EXPECT_EQ(h.size(), 0);
  h.push(5, {3, 0});
  h.push(2, {1, 7});
  h.push(7, {1, 2});
  h.push(0, {9, 0});
  h.push(4, {3, 1});
  EXPECT_EQ(h.size(), 5);
  EXPECT_EQ(h.top(), 7);  // primary 1, secondary 2
  EXPECT_EQ(drain(h), (std::vector<std::int32_t>{7, 2, 5, 4, 0}));
  EXPECT_EQ(h.size(), 0);
}

TEST(IndexedHeap, ContainsTracksMembershipAndRejectsOutOfRangeIds) {
  indexed_heap h;
  h.reset(4);
  h.push(1, {0, 0});
  EXPECT_TRUE(h.contains(1));
  EXPECT_FALSE(h.contains(0));
  EXPECT_FALSE(h.contains(-1));
  EXPECT_FALSE(h.contains(4));
  EXPECT_FALSE(h.contains(1 << 30));
  EXPECT_EQ(h.pop(), 1);
  EXPECT_FALSE(h.contains(1));
}

TEST(IndexedHeap, EraseFromTheMiddleKeepsTheOrder) {
  indexed_heap h;
  h.reset(16);
  for (std::int32_t i = 0; i < 16; ++i) h.push(i, {static_cast<std::uint64_t>(15 - i), 0});  // 15 is the top
  h.erase(15);  // the top
  h.erase(0);   // the largest key (a leaf)
  h.erase(8);   // an interior element
  EXPECT_EQ(h.size(), 13);
  EXPECT_FALSE(h.contains(8));
  EXPECT_EQ(drain(h), (std::vector<std::int32_t>{14, 13, 12, 11, 10, 9, 7, 6, 5, 4, 3, 2, 1}));
}

TEST(IndexedHeap, AnErasedElementCanBePushedAgainWithANewKey) {
  indexed_heap h;
  h.reset(3);
  h.push(0, {1, 0});
  h.push(1, {2, 0});
  h.erase(0);
  h.push(0, {5, 0});  // re-inserted with a larger key: now last
  EXPECT_EQ(drain(h), (std::vector<std::int32_t>{1, 0}));
}

TEST(IndexedHeap, ResetEmptiesTheHeapAndSetsTheCapacity) {
  indexed_heap h;
  h.reset(2);
  h.push(0, {0, 0});
  h.push(1, {0, 1});
  h.reset(5);
  EXPECT_EQ(h.size(), 0);
  EXPECT_FALSE(h.contains(0));
  h.push(4, {0, 0});  // an id the old capacity did not have
  EXPECT_EQ(h.top(), 4);
}

// Random pushes, erases and pops against an ordered set of (key, id): the heap pops exactly the set's minimum.
TEST(IndexedHeap, RandomOperationsMatchAnOrderedSet) {
  constexpr std::int32_t n = 257;
  std::mt19937 rng(12345);
  indexed_heap h;
  h.reset(n);
  std::set<std::tuple<std::uint64_t, std::uint64_t, std::int32_t>> ref;
  std::vector<key> keys(n);
  std::uniform_int_distribution<std::int32_t> pick(0, n - 1);
  std::uniform_int_distribution<std::uint64_t> small(0, 7);  // many equal primaries: secondaries decide
  std::uint64_t clock = 0;
  for (int step = 0; step < 50'000; ++step) {
    const std::int32_t i = pick(rng);
    const int op = static_cast<int>(rng() % 3);
    if (op == 0 && !h.contains(i)) {
      const key k{small(rng), ++clock};
      keys[static_cast<std::size_t>(i)] = k;
      h.push(i, k);
      ref.emplace(k.primary, k.secondary, i);
    } else if (op == 1 && h.contains(i)) {
      const key k = keys[static_cast<std::size_t>(i)];
      h.erase(i);
      ref.erase({k.primary, k.secondary, i});
    } else if (op == 2 && h.size() > 0) {
      const auto expected = std::get<2>(*ref.begin());
      ASSERT_EQ(h.top(), expected);
      ASSERT_EQ(h.pop(), expected);
      ref.erase(ref.begin());
    }
    ASSERT_EQ(h.size(), static_cast<std::int32_t>(ref.size()));
    ASSERT_EQ(h.contains(i), ref.contains({keys[static_cast<std::size_t>(i)].primary,
                                           keys[static_cast<std::size_t>(i)].secondary, i}));
  }
}
