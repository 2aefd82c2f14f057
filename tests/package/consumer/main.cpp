// SPDX-License-Identifier: Apache-2.0
#include <kvpager/c/kernels.h>
#include <kvpager/kvpager.hpp>

#include <cstdio>

int main() {
  auto cache = kvpager::paged_kv_cache<>::create({.block_size = 16, .num_blocks = 64});
  if (!cache || !cache->add_sequence(1, 100)) return 1;
  if (cache->stats().used != 7 || kvpager_version() != KVPAGER_VERSION) return 2;
  std::printf("consumer ok: %d blocks used\n", cache->stats().used);
  return 0;
}
