// SPDX-License-Identifier: Apache-2.0
// Automatic prefix caching, composed like vLLM v1: requests that share a system prompt reuse its blocks, blocks
// stay cached after their request finishes, and the pool evicts them in LRU order when it needs the space.
#include <kvpager/kvpager.hpp>

#include <cstdio>
#include <vector>

namespace {
std::vector<kvpager::token_id> prompt(std::int32_t system_tokens, std::int32_t user_tokens, kvpager::token_id user) {
  std::vector<kvpager::token_id> t;
  for (std::int32_t i = 0; i < system_tokens; ++i) t.push_back(1000 + i);     // the shared system prompt
  for (std::int32_t i = 0; i < user_tokens; ++i) t.push_back(user * 100 + i);  // this user's question
  return t;
}
}  // namespace

int main() {
  // 64 blocks of 16 tokens; block 0 is reserved as vLLM's null block.
  auto created = kvpager::vllm_v1_cache::create({.block_size = 16, .num_blocks = 64, .reserved_blocks = 1});
  if (!created) return 1;
  auto& cache = *created;

  for (kvpager::token_id user = 1; user <= 3; ++user) {
    const auto p = prompt(256, 40, user);  // 16 system blocks + 3 blocks of question
    kvpager::prefix_match hit;
    cache.begin_step();
    if (auto st = cache.add_sequence(static_cast<kvpager::seq_id>(user), p, {}, &hit); !st) {
      std::printf("admission failed: %s\n", st.message());
      return 1;
    }
    std::printf("request %d: %zu prompt tokens, %d served from the prefix cache (%d blocks), %lld to compute\n", user,
                p.size(), hit.tokens, hit.blocks, static_cast<long long>(cache.slot_mapping_size()));
  }
  auto s = cache.stats();
  std::printf("in use: %d physical blocks for %lld block-table entries (sharing ratio %.0f%%)\n", s.used,
              static_cast<long long>(s.logical), 100.0 * s.sharing_ratio());

  // Requests finish; their blocks stay cached and count as free (vLLM's usage).
  cache.begin_step();
  for (kvpager::seq_id id = 1; id <= 3; ++id) (void)cache.free_sequence(id);
  s = cache.stats();
  std::printf("after finishing: %d blocks free, %d of them still cached\n", s.free, s.cached);

  // A later request with the same system prompt still hits, with nothing running.
  const auto again = cache.match_prefix(prompt(256, 8, 9));
  std::printf("a new request would reuse %d cached tokens\n", again->tokens);

  // A large unrelated prompt needs the space: cached blocks are evicted least recently used first.
  cache.begin_step();
  if (!cache.add_sequence(100, prompt(0, 60 * 16, 77))) return 1;
  s = cache.stats();
  std::printf("after a 960-token unrelated prompt: %lld cached blocks evicted; the system prompt now hits %d tokens\n",
              static_cast<long long>(s.evictions), cache.match_prefix(prompt(256, 8, 9))->tokens);
  std::printf("prefix hit rate over all admissions: %.1f%%\n", 100.0 * s.prefix_hit_rate());
  return 0;
}
