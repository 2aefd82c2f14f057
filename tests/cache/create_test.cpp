// SPDX-License-Identifier: Apache-2.0
// paged_kv_cache::create under memory pressure: it reports errc::out_of_memory instead of throwing, frees whatever
// it allocated, and prefix caching allocates its per-entry token store as blocks are cached, not per block up front.
// This executable replaces the global operator new to count live bytes and to make allocations fail on demand.
#include <kvpager/kvpager.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <vector>

#include "kvpager_testing/allocation_probe.hpp"
#include "sharing/tokens.hpp"

#if defined(__SANITIZE_ADDRESS__)
// A real allocation failure (a request larger than the address space) must come back as nullptr / bad_alloc here,
// not as an ASan report.
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }
#endif

using namespace kvpager;

namespace {

using verified_cache = paged_kv_cache<free_list_allocator, lru_eviction, prefix_caching>;

/// A retention-less eviction policy whose reset wants `bytes_per_block` bytes of state per block in one array, as
/// a policy with large per-block state would.
struct greedy_eviction {
  static constexpr retention_mode retention = retention_mode::none;
  std::size_t bytes_per_block = 0;
  std::vector<std::uint8_t> state;
  void reset(const pool_geometry& g) { state.resize(static_cast<std::size_t>(g.num_blocks) * bytes_per_block); }
};
static_assert(eviction_policy<greedy_eviction>);

using kvtest::iota_tokens;

}  // namespace

#if KVPAGER_HAS_EXCEPTIONS
// A single allocation larger than the address space (2^16 blocks x 2^32 bytes = 2^48 bytes) really fails: create
// reports it instead of letting std::bad_alloc escape, and keeps nothing it had allocated.
TEST(CacheCreate, ReportsOutOfMemoryInsteadOfThrowing) {
  using cache_t = paged_kv_cache<free_list_allocator, greedy_eviction>;
  const std::int64_t before = probe::live_bytes.load();
  {
    auto r = cache_t::create({16, 1 << 16, 0, 0}, {.eviction = greedy_eviction{std::size_t{1} << 32, {}}});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), errc::out_of_memory) << r.error().message();
    EXPECT_EQ(r.error().detail(), 1 << 16);
  }
  EXPECT_EQ(probe::live_bytes.load(), before) << "a failed create left memory allocated";
  // The same composition with a sane policy is created normally.
  EXPECT_TRUE(cache_t::create({16, 1 << 16, 0, 0}, {.eviction = greedy_eviction{1, {}}}).ok());
}

// Every allocation create makes fails once in turn (prefix caching, an indexed policy and a host pool, so every
// part allocates): each failure is errc::out_of_memory with nothing left allocated, until create succeeds.
TEST(CacheCreate, OutOfMemoryAtAnyAllocationLeavesNothingAllocated) {
  using cache_t = paged_kv_cache<free_list_allocator, lfu_eviction, prefix_caching, host_swap>;
  probe::failure_scope scope;
  int failures = 0;
  for (std::int64_t k = 0;; ++k) {
    const std::int64_t before = probe::live_bytes.load();
    bool ok = false;
    {
      prefix_caching sharing;  // the arguments are built before failures are injected: only create's count
      probe::fail_after = k;
      auto r = cache_t::create({16, 256, 1, 0, 64}, {.sharing = std::move(sharing)});
      probe::fail_after = -1;
      ok = r.ok();
      if (!ok) {
        EXPECT_EQ(r.error().code(), errc::out_of_memory) << "allocation " << k << ": " << r.error().message();
        ++failures;
      }
    }
    if (ok) break;
    ASSERT_EQ(probe::live_bytes.load(), before) << "failing allocation " << k << " leaked";
    ASSERT_LT(k, 1000) << "create never succeeded";
  }
  EXPECT_GE(failures, 5) << "create should allocate in several parts";
}
#endif

// The parameters scaled down 16x: 2^20 blocks of 4096 tokens with verified prefix caching. Reserving
// token ids for every possible entry up front took 2 x 2^20 x 4096 x 4 bytes = 32 GiB (std::bad_alloc from a
// call documented never to throw); now create takes a few bytes per block and the token store grows with the
// cached blocks.
TEST(CacheCreate, VerifiedPrefixCacheReservesNoTokenIdsPerBlockUpFront) {
  constexpr std::int32_t blocks = 1 << 20;
  constexpr std::int32_t bs = 4096;
  const std::int64_t before = probe::live_bytes.load();
  auto r = verified_cache::create({bs, blocks, 1, 0});
  ASSERT_TRUE(r.ok()) << r.error().message();
  auto& c = *r;
  const auto& s = c.sharing();
  const std::size_t idle = s.memory_bytes();
  EXPECT_LE(idle, std::size_t{16} * blocks) << "prefix caching's own memory per block, before anything is cached";
  EXPECT_LE(probe::live_bytes.load() - before, std::int64_t{64} * blocks) << "the whole cache, per block";
  // Caching one block allocates one chunk of entries with their token ids: proportional to use.
  ASSERT_TRUE(c.add_sequence(1, iota_tokens(bs + 1, 0)));
  EXPECT_EQ(c.stats().cached, 1);
  const std::size_t chunk = s.entries_per_chunk() * (bs * sizeof(token_id) + 64);
  EXPECT_LE(s.memory_bytes() - idle, chunk);
  EXPECT_GE(s.memory_bytes() - idle, s.entries_per_chunk() * bs * sizeof(token_id));
  EXPECT_EQ(c.match_prefix(iota_tokens(bs + 1, 0))->blocks, 1);
}

// When memory for a new chunk of entries is short, committing a block leaves it uncached (the rest of that
// sequence's chain too) instead of failing or writing out of bounds; the cache stays consistent and caches again
// once memory is back.
TEST(CacheCreate, PrefixCacheCommitWithoutMemoryLeavesTheBlockUncached) {
  constexpr std::int32_t bs = 64;
  auto r = verified_cache::create({bs, 24, 1, 0});
  ASSERT_TRUE(r.ok());
  auto& c = *r;
  const auto prompt = iota_tokens(2 * bs + 1, 0);
  const std::size_t idle = c.sharing().memory_bytes();
  {
    probe::failure_scope scope;
    probe::fail_at_least = 4096;  // the entry and token chunks; the cache's own small vectors still succeed
    ASSERT_TRUE(c.add_sequence(1, prompt));
  }
  EXPECT_EQ(c.stats().cached, 0);
  EXPECT_EQ(c.sharing().num_entries(), 0);
  EXPECT_EQ(c.sharing().memory_bytes(), idle);
  EXPECT_EQ(c.match_prefix(prompt)->blocks, 0);
  c.begin_step();
  ASSERT_TRUE(c.append_tokens(1, iota_tokens(bs, 1000)));  // the chain stays broken for this sequence
  EXPECT_EQ(c.stats().cached, 0);
  ASSERT_TRUE(c.add_sequence(2, prompt));  // memory is back: a new sequence caches again
  EXPECT_EQ(c.stats().cached, 2);
  EXPECT_EQ(c.match_prefix(prompt)->blocks, 2);
  ASSERT_TRUE(c.free_sequence(1));
  ASSERT_TRUE(c.free_sequence(2));
}
