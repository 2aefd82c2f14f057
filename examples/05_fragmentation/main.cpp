// SPDX-License-Identifier: Apache-2.0
// The seed's fragmentation comparison (3.3.1, MemoryFragmentationSimulator), done in consistent units.
//
// Units. Every figure here is in token slots or bytes, never both mixed: one token's K and V in one layer of
// Llama-2-7B in fp16 is 2 x 32 heads x 128 dims x 2 bytes = 16 KiB (kvpager::kv_bytes_per_token_per_layer), the
// seed's "16KB per token"; a slot is one token's KV, and bytes are slots x 16 KiB (per layer) or x 512 KiB (all 32
// layers). The seed's simulator does not do this: its contiguous pool is one list cell per *MB* (20480 cells) while
// a request's need is counted in *KB* (2048 tokens x 16 = 32768 cells), so a 32 MiB reservation looks like 32 GiB,
// none of its five requests fits, and it prints 0.0% utilization, 0 internal waste and 163840 "MB" of external
// waste (really KiB: 160 MiB); its paged simulator does convert (20480 MB x 1024 / 256 KB = 81920 pages) and
// prints 186 pages, 0.2%. Part 2 prints what the seed printed beside the right figures.
//
// How contiguous allocation is computed with the library: a request that reserves max_model_len = 2048 token
// slots in one contiguous range is a paged_kv_cache whose block size is 2048 (one block = one reservation). With
// one reservation size for all requests, first fit over a byte range places every reservation at a multiple of
// 2048 slots, so it is exactly this pool of 2048-slot blocks. The paged cache is the same pool cut into 16-token
// blocks. Both caches count slots held (block-table lengths x block size) and tokens stored; internal waste is
// their difference (cache_stats::internal_waste_tokens). Exits non-zero if any figure differs from the seed's.
#include <kvpager/kvpager.hpp>

#include <cstdint>
#include <cstdio>
#include <span>

#include "common/check.hpp"

namespace {
using example::check;
using example::check_percent;
using example::check_that;
using example::succeeded;

constexpr std::int32_t max_model_len = 2048;  // the seed's max_tokens: every contiguous request reserves this
constexpr std::int32_t page = 16;             // the seed's page_size_tokens, vLLM's default block size
constexpr std::int32_t lengths[] = {300, 800, 150, 1200, 500};  // the seed's five requests (actual tokens)
constexpr std::int64_t KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB;

// A cache that holds exactly what one allocation scheme holds: contiguous = 2048-slot blocks, paged = 16-slot.
using cache_t = kvpager::paged_kv_cache<kvpager::lowest_id_allocator>;

kvpager::result<cache_t> pool_of(std::int64_t slots, std::int32_t block) {
  return cache_t::create({.block_size = block, .num_blocks = static_cast<std::int32_t>(slots / block)});
}

// Admits the five requests (ids 1..5) and returns the stats.
kvpager::cache_stats admit_five(cache_t& cache) {
  for (std::int32_t i = 0; i < 5; ++i) (void)succeeded(cache.add_sequence(kvpager::seq_id(i + 1), lengths[i]), "add_sequence");
  return cache.stats();
}

// 1. The prose: "2048 tokens preallocated, 512 generated on average: 75% wasted; 32MB of which 24MB idle".
void prose(std::int64_t token_layer_bytes) {
  std::printf("1. One request preallocated %d tokens that generates 512 (the seed's prose), per layer:\n",
              max_model_len);
  auto contiguous = pool_of(max_model_len, max_model_len);
  auto paged = pool_of(max_model_len, page);
  if (!succeeded(contiguous, "create") || !succeeded(paged, "create")) return;
  (void)succeeded(contiguous->add_sequence(1, 512), "add_sequence");
  (void)succeeded(paged->add_sequence(1, 512), "add_sequence");
  const kvpager::cache_stats c = contiguous->stats(), p = paged->stats();
  check("contiguous: bytes reserved (MiB)", c.logical * c.block_size * token_layer_bytes / MiB, 32);
  check("contiguous: bytes idle (MiB)", c.internal_waste_tokens() * token_layer_bytes / MiB, 24);
  check_percent("contiguous: internal waste", double(c.internal_waste_tokens()) / double(c.logical * c.block_size),
                75.0, 1);
  check("paged: slots held (32 blocks of 16)", p.logical * p.block_size, 512);
  check("paged: slots idle (at most one partial block: < 16)", p.internal_waste_tokens(), 0);
}

// 2. The seed's demo: five requests of 300, 800, 150, 1200 and 500 tokens in the seed's 20480 MB pool.
void five_requests(std::int64_t token_layer_bytes) {
  // The seed's pool is 20480 MB at 16 KB per token: 1,310,720 slots (one layer's KV, as the seed's 16 KB is).
  const std::int64_t pool_slots = 20480 * MiB / token_layer_bytes;
  std::printf("\n2. The seed's five requests (300, 800, 150, 1200, 500 tokens; max %d) in its 20480 MiB pool\n"
              "   = %lld token slots at 16 KiB per token per layer:\n",
              max_model_len, static_cast<long long>(pool_slots));
  auto contiguous = pool_of(pool_slots, max_model_len);
  auto paged = pool_of(pool_slots, page);
  if (!succeeded(contiguous, "create") || !succeeded(paged, "create")) return;
  const kvpager::cache_stats c = admit_five(*contiguous), p = admit_five(*paged);

  check("contiguous: tokens stored", c.tokens, 2950);
  check("paged: tokens stored", p.tokens, 2950);
  check("contiguous: requests admitted", c.sequences, 5);
  check("contiguous: token slots reserved", c.logical * c.block_size, 10240);
  check("contiguous: slots reserved but unused", c.internal_waste_tokens(), 7290);
  check_percent("contiguous: internal waste", double(c.internal_waste_tokens()) / double(c.logical * c.block_size),
                71.2, 1);
  check("contiguous: MiB reserved per layer", c.logical * c.block_size * token_layer_bytes / MiB, 160);
  check("paged: requests admitted", p.sequences, 5);
  check("paged: blocks of 16 tokens", p.used, 186);
  check("paged: token slots held", p.logical * p.block_size, 2976);
  check("paged: slots held but unused", p.internal_waste_tokens(), 26);
  check_percent("paged: internal waste", double(p.internal_waste_tokens()) / double(p.logical * p.block_size), 0.87,
                2);
  // At most one partly filled block per sequence: each table's slots exceed its tokens by less than a block.
  std::int32_t partial = 0;
  bool at_most_one = true;
  for (kvpager::seq_id id = 1; id <= 5; ++id) {
    const auto table = paged->block_table(id);
    const auto tokens = paged->num_tokens(id);
    if (!succeeded(table, "block_table") || !succeeded(tokens, "num_tokens")) return;
    const std::int64_t idle = static_cast<std::int64_t>(table->size()) * page - *tokens;
    at_most_one = at_most_one && idle < page;
    partial += idle > 0 ? 1 : 0;
  }
  check_that(at_most_one, "every paged sequence has at most one partly filled block (fewer than 16 idle slots)");
  check("paged: partly filled blocks (300, 150 and 500 tokens)", partial, 3);

  // What the seed printed: its contiguous pass compares 32768 KB-cells with 20480 MB-cells, so nothing fits.
  const std::int64_t seed_need = std::int64_t{max_model_len} * 16;  // "needed = max_tokens * kv_per_token_kb"
  const std::int64_t seed_cells = 20480;                            // "memory = [0] * total_memory_mb"
  const std::int64_t seed_pages = 20480 * 1024 / (page * 16);
  std::printf("   the seed printed (units mixed): contiguous utilization=%.1f%%, internal waste=0MB, external "
              "waste=%lldMB; PagedAttention utilization=%.1f%%, %lld pages\n",
              seed_need > seed_cells ? 0.0 : 100.0, static_cast<long long>(seed_need > seed_cells ? 5 * seed_need : 0),
              100.0 * double(p.used) / double(seed_pages), static_cast<long long>(p.used));
  check_that(seed_need > seed_cells, "the seed's contiguous pass fits none: it needs 32768 cells of a 20480-cell pool");
  check("the seed's 'external waste' (KiB, printed as MB)", 5 * seed_need, 160 * KiB);
}

// 3. What the waste costs: a 20 GiB KV pool for all 32 layers of Llama-2-7B, the five requests arriving over and
// over (FCFS: admission stops at the first request that does not fit). Contiguous fits 20 requests (20 GiB / 1 GiB
// per 2048-token reservation); paged fits 68 (13 rounds of 186 blocks, then 300, 800 and 150; 1200 does not fit
// the 63 blocks left). The token states stored are 28.8% of the KV memory against 96.7%: the vLLM paper's 20.4-38.2%
// for existing systems against ~96% for paged allocation.
void batch_capacity(const kvpager::model_shape& model) {
  const std::int64_t pool_bytes = 20 * GiB;
  const auto block_bytes = kvpager::kv_block_bytes(model, 2, page);
  const auto reservation_bytes = kvpager::kv_block_bytes(model, 2, max_model_len);
  if (!succeeded(block_bytes, "kv_block_bytes") || !succeeded(reservation_bytes, "kv_block_bytes")) return;
  const auto blocks = kvpager::blocks_for_budget(pool_bytes, *block_bytes);
  const auto reservations = kvpager::blocks_for_budget(pool_bytes, *reservation_bytes);
  if (!succeeded(blocks, "blocks_for_budget") || !succeeded(reservations, "blocks_for_budget")) return;
  std::printf("\n3. A 20 GiB KV pool for all 32 layers (512 KiB per token), the five requests arriving again and "
              "again:\n");
  check("paged: blocks of 16 tokens (8 MiB each)", *blocks, 2560);
  check("contiguous: reservations of 2048 tokens (1 GiB each)", *reservations, 20);
  auto contiguous = cache_t::create({.block_size = max_model_len, .num_blocks = static_cast<std::int32_t>(*reservations)});
  auto paged = cache_t::create({.block_size = page, .num_blocks = static_cast<std::int32_t>(*blocks)});
  if (!succeeded(contiguous, "create") || !succeeded(paged, "create")) return;
  const auto admit_all = [](cache_t& cache) {
    for (kvpager::seq_id id = 0;; ++id)
      if (!cache.add_sequence(id, lengths[id % 5])) return cache.stats();
  };
  const kvpager::cache_stats c = admit_all(*contiguous), p = admit_all(*paged);
  check("contiguous: requests running at once", c.sequences, 20);
  check("paged: requests running at once", p.sequences, 68);
  check_percent("contiguous: KV memory holding token states", double(c.tokens) / double(c.total * c.block_size), 28.8,
                1);
  check_percent("paged: KV memory holding token states", double(p.tokens) / double(p.total * p.block_size), 96.7, 1);
}

// 4. External fragmentation (the seed's prose: 100 MB free in 10 MB pieces cannot serve a 32 MB request). Per
// layer, a 200 MiB pool (800 blocks of 256 KiB) holds twenty 10 MiB requests (640 tokens, 40 blocks each); every
// other one finishes. 100 MiB is free, but the largest free run of blocks is 10 MiB: a contiguous allocator cannot
// place a 2048-token (32 MiB) request. The paged cache takes its 128 blocks from four of the holes.
void external_fragmentation(std::int64_t token_layer_bytes) {
  std::printf("\n4. External fragmentation: 100 MiB free in ten 10 MiB holes, a 32 MiB request (per layer):\n");
  const std::int64_t block_bytes = page * token_layer_bytes;
  auto created = cache_t::create({.block_size = page, .num_blocks = static_cast<std::int32_t>(200 * MiB / block_bytes)});
  if (!succeeded(created, "create")) return;
  cache_t& cache = *created;
  const std::int32_t ten_mib = static_cast<std::int32_t>(10 * MiB / token_layer_bytes);  // 640 tokens
  for (kvpager::seq_id id = 0; id < 20; ++id) (void)succeeded(cache.add_sequence(id, ten_mib), "add_sequence");
  cache.begin_step();
  for (kvpager::seq_id id = 0; id < 20; id += 2) (void)succeeded(cache.free_sequence(id), "free_sequence");
  cache.begin_step();
  std::int32_t longest = 0;
  for (std::int32_t b = 0, run = 0; b < cache.stats().total; ++b) {
    run = cache.is_free(b) ? run + 1 : 0;
    longest = run > longest ? run : longest;
  }
  check("free MiB", std::int64_t{cache.stats().free} * block_bytes / MiB, 100);
  check("largest contiguous free run (MiB)", std::int64_t{longest} * block_bytes / MiB, 10);
  const std::int32_t request = static_cast<std::int32_t>(32 * MiB / token_layer_bytes);
  check_that(std::int64_t{request} > std::int64_t{longest} * page,
             "a contiguous allocator has no room for the 2048-token request");
  if (!succeeded(cache.add_sequence(100, request), "add_sequence(2048 tokens)")) return;
  const auto table = cache.block_table(100);
  if (!succeeded(table, "block_table")) return;
  std::int32_t runs = 0;
  for (std::size_t i = 0; i < table->size(); ++i) runs += i == 0 || (*table)[i] != (*table)[i - 1] + 1 ? 1 : 0;
  check("paged: blocks taken for it", static_cast<std::int64_t>(table->size()), 128);
  check("paged: separate holes its block table spans", runs, 4);
}
}  // namespace

int main() {
  const auto model = kvpager::find_model("Llama-2-7B");
  if (!succeeded(model, "find_model")) return example::exit_code();
  const auto per_layer = kvpager::kv_bytes_per_token_per_layer(*model, 2);
  if (!succeeded(per_layer, "kv_bytes_per_token_per_layer")) return example::exit_code();
  std::printf("KV of one token in one layer of %.*s, fp16:\n", static_cast<int>(model->name.size()),
              model->name.data());
  check("bytes (the seed's 16 KB)", *per_layer, 16 * KiB);
  prose(*per_layer);
  five_requests(*per_layer);
  batch_capacity(*model);
  external_fragmentation(*per_layer);
  return example::exit_code();
}
