// SPDX-License-Identifier: Apache-2.0
// Kernel-facing exports: dense block table + seq_lens, CSR, slot mapping. Written into caller buffers; a failed
// export writes nothing.
#include <kvpager/kvpager.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <span>
#include <string>
#include <vector>

#include "support/cache_types.hpp"

using namespace kvpager;
using kvtest::make_cache;

template <class Cache>
class ExportTest : public ::testing::Test {};
TYPED_TEST_SUITE(ExportTest, kvtest::all_caches);

namespace {
constexpr std::int32_t poison = 777;
}

TYPED_TEST(ExportTest, DenseBlockTable) {
  auto c = make_cache<TypeParam>(64, 16);
  ASSERT_TRUE(c.add_sequence(10, 33));  // 3 blocks
  ASSERT_TRUE(c.add_sequence(20, 16));  // 1 block
  const std::vector<seq_id> ids = {20, 10};
  std::vector<std::int32_t> table(2 * 4, poison), lens(2, poison);
  ASSERT_TRUE(c.export_block_table(ids, table, 4, lens));
  const auto t10 = *c.block_table(10);
  const auto t20 = *c.block_table(20);
  EXPECT_EQ(lens, (std::vector<std::int32_t>{16, 33}));
  EXPECT_EQ(table, (std::vector<std::int32_t>{t20[0], -1, -1, -1, t10[0], t10[1], t10[2], -1}));
}

TYPED_TEST(ExportTest, BlockTablesIsTheOneTable) {
  auto c = make_cache<TypeParam>(64, 16);
  ASSERT_TRUE(c.add_sequence(10, 33));
  std::vector<std::span<const block_id>> all;
  ASSERT_TRUE(c.block_tables(10, all));
  ASSERT_EQ(all.size(), 1U);
  EXPECT_TRUE(std::ranges::equal(all[0], *c.block_table(10)));
  EXPECT_EQ(all[0].size(), 3U);
  const status st = c.block_tables(11, all);
  EXPECT_EQ(st.code(), errc::unknown_sequence);
  EXPECT_NE(std::string(st.message()).find("block_tables"), std::string::npos) << st.message();
  ASSERT_EQ(all.size(), 1U) << "a refused call leaves the output as it was";
  EXPECT_EQ(all[0].size(), 3U);
}

TYPED_TEST(ExportTest, DenseBlockTableErrorsWriteNothing) {
  auto c = make_cache<TypeParam>(64, 16);
  ASSERT_TRUE(c.add_sequence(10, 33));
  std::vector<seq_id> ids = {10};
  std::vector<std::int32_t> table(8, poison), lens(1, poison);
  const std::vector<std::int32_t> table0 = table, lens0 = lens;
  auto expect = [&](status st, errc code) {
    EXPECT_EQ(st.code(), code) << st.message();
    EXPECT_EQ(table, table0);
    EXPECT_EQ(lens, lens0);
  };
  expect(c.export_block_table(ids, table, 0, lens), errc::invalid_argument);
  expect(c.export_block_table(ids, table, 2, lens), errc::buffer_too_small);  // 3 blocks > stride 2
  expect(c.export_block_table(ids, std::span(table).first(2), 4, lens), errc::buffer_too_small);
  expect(c.export_block_table(ids, table, 4, std::span(lens).first(0)), errc::buffer_too_small);
  ids = {10, 11};
  std::vector<std::int32_t> lens2(2, poison);
  const status st = c.export_block_table(ids, table, 4, lens2);
  EXPECT_EQ(st.code(), errc::unknown_sequence);
  EXPECT_EQ(table, table0);
  EXPECT_EQ(lens2, std::vector<std::int32_t>(2, poison));
}

TYPED_TEST(ExportTest, Csr) {
  auto c = make_cache<TypeParam>(64, 16);
  ASSERT_TRUE(c.add_sequence(1, 33));  // 3 blocks, last page 1
  ASSERT_TRUE(c.add_sequence(2, 32));  // 2 blocks, last page 16
  ASSERT_TRUE(c.add_sequence(3, 5));   // 1 block, last page 5
  const std::vector<seq_id> ids = {1, 2, 3};
  auto n = c.csr_size(ids);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 6);
  std::vector<std::int32_t> indptr(4, poison), indices(6, poison), last(3, poison);
  ASSERT_TRUE(c.export_csr(ids, indptr, indices, last));
  EXPECT_EQ(indptr, (std::vector<std::int32_t>{0, 3, 5, 6}));
  EXPECT_EQ(last, (std::vector<std::int32_t>{1, 16, 5}));
  std::vector<std::int32_t> expected;
  for (seq_id id : ids) {
    const std::span<const block_id> t = *c.block_table(id);
    expected.insert(expected.end(), t.begin(), t.end());
  }
  EXPECT_EQ(indices, expected);

  std::vector<std::int32_t> small(5, poison);
  const status st = c.export_csr(ids, indptr, small, last);
  EXPECT_EQ(st.code(), errc::buffer_too_small);
  EXPECT_EQ(st.detail(), 6);
  EXPECT_EQ(small, std::vector<std::int32_t>(5, poison));
  std::vector<std::int32_t> short_indptr(3, poison);
  EXPECT_EQ(c.export_csr(ids, short_indptr, indices, last).code(), errc::buffer_too_small);
  EXPECT_EQ(short_indptr, std::vector<std::int32_t>(3, poison));
  const std::vector<seq_id> bad = {1, 9};
  EXPECT_EQ(c.export_csr(bad, indptr, indices, last).code(), errc::unknown_sequence);
  EXPECT_EQ(c.csr_size(bad).code(), errc::unknown_sequence);
}

TYPED_TEST(ExportTest, SlotMappingFollowsTheBlockTables) {
  auto c = make_cache<TypeParam>(64, 8);
  ASSERT_TRUE(c.add_sequence(1, 10));  // blocks a, b
  ASSERT_TRUE(c.append_tokens(1, token_count{7}));  // positions 10..16: b, c
  ASSERT_TRUE(c.add_sequence(2, 3));
  ASSERT_EQ(c.slot_mapping_size(), 20);
  std::vector<std::int64_t> slots(20, -7);
  ASSERT_TRUE(c.export_slot_mapping(slots));
  const auto t1 = *c.block_table(1);
  const auto t2 = *c.block_table(2);
  std::vector<std::int64_t> expected;
  for (std::int64_t p = 0; p < 17; ++p) expected.push_back(std::int64_t{t1[static_cast<std::size_t>(p / 8)]} * 8 + p % 8);
  for (std::int64_t p = 0; p < 3; ++p) expected.push_back(std::int64_t{t2[0]} * 8 + p);
  EXPECT_EQ(slots, expected);

  std::vector<std::int64_t> small(19, -7);
  const status st = c.export_slot_mapping(small);
  EXPECT_EQ(st.code(), errc::buffer_too_small);
  EXPECT_EQ(st.detail(), 20);
  EXPECT_EQ(small, std::vector<std::int64_t>(19, -7));

  // A sequence freed after appending keeps its place in the mapping, as skipped (-1) slots.
  ASSERT_TRUE(c.free_sequence(1));
  ASSERT_TRUE(c.export_slot_mapping(slots));
  for (std::size_t i = 0; i < 17; ++i) EXPECT_EQ(slots[i], -1);
  for (std::size_t i = 17; i < 20; ++i) EXPECT_EQ(slots[i], expected[i]);
  for (const block_id b : t1) EXPECT_TRUE(c.is_free(b)) << "its blocks are free at once";

  c.begin_step();
  EXPECT_EQ(c.slot_mapping_size(), 0);
  EXPECT_TRUE(c.plan().empty());
}

TYPED_TEST(ExportTest, SlotsAreComputedIn64Bits) {
  // 2^20 blocks of 4096 tokens, only the top 600 usable: every slot is past 2^31.
  auto c = make_cache<TypeParam>(1 << 20, 4096, (1 << 20) - 600);
  ASSERT_TRUE(c.add_sequence(1, 4096 * 600));
  std::vector<std::int64_t> slots(static_cast<std::size_t>(c.slot_mapping_size()));
  ASSERT_TRUE(c.export_slot_mapping(slots));
  const auto t = *c.block_table(1);
  EXPECT_EQ(slots.back(), std::int64_t{t.back()} * 4096 + 4095);
  EXPECT_GT(*std::min_element(slots.begin(), slots.end()), std::int64_t{INT32_MAX});
  for (std::size_t p = 0; p < slots.size(); p += 4099)
    ASSERT_EQ(slots[p], std::int64_t{t[p / 4096]} * 4096 + static_cast<std::int64_t>(p % 4096));
}
