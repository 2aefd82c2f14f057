// SPDX-License-Identifier: Apache-2.0
// The seed's BlockAllocator demo, done right.
//
// 1000 blocks of 16 tokens. Sequence 1 gets 10 blocks; sequence 2 shares sequence 1's first 5 blocks (a common
// system prompt) and gets 3 more of its own. The seed printed "used: 18" by summing the table lengths; 18 is
// the number of *logical* block references, while only 13 *physical* blocks are in use, because 5 are shared.
//
// lifo_allocator hands out the most recently freed block first, which on a fresh pool is the seed's
// `free_blocks.pop()` order (999, 998, ...), so the block ids below match the seed's.
#include <kvpager/kvpager.hpp>

#include <cstdio>
#include <span>

namespace {
void print_table(const char* name, std::span<const kvpager::block_id> table) {
  std::printf("%s block table (%zu blocks): [", name, table.size());
  for (std::size_t i = 0; i < table.size(); ++i) std::printf("%s%d", i ? ", " : "", table[i]);
  std::printf("]\n");
}
int fail(const char* what, kvpager::status st) {
  std::fprintf(stderr, "%s failed: %s (%s)\n", what, st.message(), kvpager::to_string(st.code()));
  return 1;
}
}  // namespace

int main() {
  using cache_t = kvpager::paged_kv_cache<kvpager::lifo_allocator>;
  auto created = cache_t::create({.block_size = 16, .num_blocks = 1000});
  if (!created) return fail("create", created.error());
  cache_t& cache = *created;

  // Sequence 1: a 160-token prompt is 10 blocks, allocated in one batch.
  if (auto st = cache.add_sequence(1, 10 * 16); !st) return fail("add_sequence(1)", st);
  cache.begin_step();  // the prompt's KV has been written

  // Sequence 2 starts from sequence 1's first 80 tokens (5 blocks, shared by reference count) ...
  if (auto st = cache.fork(1, 2, 5 * 16); !st) return fail("fork(1 -> 2)", st);
  // ... and appends 48 tokens of its own: 3 new blocks.
  if (auto st = cache.append_tokens(2, kvpager::token_count{3 * 16}); !st) return fail("append_tokens(2)", st);

  print_table("sequence 1", *cache.block_table(1));
  print_table("sequence 2", *cache.block_table(2));

  const kvpager::cache_stats s = cache.stats();
  std::printf("total blocks:                     %d\n", s.total);
  std::printf("free blocks:                      %d\n", s.free);
  std::printf("physical blocks in use:           %d   (distinct blocks holding KV data)\n", s.used);
  std::printf("logical block references:         %lld   (sum of block-table lengths; the seed's 'used')\n",
              static_cast<long long>(s.logical));
  std::printf("blocks shared by >1 sequence:     %d\n", s.shared);
  std::printf("utilization (physical / total):   %.1f%%\n", 100.0 * s.utilization());
  std::printf("sharing ratio (1 - phys/logical): %.1f%%\n", 100.0 * s.sharing_ratio());
  return s.used == 13 && s.logical == 18 ? 0 : 1;
}
