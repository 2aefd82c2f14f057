// SPDX-License-Identifier: Apache-2.0
// The seed's SwapManager demo, done right.
//
// 100 device blocks. Sequence 1 takes 80 and sequence 2 takes 15. Sequence 1 is swapped out to host memory, which
// frees its 80 blocks (85 free). Sequence 3 asks for 90 blocks: the seed's demo allocated them anyway and would
// crash; here it is a clear out-of-blocks result that changes nothing, and asking for 85 succeeds. Once sequence 3
// finishes there is room again and sequence 1 is swapped back in. The cache only plans the copies; the engine moves
// the bytes (swap_blocks) in the order swap-outs, swap-ins, copies, writes.
#include <kvpager/kvpager.hpp>

#include <cstdio>

namespace {
void show(const char* when, const kvpager::cache_stats& s) {
  std::printf("%-28s device free %3d/%d, host free %3d/%d, swapped sequences %d\n", when, s.free, s.total, s.host_free,
              s.host_total, s.swapped);
}
}  // namespace

int main() {
  using cache_t = kvpager::paged_kv_cache<kvpager::free_list_allocator, kvpager::no_eviction,
                                          kvpager::refcount_sharing, kvpager::host_swap>;
  auto created = cache_t::create({.block_size = 16, .num_blocks = 100, .num_host_blocks = 200});
  if (!created) return 1;
  auto& cache = *created;

  if (!cache.add_sequence(1, 80 * 16) || !cache.add_sequence(2, 15 * 16)) return 1;
  cache.begin_step();
  show("before swap:", cache.stats());

  if (auto st = cache.swap_out(1); !st) return 1;
  std::printf("swap-out of sequence 1 planned %zu block copies device -> host\n", cache.plan().swap_outs().size());
  show("after swap-out:", cache.stats());
  cache.begin_step();

  if (auto st = cache.add_sequence(3, 90 * 16); !st)
    std::printf("sequence 3 asking for 90 blocks: %s (%s, needed %lld)\n", kvpager::to_string(st.code()), st.message(),
                static_cast<long long>(st.detail()));
  if (auto st = cache.add_sequence(3, 85 * 16); !st) return 1;
  show("sequence 3 with 85 blocks:", cache.stats());

  if (auto st = cache.swap_in(1); !st) std::printf("swap-in of sequence 1 now: %s\n", kvpager::to_string(st.code()));
  cache.begin_step();
  (void)cache.free_sequence(3);
  if (auto st = cache.swap_in(1); !st) return 1;
  std::printf("sequence 3 finished; swap-in of sequence 1 planned %zu block copies host -> device\n",
              cache.plan().swap_ins().size());
  cache.begin_step();
  show("after swap-in:", cache.stats());
  return cache.stats().free == 5 && !cache.is_swapped(1) ? 0 : 1;
}
