// SPDX-License-Identifier: Apache-2.0
// The seed's GlobalBlockPool serving cycle (3.3.4): one global pool of 500 blocks of 16 tokens.
//
// Phase 1 admits three prompts of 200, 150 and 300 tokens: ceil(n / 16) = 13, 10 and 19 blocks, 458 free.
// Phase 2 decodes 100 tokens for each: 300, 250 and 400 tokens take 19, 16 and 25 blocks (a new block exactly when
// a token no longer fits the last one), 440 free. Phase 3: request 1 completes and its 19 blocks return, 459 free.
// The seed's figures are right; here they come from the library twice: (1) the cache driven by hand, call for call
// as the seed's demo; (2) the same three requests through kvpager::scheduler, as an engine runs them: one prefill
// step, then 100 decode steps, each appending the KV of the token sampled in the step before. Exits non-zero if a
// figure is wrong.
#include <kvpager/kvpager.hpp>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "common/check.hpp"

namespace {
using example::check;
using example::succeeded;
using cache_t = kvpager::paged_kv_cache<>;

constexpr kvpager::seq_id ids[] = {1, 2, 3};
constexpr std::int32_t prompt_lengths[] = {200, 150, 300};

kvpager::result<cache_t> pool() { return cache_t::create({.block_size = 16, .num_blocks = 500}); }

std::int64_t table_length(const cache_t& cache, kvpager::seq_id id) {
  const auto table = cache.block_table(id);
  return succeeded(table, "block_table") ? static_cast<std::int64_t>(table->size()) : -1;
}

void by_hand() {
  std::printf("1. The cache driven call for call as the seed's demo:\n");
  auto created = pool();
  if (!succeeded(created, "create")) return;
  cache_t& cache = *created;
  check("initial free blocks", cache.stats().free, 500);

  for (int i = 0; i < 3; ++i) (void)succeeded(cache.add_sequence(ids[i], prompt_lengths[i]), "add_sequence");
  check("block table of request 1 (200 tokens)", table_length(cache, 1), 13);
  check("block table of request 2 (150 tokens)", table_length(cache, 2), 10);
  check("block table of request 3 (300 tokens)", table_length(cache, 3), 19);
  check("free blocks after admitting 3 requests", cache.stats().free, 458);

  for (int step = 0; step < 100; ++step) {
    cache.begin_step();
    for (const kvpager::seq_id id : ids) (void)succeeded(cache.append_tokens(id), "append_tokens");
  }
  check("free blocks after 100 decode steps each", cache.stats().free, 440);

  cache.begin_step();
  (void)succeeded(cache.free_sequence(1), "free_sequence(1)");
  check("free blocks after request 1 completes", cache.stats().free, 459);
}

void through_the_scheduler() {
  std::printf("\n2. The same requests through kvpager::scheduler (prefill step, then 100 decode steps):\n");
  auto created = pool();
  if (!succeeded(created, "create")) return;
  cache_t& cache = *created;
  kvpager::scheduler<cache_t> sched(cache);
  for (int i = 0; i < 3; ++i) {
    const std::vector<kvpager::token_id> prompt(static_cast<std::size_t>(prompt_lengths[i]), 7);
    (void)succeeded(sched.add_request(ids[i], prompt), "add_request");
  }
  kvpager::token_id next = 100;  // what the model would sample
  const auto run_step = [&] {
    const kvpager::step_output& out = sched.schedule();
    for (const kvpager::scheduled_sequence& x : out.scheduled)
      if (x.last_chunk) (void)succeeded(sched.complete(x.id, next++), "complete");
    return static_cast<std::int64_t>(out.scheduled.size());
  };
  check("requests in the prefill step", run_step(), 3);
  check("free blocks after admitting 3 requests", cache.stats().free, 458);
  std::int64_t scheduled = 0;
  for (int step = 0; step < 100; ++step) scheduled += run_step();
  check("decodes scheduled in 100 steps", scheduled, 300);
  check("tokens in the cache (300 + 250 + 400)", cache.stats().tokens, 950);
  check("free blocks after 100 decode steps each", cache.stats().free, 440);
  (void)succeeded(sched.complete(1, next, /*finished=*/true), "complete(1, finished)");
  check("free blocks after request 1 completes", cache.stats().free, 459);
}
}  // namespace

int main() {
  by_hand();
  through_the_scheduler();
  return example::exit_code();
}
