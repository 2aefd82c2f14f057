// SPDX-License-Identifier: Apache-2.0
// The seed's SwapManager demo (3.3.3), done right.
//
// 100 device blocks, 200 host blocks. Sequence 1 takes 80 and sequence 2 takes 15 (95 used, 95.0%). Sequence 1 is
// swapped out to host memory, which frees its 80 blocks (85 free, 15.0%). The seed then calls allocate(3, 90)
// under the comment "now there is room for request 3": there is not (90 > 85), its allocator raises "OOM: needed
// 90, 85 available" and the demo dies there. Here it is a clear errc::out_of_blocks (detail: 90 blocks needed) that
// changes nothing, and asking for 85 succeeds. Once sequence 3 finishes there is room again and sequence 1 is
// swapped back in. The cache only plans the copies; the engine moves the bytes (swap_blocks) in the order
// swap-outs, swap-ins, copies, writes. Exits non-zero if a figure is wrong.
#include <kvpager/kvpager.hpp>

#include <cstdio>

#include "common/check.hpp"

namespace {
using example::check;
using example::check_percent;
using example::check_that;
using example::succeeded;

void show(const char* when, const kvpager::cache_stats& s) {
  std::printf("%s device free %d/%d, host free %d/%d, swapped sequences %d\n", when, s.free, s.total, s.host_free,
              s.host_total, s.swapped);
}
}  // namespace

int main() {
  using cache_t = kvpager::paged_kv_cache<kvpager::free_list_allocator, kvpager::no_eviction,
                                          kvpager::refcount_sharing, kvpager::host_swap>;
  auto created = cache_t::create({.block_size = 16, .num_blocks = 100, .num_host_blocks = 200});
  if (!succeeded(created, "create")) return example::exit_code();
  auto& cache = *created;

  (void)succeeded(cache.add_sequence(1, 80 * 16), "add_sequence(1, 80 blocks)");
  (void)succeeded(cache.add_sequence(2, 15 * 16), "add_sequence(2, 15 blocks)");
  cache.begin_step();
  kvpager::cache_stats s = cache.stats();
  show("before swap:", s);
  check("device blocks used", s.used, 95);
  check_percent("utilization", s.utilization(), 95.0, 1);

  (void)succeeded(cache.swap_out(1), "swap_out(1)");
  check("block copies device -> host planned for sequence 1",
        static_cast<std::int64_t>(cache.plan().swap_outs().size()), 80);
  s = cache.stats();
  show("after swap-out:", s);
  check("device blocks free", s.free, 85);
  check_percent("utilization", s.utilization(), 15.0, 1);
  check("host blocks holding sequence 1", s.host_total - s.host_free, 80);
  cache.begin_step();

  const kvpager::cache_stats before = cache.stats();
  const kvpager::status refused = cache.add_sequence(3, 90 * 16);
  std::printf("sequence 3 asking for 90 blocks: %s (%s, needed %lld)\n", kvpager::to_string(refused.code()),
              refused.message(), static_cast<long long>(refused.detail()));
  check_that(refused.code() == kvpager::errc::out_of_blocks, "the 90-block request is refused with out_of_blocks");
  check("blocks it needed (status detail)", refused.detail(), 90);
  check_that(cache.stats() == before && !cache.contains(3), "the refused request changed nothing");
  (void)succeeded(cache.add_sequence(3, 85 * 16), "add_sequence(3, 85 blocks)");
  s = cache.stats();
  show("sequence 3 with 85 blocks:", s);
  check("device blocks free", s.free, 0);

  const kvpager::status early = cache.swap_in(1);
  std::printf("swap-in of sequence 1 now: %s\n", kvpager::to_string(early.code()));
  check_that(early.code() == kvpager::errc::out_of_blocks, "no room to swap sequence 1 back in while 3 runs");
  cache.begin_step();
  (void)succeeded(cache.free_sequence(3), "free_sequence(3)");
  (void)succeeded(cache.swap_in(1), "swap_in(1)");
  check("block copies host -> device planned for sequence 1",
        static_cast<std::int64_t>(cache.plan().swap_ins().size()), 80);
  cache.begin_step();
  s = cache.stats();
  show("after swap-in:", s);
  check("device blocks free", s.free, 5);
  check("host blocks free", s.host_free, 200);
  check_that(!cache.is_swapped(1), "sequence 1 is back on the device");
  return example::exit_code();
}
