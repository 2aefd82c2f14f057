// SPDX-License-Identifier: Apache-2.0
// The seed's BlockAllocator demo (3.3.2) and its copy-on-write sharing, done right.
//
// 1. The seed's demo: 1000 blocks of 16 tokens. Sequence 1 gets 10 blocks; sequence 2 shares sequence 1's first 5
//    blocks (a common system prompt) and gets 3 more of its own. The seed printed "used: 18" and "utilization:
//    1.8%" by summing the table lengths; 18 is the number of *logical* block references, while only 13 *physical*
//    blocks are in use (1.3%), because 5 are shared with reference count 2.
// 2. Copy-on-write: a sequence forked from the first 150 tokens of sequence 1 shares its 10 blocks, the last one
//    partly filled; its first own token would land in that shared block, so the cache plans one block copy first.
//    A fork at a block boundary (sequence 2) never copies: in ordinary decoding the copy almost never happens.
// 3. Freeing: as the seed's free(), a block returns to the pool when its last reference goes: freeing sequence 1
//    keeps the 5 blocks sequence 2 shares.
// 4. N requests sharing one system prompt store it once: 4 requests over a 256-token prompt hold 16 physical blocks
//    for 64 block-table entries, saving (N-1)/N = 75%.
//
// lifo_allocator hands out the most recently freed block first, which on a fresh pool is the seed's
// `free_blocks.pop()` order (999, 998, ...), so the block ids below match the seed's. Exits non-zero if a figure
// is wrong.
#include <kvpager/kvpager.hpp>

#include <cstdio>
#include <span>

#include "common/check.hpp"

namespace {
using example::check;
using example::check_percent;
using example::check_that;
using example::succeeded;
using cache_t = kvpager::paged_kv_cache<kvpager::lifo_allocator>;

// Prints sequence `id`'s block table and checks it is `expected`.
void check_table(const cache_t& cache, kvpager::seq_id id, std::span<const kvpager::block_id> expected) {
  const auto table = cache.block_table(id);
  if (!succeeded(table, "block_table")) return;
  std::printf("  sequence %llu block table: [", static_cast<unsigned long long>(id));
  for (std::size_t i = 0; i < table->size(); ++i) std::printf("%s%d", i ? ", " : "", (*table)[i]);
  std::printf("]\n");
  bool same = table->size() == expected.size();
  for (std::size_t i = 0; same && i < expected.size(); ++i) same = (*table)[i] == expected[i];
  check_that(same, "the block table is the seed's");
}
}  // namespace

int main() {
  auto created = cache_t::create({.block_size = 16, .num_blocks = 1000});
  if (!succeeded(created, "create")) return example::exit_code();
  cache_t& cache = *created;

  std::printf("1. The seed's demo: allocate(1, 10); share_blocks(1, 2, 5); allocate(2, 3)\n");
  // Sequence 1: a 160-token prompt is 10 blocks, allocated in one batch.
  (void)succeeded(cache.add_sequence(1, 10 * 16), "add_sequence(1)");
  cache.begin_step();  // the prompt's KV has been written
  // Sequence 2 starts from sequence 1's first 80 tokens (5 blocks, shared by reference count) ...
  (void)succeeded(cache.fork(1, 2, 5 * 16), "fork(1 -> 2)");
  // ... and appends 48 tokens of its own: 3 new blocks.
  (void)succeeded(cache.append_tokens(2, kvpager::token_count{3 * 16}), "append_tokens(2)");
  const kvpager::block_id seed_table_1[] = {999, 998, 997, 996, 995, 994, 993, 992, 991, 990};
  const kvpager::block_id seed_table_2[] = {999, 998, 997, 996, 995, 989, 988, 987};
  check_table(cache, 1, seed_table_1);
  check_table(cache, 2, seed_table_2);
  kvpager::cache_stats s = cache.stats();
  check("total blocks", s.total, 1000);
  check("free blocks", s.free, 987);
  check("physical blocks in use (the seed printed 18)", s.used, 13);
  check("logical block references (the seed's 'used')", s.logical, 18);
  check("blocks shared by more than one sequence", s.shared, 5);
  check("reference count of block 999 (shared)", cache.refcount(999), 2);
  check("reference count of block 990 (sequence 1's own)", cache.refcount(990), 1);
  check_percent("utilization, physical / total (the seed printed 1.8%)", s.utilization(), 1.3, 1);
  check("copies planned: a fork at a block boundary copies nothing", static_cast<std::int64_t>(cache.plan().copies().size()), 0);

  std::printf("\n2. Copy-on-write: sequence 3 forks the first 150 tokens of sequence 1 and decodes one token\n");
  cache.begin_step();
  (void)succeeded(cache.fork(1, 3, 150), "fork(1 -> 3, 150 tokens)");
  check("reference count of block 990 after the fork", cache.refcount(990), 2);
  (void)succeeded(cache.append_tokens(3), "append_tokens(3)");  // token 151 would overwrite slot 6 of block 990
  const auto copies = cache.plan().copies();
  check("block copies planned before the write", static_cast<std::int64_t>(copies.size()), 1);
  if (copies.size() == 1) {
    std::printf("  copy block %d -> %d, then write the token into block %d\n", copies[0].src, copies[0].dst,
                copies[0].dst);
    check("copied block (sequence 1's last, partly shared)", copies[0].src, 990);
  }
  check("reference count of block 990 after the copy", cache.refcount(990), 1);
  s = cache.stats();
  check("physical blocks in use (13 + sequence 3's copy)", s.used, 14);
  check("copy-on-write copies so far", s.cow_copies, 1);

  std::printf("\n3. Freeing: a block returns to the pool with its last reference\n");
  cache.begin_step();  // the copy has run
  (void)succeeded(cache.free_sequence(3), "free_sequence(3)");
  (void)succeeded(cache.free_sequence(1), "free_sequence(1)");
  s = cache.stats();
  check("free blocks after sequences 3 and 1 end", s.free, 992);
  check("reference count of block 999 (sequence 2 keeps it)", cache.refcount(999), 1);
  (void)succeeded(cache.free_sequence(2), "free_sequence(2)");
  check("free blocks after sequence 2 ends", cache.stats().free, 1000);

  std::printf("\n4. Four requests over one 256-token system prompt store it once\n");
  (void)succeeded(cache.add_sequence(10, 256), "add_sequence(10)");
  cache.begin_step();
  for (kvpager::seq_id child = 11; child <= 13; ++child) (void)succeeded(cache.fork(10, child), "fork");
  s = cache.stats();
  check("physical blocks", s.used, 16);
  check("block-table entries", s.logical, 64);
  check_percent("memory saved by sharing, (N-1)/N", s.sharing_ratio(), 75.0, 1);
  return example::exit_code();
}
