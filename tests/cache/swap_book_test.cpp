// SPDX-License-Identifier: Apache-2.0
// swap_book alone (over a sequence_table, a block_store and a step_ledger): host references, one host block per
// distinct device block of a group, host blocks returned one step late, all or nothing.
#include <kvpager/allocator/free_list_allocator.hpp>
#include <kvpager/cache/detail/block_store.hpp>
#include <kvpager/cache/detail/sequence_table.hpp>
#include <kvpager/cache/detail/step_ledger.hpp>
#include <kvpager/cache/detail/swap_book.hpp>
#include <kvpager/eviction/no_eviction.hpp>
#include <kvpager/sharing/refcount_sharing.hpp>
#include <kvpager/swap/host_swap.hpp>
#include <kvpager/swap/hybrid_swap.hpp>

#include <gtest/gtest.h>

#include <set>
#include <vector>

using namespace kvpager;
using namespace kvpager::detail;  // the cache's parts, tested alone

namespace {
struct no_cur {};
using store_type = block_store<free_list_allocator, no_eviction, refcount_sharing>;

struct rig {
  explicit rig(std::int32_t device_blocks, std::int32_t host_blocks)
      : store(std::move(*block_pool<free_list_allocator>::create({device_blocks, 0})), {}, {}),
        book(host_swap{}) {
    const pool_geometry g{device_blocks, 16, 0};
    store.reset(g);
    book.reset(g, host_blocks);
    ledger.reset(device_blocks);
  }
  /// Adds sequence `id` with `n` fresh device blocks.
  void add(seq_id id, std::int32_t n) {
    auto& s = table[table.insert(id)];
    s.blocks.resize(static_cast<std::size_t>(n));
    store.take(s.blocks);
    s.num_tokens = n * 16;
  }
  status out(std::vector<seq_id> group) {
    return book.swap_out(group, table, ledger, [&](block_id b, retention_hint h) {
      store.release(b, h, [&](block_id x, retention_hint xh) { return ledger.park(x, xh); });
    });
  }
  status in(std::vector<seq_id> group) { return book.swap_in(group, table, store, ledger); }
  void next_step() {
    ledger.begin_step([&](block_id b, retention_hint h) {
      if (store.refcount(b) == 0) store.settle(b, h);
    });
    book.begin_step();
  }

  sequence_table<no_cur> table;
  store_type store;
  swap_book<host_swap> book;
  step_ledger ledger;
};
}  // namespace

TEST(SwapBook, SwapOutGivesEachDistinctDeviceBlockOneHostBlock) {
  rig r(16, 16);
  r.add(1, 3);
  auto& s2 = r.table[r.table.insert(2)];  // shares the first two blocks of 1
  const auto t1 = r.table.at(1).blocks;
  s2.blocks = {t1[0], t1[1]};
  r.store.add_ref(t1[0]);
  r.store.add_ref(t1[1]);
  ASSERT_TRUE(r.out({1, 2}));
  EXPECT_EQ(r.ledger.plan().swap_outs().size(), 3U);
  EXPECT_EQ(r.book.host_free(), 13);
  EXPECT_EQ(r.book.swapped(), 2);
  cache_stats st;
  r.book.report(st);
  EXPECT_EQ(st.swapped_out_blocks, 3);
  EXPECT_EQ(st.swap_outs, 2);        // two sequences swapped out: two events
  EXPECT_EQ(st.swapped_logical, 5);  // their host tables hold 3 + 2 entries
  EXPECT_EQ(st.host_total, 16);
  const auto& h1 = r.table.at(1).blocks;
  const auto& h2 = r.table.at(2).blocks;
  EXPECT_EQ(h2[0], h1[0]);
  EXPECT_EQ(h2[1], h1[1]);
  EXPECT_EQ(r.book.host_refs(h1[0]), 2);
  EXPECT_EQ(r.book.host_refs(h1[2]), 1);
  for (const block_swap& m : r.ledger.plan().swap_outs()) EXPECT_EQ(r.store.refcount(m.device), 0);
  EXPECT_TRUE(r.table.at(1).swapped);
}

TEST(SwapBook, SwapOutShortOfHostBlocksChangesNothing) {
  rig r(16, 2);
  r.add(1, 3);
  const auto before = r.table.at(1).blocks;
  const status st = r.out({1});
  EXPECT_EQ(st.code(), errc::host_pool_full);
  EXPECT_EQ(st.detail(), 3);
  EXPECT_EQ(r.table.at(1).blocks, before);
  EXPECT_FALSE(r.table.at(1).swapped);
  EXPECT_EQ(r.book.host_free(), 2);
  EXPECT_TRUE(r.ledger.plan().empty());
  EXPECT_EQ(r.book.swapped(), 0);
  ASSERT_TRUE(r.out({1}).code() == errc::host_pool_full);  // the marks were undone: same answer again
}

TEST(SwapBook, SwapInRestoresSharingAndReturnsHostBlocksOneStepLate) {
  rig r(16, 16);
  r.add(1, 2);
  auto& s2 = r.table[r.table.insert(2)];
  s2.blocks = {r.table.at(1).blocks[0]};
  r.store.add_ref(s2.blocks[0]);
  ASSERT_TRUE(r.out({1, 2}));
  r.next_step();
  ASSERT_TRUE(r.in({2, 1}));
  EXPECT_EQ(r.ledger.plan().swap_ins().size(), 2U);
  cache_stats st;
  r.book.report(st);
  EXPECT_EQ(st.swap_outs, 2);
  EXPECT_EQ(st.swap_ins, 2);
  EXPECT_EQ(st.swapped_in_blocks, 2);
  EXPECT_EQ(st.swapped_logical, 0);  // no table on the host any more
  const auto& d1 = r.table.at(1).blocks;
  EXPECT_EQ(r.table.at(2).blocks[0], d1[0]);
  EXPECT_EQ(r.store.refcount(d1[0]), 2);
  EXPECT_EQ(r.store.refcount(d1[1]), 1);
  EXPECT_TRUE(r.ledger.busy(d1[0]));
  EXPECT_EQ(r.table.at(1).append_step, r.ledger.step());
  EXPECT_EQ(r.book.swapped(), 0);
  EXPECT_EQ(r.book.host_free(), 14);  // the swap-ins still read them in this step
  r.next_step();
  EXPECT_EQ(r.book.host_free(), 16);
}

TEST(SwapBook, SwapInShortOfDeviceBlocksChangesNothing) {
  rig r(4, 8);
  r.add(1, 3);
  ASSERT_TRUE(r.out({1}));
  r.next_step();
  r.add(2, 2);
  const auto before = r.table.at(1).blocks;
  const status st = r.in({1});
  EXPECT_EQ(st.code(), errc::out_of_blocks);
  EXPECT_EQ(st.detail(), 3);
  EXPECT_EQ(r.table.at(1).blocks, before);
  EXPECT_TRUE(r.table.at(1).swapped);
  EXPECT_EQ(r.store.available(), 2);
  EXPECT_TRUE(r.ledger.plan().swap_ins().empty());
}

TEST(SwapBook, DroppingASwappedTableReleasesItsHostBlocksAtTheNextStep) {
  rig r(8, 8);
  r.add(1, 3);
  ASSERT_TRUE(r.out({1}));
  r.book.drop_table(r.table.at(1).blocks);
  EXPECT_EQ(r.book.swapped(), 0);
  EXPECT_EQ(r.book.host_free(), 5);
  r.next_step();
  EXPECT_EQ(r.book.host_free(), 8);
}

TEST(SwapBook, HostPoolIsABlockPoolWhoseRefcountsAreTableEntries) {
  rig r(16, 8);
  r.add(1, 2);
  auto& s2 = r.table[r.table.insert(2)];
  s2.blocks = {r.table.at(1).blocks[0]};
  r.store.add_ref(s2.blocks[0]);
  ASSERT_TRUE(r.out({1, 2}));
  const auto* pool = r.book.host_pool();
  ASSERT_NE(pool, nullptr);
  const auto& h1 = r.table.at(1).blocks;
  EXPECT_EQ(pool->refcount(h1[0]), 2);
  EXPECT_EQ(pool->refcount(h1[1]), 1);
  EXPECT_EQ(pool->num_used(), 2);
  EXPECT_EQ(pool->stats().references, 3);
  r.book.drop_table(r.table.at(2).blocks);
  EXPECT_EQ(pool->refcount(h1[0]), 1);
}

TEST(SwapBook, NoHostPoolWithoutHostBlocks) {
  rig r(8, 0);
  EXPECT_FALSE(r.book.has_host_pool());
  EXPECT_EQ(r.book.host_pool(), nullptr);
  EXPECT_EQ(r.book.host_capacity(), 0);
  EXPECT_EQ(r.book.host_free(), 0);
  EXPECT_EQ(r.book.decide(3), preempt_action::swap);  // host_swap decides; the cache then finds no room
}

TEST(SwapBook, DecisionSeesTheFreeHostBlocks) {
  swap_book<hybrid_swap> book;
  book.reset(pool_geometry{8, 16, 0}, 4);
  EXPECT_EQ(book.decide(4), preempt_action::swap);
  EXPECT_EQ(book.decide(5), preempt_action::recompute);
}
