// SPDX-License-Identifier: Apache-2.0
#include <kvpager/kvpager.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <random>
#include <vector>

using kvpager::index_list;

namespace {
std::vector<std::int32_t> contents(const index_list& l) {
  std::vector<std::int32_t> v;
  if (l.empty()) return v;
  for (std::int32_t i = l.front(); i >= 0; i = l.next(i)) v.push_back(i);
  return v;
}
}  // namespace

TEST(IndexList, PushPopBothEnds) {
  index_list l(8);
  EXPECT_TRUE(l.empty());
  l.push_back(3);
  l.push_back(5);
  l.push_front(1);
  EXPECT_EQ(contents(l), (std::vector<std::int32_t>{1, 3, 5}));
  EXPECT_EQ(l.front(), 1);
  EXPECT_EQ(l.back(), 5);
  EXPECT_TRUE(l.contains(3));
  EXPECT_FALSE(l.contains(4));
  EXPECT_FALSE(l.contains(-1));
  EXPECT_FALSE(l.contains(8));
  l.erase(3);
  EXPECT_EQ(contents(l), (std::vector<std::int32_t>{1, 5}));
  EXPECT_EQ(l.pop_back(), 5);
  EXPECT_EQ(l.pop_front(), 1);
  EXPECT_TRUE(l.empty());
}

TEST(IndexList, RandomizedAgainstDeque) {
  constexpr std::int32_t n = 64;
  index_list l(n);
  std::deque<std::int32_t> ref;
  std::mt19937 rng(1);
  for (int op = 0; op < 200000; ++op) {
    const std::int32_t i = static_cast<std::int32_t>(rng() % n);
    const bool in = std::find(ref.begin(), ref.end(), i) != ref.end();
    ASSERT_EQ(l.contains(i), in);
    switch (rng() % 5) {
      case 0:
        if (!in) {
          l.push_back(i);
          ref.push_back(i);
        }
        break;
      case 1:
        if (!in) {
          l.push_front(i);
          ref.push_front(i);
        }
        break;
      case 2:
        if (in) {
          l.erase(i);
          ref.erase(std::find(ref.begin(), ref.end(), i));
        }
        break;
      case 3:
        if (!ref.empty()) {
          ASSERT_EQ(l.pop_front(), ref.front());
          ref.pop_front();
        }
        break;
      default:
        if (!ref.empty()) {
          ASSERT_EQ(l.pop_back(), ref.back());
          ref.pop_back();
        }
    }
    ASSERT_EQ(l.size(), static_cast<std::int32_t>(ref.size()));
  }
  EXPECT_EQ(contents(l), std::vector<std::int32_t>(ref.begin(), ref.end()));
}
