// SPDX-License-Identifier: Apache-2.0
// step_ledger alone: the plan, busy and parked blocks, cancelled and frozen appends, the slot mapping.
#include <kvpager/cache/detail/step_ledger.hpp>

#include <gtest/gtest.h>

#include <vector>

using namespace kvpager;
using namespace kvpager::detail;  // the cache's parts, tested alone

namespace {
step_ledger make(std::int32_t blocks = 16) {
  step_ledger l;
  l.reset(blocks);
  return l;
}
}  // namespace

TEST(StepLedger, RecordAppendReturnsTheStepAndPlansTheRange) {
  auto l = make();
  EXPECT_EQ(l.record_append(0, 7, 3, 5), 0U);
  ASSERT_EQ(l.plan().appends().size(), 1U);
  EXPECT_EQ(l.plan().appends()[0], (token_range{7, 3, 5}));
  EXPECT_EQ(l.plan().num_append_tokens(), 5);
  l.begin_step([](block_id, retention_hint) { FAIL() << "nothing was parked"; });
  EXPECT_EQ(l.step(), 1U);
  EXPECT_TRUE(l.plan().empty());
}

TEST(StepLedger, CopiesKeepBothBlocksBusyForTheStep) {
  auto l = make();
  l.plan_copy(2, 5);
  EXPECT_TRUE(l.busy(2));
  EXPECT_TRUE(l.busy(5));
  EXPECT_FALSE(l.busy(3));
  l.plan_swap_in(block_swap{6, 0});
  EXPECT_TRUE(l.busy(6));
  l.plan_swap_out(block_swap{7, 1});
  EXPECT_FALSE(l.busy(7));  // swap-outs run first: the block may be reused
  EXPECT_EQ(l.plan().copies().size(), 1U);
  l.begin_step([](block_id, retention_hint) {});
  EXPECT_FALSE(l.busy(2));
  EXPECT_FALSE(l.busy(5));
  EXPECT_FALSE(l.busy(6));
}

TEST(StepLedger, ParkedBlocksSettleAtTheNextStepWithTheLatestHint) {
  auto l = make();
  EXPECT_FALSE(l.park(3, retention_hint{1}));  // not busy: the caller settles it now
  l.plan_copy(3, 4);
  EXPECT_TRUE(l.park(3, retention_hint{1}));
  EXPECT_EQ(l.pending_free(), 1);
  l.unpark();  // a prefix hit revived it
  EXPECT_EQ(l.pending_free(), 0);
  EXPECT_TRUE(l.park(3, retention_hint{7}));  // released again: listed once, latest hint
  EXPECT_EQ(l.pending_free(), 1);
  std::vector<std::pair<block_id, std::int32_t>> settled;
  l.begin_step([&](block_id b, retention_hint h) { settled.emplace_back(b, h.priority); });
  ASSERT_EQ(settled.size(), 1U);
  EXPECT_EQ(settled[0], (std::pair<block_id, std::int32_t>{3, 7}));
  EXPECT_EQ(l.pending_free(), 0);
}

TEST(StepLedger, SlotMappingFollowsTheOwnersTable) {
  auto l = make();
  const std::vector<block_id> t0 = {4, 9};
  const std::vector<block_id> t1 = {2};
  l.record_append(0, 10, 0, 6);  // block size 4: blocks 4 (0-3), 9 (4-5)
  l.record_append(1, 11, 1, 2);
  std::vector<std::int64_t> out(8, 99);
  const auto blocks_of = [&](std::int32_t h) { return h == 0 ? t0.data() : t1.data(); };
  ASSERT_TRUE(l.export_slot_mapping(out, 4, blocks_of));
  EXPECT_EQ(out, (std::vector<std::int64_t>{16, 17, 18, 19, 36, 37, 9, 10}));
  std::vector<std::int64_t> small(7, 99);
  const status st = l.export_slot_mapping(small, 4, blocks_of);
  EXPECT_EQ(st.code(), errc::buffer_too_small);
  EXPECT_EQ(st.detail(), 8);
  EXPECT_EQ(small, std::vector<std::int64_t>(7, 99));  // nothing written
}

TEST(StepLedger, CancelledAppendsExportMinusOneAndFrozenSlotsKeepSharedBlocks) {
  auto l = make();
  const std::vector<block_id> t0 = {4, 9};
  l.record_append(0, 10, 0, 6);
  l.record_append(1, 11, 0, 1);
  std::vector<block_id> unshared;
  // Block 4 is shared (a prefix hit in this step), block 9 is not.
  l.cancel_appends(0, t0, 4, [](block_id b) { return b == 4; }, [&](block_id b) { unshared.push_back(b); });
  EXPECT_EQ(unshared, std::vector<block_id>{9});
  EXPECT_TRUE(l.busy(4));
  std::vector<std::int64_t> out(7);
  const std::vector<block_id> t1 = {3};
  ASSERT_TRUE(l.export_slot_mapping(out, 4, [&](std::int32_t) { return t1.data(); }));
  EXPECT_EQ(out, (std::vector<std::int64_t>{16, 17, 18, 19, -1, -1, 12}));
  // Nothing shared: the whole range exports -1.
  l.cancel_appends(1, t1, 4, [](block_id) { return false; }, [](block_id) {});
  ASSERT_TRUE(l.export_slot_mapping(out, 4, [&](std::int32_t) { return t1.data(); }));
  EXPECT_EQ(out[6], -1);
}
