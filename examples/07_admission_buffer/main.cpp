// SPDX-License-Identifier: Apache-2.0
// The seed's admission buffer (3.3.4, GlobalBlockPool.admit_request): a request of n blocks is admitted only when
// at least 1.1 x n blocks are free ("keep a 10% buffer"), so the requests already running have room to grow while
// they decode. The seed defines the rule but its demo never calls it; here kvpager's scheduler applies it
// (scheduler_config::admit_rule = admission_rule::request_headroom, headroom_permille = 100) beside vLLM's
// watermark (a share of the whole pool kept free).
//
// 1. The arithmetic, after the seed's serving cycle (examples/06_global_pool: 500 blocks, 459 free): the largest
//    prompt each rule admits now. The seed's rule keeps 42 blocks beside a 417-block prompt (417 + 42 = 459), so a
//    418-block prompt waits although 418 blocks are free. The seed also compares in floating point
//    (`len(free) < needed * 1.1`): 50 x 1.1 is 55.00000000000001 in a double, so with exactly 55 free blocks its
//    demo would refuse a 50-block request its own rule admits; 25 of the needs from 1 to 500 blocks are refused at
//    their exact threshold this way. The library counts the buffer in whole blocks (n + ceil(n / 10)).
// 2. The scheduler end to end: requests of 250 and 400 tokens run; a 6673-token prompt (418 blocks) arrives. With
//    the seed's rule it waits until request 2 finishes (step 3); with vLLM's 1% watermark it is admitted at once
//    (step 2); with a 10% watermark (50 blocks) in step 3. Exits non-zero if a figure is wrong.
#include <kvpager/kvpager.hpp>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "common/check.hpp"

namespace {
using example::check;
using example::check_that;
using example::succeeded;
using cache_t = kvpager::paged_kv_cache<>;

kvpager::scheduler_config seed_rule() {
  kvpager::scheduler_config cfg;
  cfg.admit_rule = kvpager::admission_rule::request_headroom;
  cfg.headroom_permille = 100;  // free >= 1.1 x needed
  return cfg;
}
kvpager::scheduler_config watermark(std::int32_t permille) {
  kvpager::scheduler_config cfg;
  cfg.admit_rule = kvpager::admission_rule::watermark;
  cfg.watermark_permille = permille;
  return cfg;
}

// The pool of the seed's cycle: 500 blocks of 16 tokens.
const kvpager::admission_limits pool{.usable_blocks = 500, .block_size = 16};

// The longest prompt (tokens) `cfg` admits with `free` blocks free: a binary search over the library's answer.
std::int64_t longest_admitted(const kvpager::scheduler_config& cfg, std::int64_t free) {
  std::int64_t lo = 0, hi = pool.usable_blocks * pool.block_size + 1;  // answer in [lo, hi)
  while (hi - lo > 1) {
    const std::int64_t mid = (lo + hi) / 2;
    (pool.check(cfg, mid, free) == kvpager::admission::ok ? lo : hi) = mid;
  }
  return lo;
}

void arithmetic() {
  std::printf("1. With 459 of 500 blocks free (the end of the seed's cycle), the longest prompt admitted now:\n");
  check("the seed's rule, free >= 1.1 x needed: tokens", longest_admitted(seed_rule(), 459), 417 * 16);
  check("  blocks it keeps beside a 417-block prompt", kvpager::admission_limits::headroom_blocks(seed_rule(), 417),
        42);
  check_that(pool.check(seed_rule(), 418 * 16, 459) == kvpager::admission::later,
             "a 418-block prompt waits (LATER) under the seed's rule although 418 blocks are free");
  check("vLLM V0's 1% watermark (5 blocks kept): tokens", longest_admitted(watermark(10), 459), 454 * 16);
  check("a 10% watermark (50 blocks kept): tokens", longest_admitted(watermark(100), 459), 409 * 16);

  // The seed's floating-point comparison against the exact rule, at each need's exact threshold.
  std::int32_t refused = 0, first = 0;
  for (std::int64_t need = 1; need <= 500; ++need) {
    const std::int64_t free = need + kvpager::admission_limits::headroom_blocks(seed_rule(), need);
    const bool seed_admits = !(static_cast<double>(free) < static_cast<double>(need) * 1.1);  // the seed's test
    const bool library_admits = kvpager::admission_limits{.usable_blocks = 1000, .block_size = 16}.check(
                                    seed_rule(), need * 16, free) == kvpager::admission::ok;
    if (library_admits && !seed_admits && refused++ == 0) first = static_cast<std::int32_t>(need);
  }
  std::printf("   the seed's test `free < needed * 1.1` in floating point, at the exact threshold free = 1.1 x needed:\n");
  check("  needs from 1 to 500 blocks it refuses wrongly", refused, 25);
  check("  the first (55 free, 50 x 1.1 = 55.00000000000001)", first, 50);
}

// Runs the scenario of part 2 under `cfg`; returns the step in which the 6673-token request was admitted (0: never).
std::int32_t admitted_in_step(const kvpager::scheduler_config& cfg, const char* name) {
  auto created = cache_t::create({.block_size = 16, .num_blocks = 500});
  if (!succeeded(created, "create")) return 0;
  cache_t& cache = *created;
  auto sched = kvpager::scheduler<cache_t>::create(cache, cfg);
  if (!succeeded(sched, "scheduler::create")) return 0;
  const auto prompt = [](std::size_t n) { return std::vector<kvpager::token_id>(n, 7); };
  (void)succeeded(sched->add_request(2, prompt(250)), "add_request(2)");
  (void)succeeded(sched->add_request(3, prompt(400)), "add_request(3)");
  const auto step = [&](kvpager::seq_id finishing) {
    bool admitted = false;
    for (const kvpager::scheduled_sequence& x : sched->schedule().scheduled) {
      admitted = admitted || x.id == 4;
      if (x.last_chunk) (void)succeeded(sched->complete(x.id, 9, x.id == finishing), "complete");
    }
    return admitted;
  };
  (void)step(0);  // step 1: the two prompts (16 + 25 blocks)
  const std::int64_t free_before = cache.stats().free;
  const auto answer = sched->add_request(4, prompt(6673));  // 418 blocks
  if (!succeeded(answer, "add_request(4)")) return 0;
  std::int32_t when = 0;
  for (std::int32_t s = 2; s <= 3 && when == 0; ++s)
    if (step(s == 2 ? 2 : 0)) when = s;  // request 2 finishes at the end of step 2
  std::printf("   %-34s %lld free at arrival, answered %s, admitted in step %d\n", name,
              static_cast<long long>(free_before), *answer == kvpager::admission::ok ? "OK" : "LATER", when);
  return when;
}

void end_to_end() {
  std::printf("\n2. Through the scheduler: a 6673-token (418-block) prompt arrives while 250 and 400 tokens run;\n"
              "   request 2 finishes at the end of step 2:\n");
  check("the seed's rule: admitted in step", admitted_in_step(seed_rule(), "the seed's rule (1.1 x needed):"), 3);
  check("vLLM V0's 1% watermark: admitted in step", admitted_in_step(watermark(10), "the 1% watermark:"), 2);
  check("a 10% watermark: admitted in step", admitted_in_step(watermark(100), "a 10% watermark:"), 3);
}
}  // namespace

int main() {
  arithmetic();
  end_to_end();
  return example::exit_code();
}
