// SPDX-License-Identifier: Apache-2.0
// block_store alone: taking, touching, releasing and settling blocks across pool, eviction and sharing.
#include <kvpager/allocator/free_list_allocator.hpp>
#include <kvpager/cache/detail/block_store.hpp>
#include <kvpager/cache/detail/copy_on_write.hpp>
#include <kvpager/eviction/indexed_eviction.hpp>
#include <kvpager/eviction/no_eviction.hpp>
#include <kvpager/sharing/refcount_sharing.hpp>

#include <gtest/gtest.h>

#include <vector>

using namespace kvpager;
using namespace kvpager::detail;  // the cache's parts, tested alone

namespace {
template <class E>
block_store<free_list_allocator, E, refcount_sharing> make(std::int32_t n) {
  block_store<free_list_allocator, E, refcount_sharing> s(std::move(*block_pool<free_list_allocator>::create({n, 0})),
                                                           E{}, refcount_sharing{});
  s.reset(pool_geometry{n, 4, 0});
  return s;
}
const auto never_park = [](block_id, retention_hint) { return false; };
}  // namespace

TEST(BlockStore, TakeAndReleaseRoundTrip) {
  auto s = make<no_eviction>(8);
  std::vector<block_id> b(3);
  s.take(b);
  EXPECT_EQ(s.available(), 5);
  for (const block_id x : b) EXPECT_EQ(s.refcount(x), 1);
  s.add_ref(b[0]);
  s.release(b[0], {}, never_park);
  EXPECT_EQ(s.refcount(b[0]), 1);
  for (const block_id x : b) s.release(x, {}, never_park);
  EXPECT_EQ(s.available(), 8);
}

TEST(BlockStore, ReleaseParksWhenTheLedgerSaysSo) {
  auto s = make<no_eviction>(4);
  std::vector<block_id> b(1);
  s.take(b);
  bool asked = false;
  s.release(b[0], retention_hint{3}, [&](block_id x, retention_hint h) {
    asked = x == b[0] && h.priority == 3;
    return true;
  });
  EXPECT_TRUE(asked);
  EXPECT_EQ(s.refcount(b[0]), 0);
  EXPECT_FALSE(s.pool().is_free(b[0]));  // parked: neither in use nor free
  EXPECT_EQ(s.available(), 3);
  EXPECT_TRUE(s.touch(b[0]));  // a hit revives a parked block and says so
  EXPECT_EQ(s.refcount(b[0]), 1);
}

TEST(BlockStore, TouchTakesAFreeBlockOrAddsAReference) {
  auto s = make<no_eviction>(4);
  EXPECT_FALSE(s.touch(2));
  EXPECT_EQ(s.refcount(2), 1);
  EXPECT_FALSE(s.pool().is_free(2));
  EXPECT_FALSE(s.touch(2));
  EXPECT_EQ(s.refcount(2), 2);
  EXPECT_FALSE(s.consumes_capacity(2));
  EXPECT_TRUE(s.consumes_capacity(3));
}

TEST(CopyOnWrite, ASharedPartialLastBlockIsCopiedBeforeTheWrite) {
  auto s = make<no_eviction>(8);
  step_ledger ledger;
  ledger.reset(8);
  std::vector<block_id> t(2);
  s.take(t);
  s.add_ref(t[1]);  // another sequence shares the last block
  const block_id shared = t[1];
  std::vector<block_id> released;
  write_growth g;
  ASSERT_TRUE(grow_for_write(s, ledger, t, 6, 4, 3, [&](block_id b) { released.push_back(b); }, g));
  EXPECT_TRUE(g.copied);
  EXPECT_EQ(g.new_blocks, 1);
  EXPECT_NE(t[1], shared);
  EXPECT_EQ(t.size(), 3U);
  ASSERT_EQ(ledger.plan().copies().size(), 1U);
  EXPECT_EQ(ledger.plan().copies()[0], (block_copy{shared, t[1]}));
  EXPECT_EQ(released, std::vector<block_id>{shared});
}

TEST(CopyOnWrite, ShortOfBlocksChangesNothing) {
  auto s = make<no_eviction>(3);
  step_ledger ledger;
  ledger.reset(3);
  std::vector<block_id> t(2);
  s.take(t);
  s.add_ref(t[1]);
  const auto before = t;
  write_growth g;
  const status st = grow_for_write(s, ledger, t, 6, 4, 3, [](block_id) { FAIL(); }, g);
  EXPECT_EQ(st.code(), errc::out_of_blocks);
  EXPECT_EQ(st.detail(), 2);
  EXPECT_EQ(t, before);
  EXPECT_EQ(s.available(), 1);
  EXPECT_TRUE(ledger.plan().empty());
}
