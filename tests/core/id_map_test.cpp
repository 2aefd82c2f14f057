// SPDX-License-Identifier: Apache-2.0
#include <kvpager/kvpager.hpp>

#include <gtest/gtest.h>

#include <random>
#include <unordered_map>

using kvpager::id_map;

TEST(IdMap, InsertFindErase) {
  id_map m;
  EXPECT_EQ(m.find(1), -1);
  m.insert(1, 10);
  m.insert(~std::uint64_t{0}, 11);
  m.insert(0, 12);
  EXPECT_EQ(m.find(1), 10);
  EXPECT_EQ(m.find(~std::uint64_t{0}), 11);
  EXPECT_EQ(m.find(0), 12);
  EXPECT_EQ(m.size(), 3);
  EXPECT_TRUE(m.erase(1));
  EXPECT_FALSE(m.erase(1));
  EXPECT_EQ(m.find(1), -1);
  EXPECT_EQ(m.find(0), 12);
}

TEST(IdMap, RandomizedAgainstUnorderedMap) {
  id_map m;
  std::unordered_map<std::uint64_t, std::int32_t> ref;
  std::mt19937_64 rng(7);
  for (int op = 0; op < 300000; ++op) {
    // Small key space so probe runs collide and erases shift entries; sometimes huge keys.
    const std::uint64_t key = (rng() % 4 == 0) ? rng() : rng() % 512;
    const auto it = ref.find(key);
    if (rng() % 2 == 0) {
      if (it == ref.end()) {
        const auto v = static_cast<std::int32_t>(rng() % 1000000);
        m.insert(key, v);
        ref.emplace(key, v);
      }
    } else {
      ASSERT_EQ(m.erase(key), it != ref.end());
      if (it != ref.end()) ref.erase(it);
    }
    ASSERT_EQ(m.size(), static_cast<std::int32_t>(ref.size()));
    if (op % 1000 == 0) {
      for (const auto& [k, v] : ref) ASSERT_EQ(m.find(k), v);
    }
  }
  for (const auto& [k, v] : ref) {
    EXPECT_EQ(m.find(k), v);
  }
}
