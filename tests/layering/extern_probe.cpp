// SPDX-License-Identifier: Apache-2.0
// A translation unit that uses a named composition with its scheduler (extern_compositions.cmake compiles it with
// and without KVPAGER_EXTERN_COMPOSITIONS and reads its symbols).
#include <kvpager/serving.hpp>

#include <vector>

int kvpager_extern_probe() {
  auto cache = kvpager::vllm_v1_cache::create({.num_blocks = 64, .reserved_blocks = 1});
  if (!cache) return 1;
  if (!cache->add_sequence(7, 40)) return 2;
  if (!cache->append_tokens(7)) return 3;
  kvpager::scheduler<kvpager::vllm_v1_cache> sched(*cache);
  const std::vector<kvpager::token_id> prompt(40, 5);
  if (!sched.add_request(1, prompt)) return 4;
  const auto n = static_cast<int>(sched.schedule().query_start_loc.size());
  // KV cache groups: a full-attention and a sliding-window group in one pool.
  const kvpager::any_group_kind groups[] = {kvpager::full_attention{}, kvpager::sliding_window{.window = 32}};
  auto hybrid = kvpager::kv_groups_cache::create({.num_blocks = 64, .reserved_blocks = 1}, groups);
  if (!hybrid || !hybrid->add_sequence(8, 40) || !hybrid->append_tokens(8)) return 5;
  kvpager::scheduler<kvpager::kv_groups_cache> groups_sched(*hybrid);
  if (!groups_sched.add_request(2, prompt)) return 6;
  return n + static_cast<int>(groups_sched.schedule().query_start_loc.size());
}
