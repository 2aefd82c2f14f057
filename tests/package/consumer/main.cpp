// SPDX-License-Identifier: Apache-2.0
#include <kvpager/c/kernels.h>
#include <kvpager/kvpager.hpp>

#include <cstdio>

int main() {
  auto cache = kvpager::paged_kv_cache<>::create({.block_size = 16, .num_blocks = 64});
  if (!cache || !cache->add_sequence(1, 100)) return 1;
  if (cache->stats().used != 7 || kvpager_version() != KVPAGER_VERSION) return 2;
  // A named composition and its scheduler, from kvpager::compositions (KVPAGER_EXTERN_COMPOSITIONS).
  static_assert(KVPAGER_EXTERN_COMPOSITIONS == 1, "kvpager::compositions defines KVPAGER_EXTERN_COMPOSITIONS");
  auto vllm = kvpager::vllm_v1_cache::create({.num_blocks = 64, .reserved_blocks = 1});
  if (!vllm) return 3;
  kvpager::scheduler<kvpager::vllm_v1_cache> sched(*vllm);
  const kvpager::token_id prompt[40] = {};
  if (!sched.add_request(1, prompt) || sched.schedule().scheduled.size() != 1) return 4;
  std::printf("consumer ok: %d blocks used\n", cache->stats().used);
  return 0;
}
