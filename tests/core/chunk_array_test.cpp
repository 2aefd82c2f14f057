// SPDX-License-Identifier: Apache-2.0
#include <kvpager/core/chunk_array.hpp>

#include <gtest/gtest.h>

#include <cstdint>

using kvpager::detail::chunk_array;

TEST(ChunkArray, GrowsUpToItsLimitAndElementsNeverMove) {
  chunk_array<std::int32_t> a;
  a.reset(4, 3);
  EXPECT_EQ(a.num_chunks(), 0U);
  ASSERT_TRUE(a.grow());
  std::int32_t* first = a.chunk(0);
  for (int i = 0; i < 4; ++i) first[i] = i;
  ASSERT_TRUE(a.grow());
  ASSERT_TRUE(a.grow());
  EXPECT_FALSE(a.grow()) << "three chunks at most";
  EXPECT_EQ(a.num_chunks(), 3U);
  EXPECT_EQ(a.chunk(0), first) << "growing never moves a chunk";
  EXPECT_EQ(first[3], 3);
  EXPECT_GE(a.bytes(), 3 * 4 * sizeof(std::int32_t));
}

TEST(ChunkArray, CopiesAreDeepAndResetFreesEverything) {
  chunk_array<std::int32_t> a;
  a.reset(2, 2);
  ASSERT_TRUE(a.grow());
  a.chunk(0)[0] = 7;
  a.chunk(0)[1] = 8;
  chunk_array<std::int32_t> b = a;
  ASSERT_EQ(b.num_chunks(), 1U);
  EXPECT_NE(b.chunk(0), a.chunk(0));
  b.chunk(0)[0] = 1;
  EXPECT_EQ(a.chunk(0)[0], 7);
  EXPECT_EQ(b.chunk(0)[1], 8);
  ASSERT_TRUE(b.grow());
  EXPECT_FALSE(b.grow()) << "the copy keeps the limit";
  a.reset(2, 1);
  EXPECT_EQ(a.num_chunks(), 0U);
  ASSERT_TRUE(a.grow());
  EXPECT_FALSE(a.grow());
}
