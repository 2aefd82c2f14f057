// SPDX-License-Identifier: Apache-2.0
// Compiled by xxhash_feature.cmake with KVPAGER_HAS_XXHASH=0: every umbrella builds without prefix caching, and
// (with KVPAGER_PROBE) naming a composition over prefix caching, or including its hasher, does not compile.
#include <kvpager/cache.hpp>
#include <kvpager/kvpager.hpp>
#include <kvpager/serving.hpp>

int kvpager_xxhash_off_probe() {
  auto c = kvpager::paged_kv_cache<>::create({16, 64, 1, 0});
  return c ? 0 : 1;
}
#if defined(KVPAGER_PROBE_COMPOSITION)
using probe = kvpager::vllm_v1_cache;
#elif defined(KVPAGER_PROBE_HASHER)
#include <kvpager/sharing/xxh3_hasher.hpp>
#endif
