// SPDX-License-Identifier: Apache-2.0
// One engine step, end to end on the host side: prefill, decode, a fork whose child writes into a shared block
// (copy-on-write), then the kernel-facing exports an engine hands to copy_blocks, kv_append and paged attention.
#include <kvpager/kvpager.hpp>

#include <cstdio>
#include <vector>

int main() {
  auto created = kvpager::paged_kv_cache<>::create({.block_size = 16, .num_blocks = 64, .reserved_blocks = 1});
  if (!created) return 1;
  auto& cache = *created;

  // Step 1: two prompts (prefill).
  cache.begin_step();
  if (!cache.add_sequence(100, 40) || !cache.add_sequence(200, 16)) return 1;
  std::printf("step 1: prefill of 40 + 16 tokens -> %lld slots to write, %d blocks in use\n",
              static_cast<long long>(cache.slot_mapping_size()), cache.stats().used);

  // Step 2: sampling two continuations of sequence 100 (n = 2): fork it, then decode one token for everyone.
  cache.begin_step();
  if (!cache.fork(100, 101)) return 1;
  for (const kvpager::seq_id id : {kvpager::seq_id{100}, kvpager::seq_id{101}, kvpager::seq_id{200}})
    if (auto st = cache.append_tokens(id); !st) {
      std::printf("append failed: %s\n", st.message());
      return 1;
    }
  for (const kvpager::block_copy& c : cache.plan().copies())
    std::printf("step 2: copy-on-write: copy block %d -> %d before writing\n", c.src, c.dst);

  // The engine now runs the plan: copies first, then KV writes through the slot mapping, then attention.
  std::vector<std::int64_t> slots(static_cast<std::size_t>(cache.slot_mapping_size()));
  if (!cache.export_slot_mapping(slots)) return 1;
  std::printf("step 2: slot mapping:");
  for (std::int64_t s : slots) std::printf(" %lld", static_cast<long long>(s));
  std::printf("\n");

  const std::vector<kvpager::seq_id> batch = {100, 101, 200};
  constexpr std::int32_t max_blocks = 4;
  std::vector<std::int32_t> table(batch.size() * max_blocks), seq_lens(batch.size());
  if (!cache.export_block_table(batch, table, max_blocks, seq_lens)) return 1;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    std::printf("step 2: seq %llu len %d blocks:", static_cast<unsigned long long>(batch[i]), seq_lens[i]);
    for (std::int32_t j = 0; j < max_blocks; ++j) std::printf(" %d", table[i * max_blocks + static_cast<std::size_t>(j)]);
    std::printf("\n");
  }

  const auto s = cache.stats();
  std::printf("stats: used %d, logical %lld, shared %d, cow copies %lld, free %d of %d\n", s.used,
              static_cast<long long>(s.logical), s.shared, static_cast<long long>(s.cow_copies), s.free, s.total);
  return 0;
}
