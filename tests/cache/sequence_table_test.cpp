// SPDX-License-Identifier: Apache-2.0
// sequence_table alone: handles, the one checked lookup (naming the calling operation), group checks.
#include <kvpager/cache/detail/sequence_table.hpp>

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

using namespace kvpager;
using namespace kvpager::detail;  // the cache's parts, tested alone

namespace {
struct cursor {
  int pos = 0;
};
using table = sequence_table<cursor>;
}  // namespace

TEST(SequenceTable, InsertGivesAFreshStateFoundById) {
  table t;
  const std::int32_t h = t.insert(42);
  EXPECT_EQ(t.size(), 1);
  EXPECT_TRUE(t.contains(42));
  EXPECT_EQ(t.find(42), h);
  EXPECT_EQ(t.find(7), -1);
  EXPECT_EQ(t[h].id, 42U);
  EXPECT_EQ(t[h].num_tokens, 0);
  EXPECT_EQ(t[h].append_step, no_step);
  EXPECT_FALSE(t[h].swapped);
  EXPECT_EQ(&t.at(42), &t[h]);
}

TEST(SequenceTable, EraseClearsTheStateAndReusesTheHandleWithItsCapacity) {
  table t;
  const std::int32_t h = t.insert(1);
  t[h].blocks.assign(100, 3);
  t[h].partial = {1, 2};
  t[h].num_tokens = 1600;
  t[h].priority = 5;
  t[h].extra_key = 9;
  t[h].append_step = 4;
  t[h].swapped = true;
  t[h].cursor.pos = 8;
  const auto* data = t[h].blocks.data();
  t.erase(h);
  EXPECT_FALSE(t.contains(1));
  EXPECT_EQ(t.size(), 0);
  const std::int32_t h2 = t.insert(2);
  EXPECT_EQ(h2, h);
  const auto& s = t[h2];
  EXPECT_EQ(s.id, 2U);
  EXPECT_TRUE(s.blocks.empty());
  EXPECT_GE(s.blocks.capacity(), 100U);
  EXPECT_EQ(s.blocks.data(), data);
  EXPECT_TRUE(s.partial.empty());
  EXPECT_EQ(s.num_tokens, 0);
  EXPECT_EQ(s.priority, 0);
  EXPECT_EQ(s.extra_key, 0U);
  EXPECT_EQ(s.append_step, no_step);
  EXPECT_FALSE(s.swapped);
  EXPECT_EQ(s.cursor.pos, 0);
}

TEST(SequenceTable, HandlesStayStableWhileOthersComeAndGo) {
  table t;
  std::vector<std::int32_t> handles;
  for (seq_id id = 0; id < 1000; ++id) handles.push_back(t.insert(id * 7919));
  for (seq_id id = 0; id < 1000; id += 2) t.erase(handles[id]);
  for (seq_id id = 1; id < 1000; id += 2) EXPECT_EQ(t.find(id * 7919), handles[id]);
  EXPECT_EQ(t.size(), 500);
}

TEST(SequenceTable, CheckedLookupNamesTheCallingOperation) {
  table t;
  const auto r = t.checked<"append_tokens">(5);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.code(), errc::unknown_sequence);
  EXPECT_STREQ(r.error().message(), "append_tokens: unknown sequence id");
  const auto f = t.checked<"free_sequence">(5, residency::any);
  EXPECT_STREQ(f.error().message(), "free_sequence: unknown sequence id");
}

TEST(SequenceTable, CheckedLookupChecksResidency) {
  table t;
  const std::int32_t h = t.insert(5);
  EXPECT_EQ(*t.checked<"x">(5), h);
  EXPECT_EQ(*t.checked<"x">(5, residency::any), h);
  const auto not_out = t.checked<"host_block_table">(5, residency::swapped);
  EXPECT_EQ(not_out.code(), errc::sequence_swapped);
  EXPECT_STREQ(not_out.error().message(), "host_block_table: the sequence is not swapped out");
  t[h].swapped = true;
  const auto out = t.checked<"block_table">(5);
  EXPECT_EQ(out.code(), errc::sequence_swapped);
  EXPECT_EQ(std::strncmp(out.error().message(), "block_table: ", 13), 0);
  EXPECT_EQ(*t.checked<"x">(5, residency::swapped), h);
  EXPECT_EQ(*t.checked<"x">(5, residency::any), h);
}

TEST(SequenceTable, CheckedGroupRejectsUnknownDuplicateMisplacedAndPendingIds) {
  table t;
  const std::int32_t a = t.insert(1);
  t.insert(2);
  const std::vector<seq_id> ok = {1, 2};
  EXPECT_TRUE(t.checked_group<"swap_out">(ok, residency::device, 3));
  const std::vector<seq_id> unknown = {1, 9};
  EXPECT_EQ(t.checked_group<"swap_out">(unknown, residency::device, 3).code(), errc::unknown_sequence);
  const std::vector<seq_id> twice = {1, 2, 1};
  const status d = t.checked_group<"swap_out">(twice, residency::device, 3);
  EXPECT_EQ(d.code(), errc::invalid_argument);
  EXPECT_STREQ(d.message(), "swap_out: a sequence id is listed twice");
  EXPECT_EQ(t.checked_group<"swap_in">(ok, residency::swapped, 3).code(), errc::sequence_swapped);
  t[a].append_step = 3;
  EXPECT_EQ(t.checked_group<"swap_out">(ok, residency::device, 3).code(), errc::pending_append);
  EXPECT_TRUE(t.checked_group<"swap_out">(ok, residency::device, 4));  // an earlier step's bytes are in place
}
