// SPDX-License-Identifier: Apache-2.0
// Groups of several units (hybrid_kv_cache, hybrid_options::units) end to end through the CPU step executor: one
// layer per table (layer_groups = the table), every step's plan run (swaps, copy-on-write copies of a lead and its
// companions, each naming its table) and every table's K/V written through its own slot mapping. After every step,
// each live sequence's every position that a table still holds reads back exactly the K/V written for that
// token at that position in that table, whoever wrote it (a prefix hit, a fork's shared block, a swap-in).

#include <kvpager/kvpager.hpp>
#include <kvpager/kernels/step_executor.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <vector>

using namespace kvpager;

namespace {

using cache_type = hybrid_kv_cache<any_group_kind, free_list_allocator, lru_eviction, prefix_caching, host_swap>;

float read(host_kv_pools& p, std::int32_t layer, block_id b, std::int32_t kv, std::int32_t pos) {
  float x = 0;
  std::memcpy(&x, p.device_bytes(layer).data() + p.layout().offset(b, kv, 0, pos), sizeof x);
  return x;
}

TEST(HybridUnitsBytes, EveryTablesBytesSurviveSwapsCopiesAndHits) {
  constexpr std::int32_t bs = 8, dim = 64, blocks = 240, host = 160;
  const std::vector<any_group_kind> kinds{full_attention{}, sliding_window{12}};
  const std::vector<std::int32_t> units{2, 3};
  cache_config cfg;
  cfg.block_size = bs;
  cfg.num_blocks = blocks;
  cfg.reserved_blocks = 1;
  cfg.num_host_blocks = host;
  auto c = std::move(*cache_type::create(cfg, kinds, {hybrid_conventions::native, units}));
  const std::int32_t tables = c.num_tables();
  ASSERT_EQ(tables, 5);
  std::vector<std::int32_t> layer_table(static_cast<std::size_t>(tables));
  for (std::int32_t t = 0; t < tables; ++t) layer_table[static_cast<std::size_t>(t)] = t;
  kv_geometry geom;
  geom.num_blocks = blocks;
  geom.block_size = bs;
  geom.num_kv_heads = 1;
  geom.head_dim = dim;
  geom.dtype = kv_dtype::f32;
  auto pools_r = host_kv_pools::create(geom, host, tables, layer_table);
  ASSERT_TRUE(pools_r) << pools_r.error().message();
  host_kv_pools& pools = *pools_r;

  std::mt19937 rng(11);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  std::map<seq_id, std::vector<token_id>> toks;  // every sequence ever admitted: its tokens (kept after a free)
  std::vector<seq_id> live;
  seq_id next = 0;
  std::int64_t swaps = 0, copies = 0, hits = 0, checked = 0;
  std::vector<std::int64_t> slots;
  std::vector<float> k, v;
  for (int step = 0; step < 3000; ++step) {
    c.begin_step();
    for (int n = 1 + pick(3); n-- > 0;) {
      const int what = pick(10);
      if (what < 3 || live.empty()) {
        std::vector<token_id> t;
        for (std::int32_t i = 0; i < bs * (1 + pick(2)); ++i) t.push_back(7 + i);  // shared prefixes: hits
        for (std::int32_t i = 1 + pick(9); i-- > 0;) t.push_back(1000 + 100 * static_cast<token_id>(next) + i);
        prefix_match m;
        if (c.add_sequence(next, t, {}, &m)) {
          live.push_back(next);
          toks[next] = t;
          hits += m.blocks;
        }
        ++next;
      } else if (what < 6) {
        const seq_id id = live[static_cast<std::size_t>(pick(static_cast<int>(live.size())))];
        const token_id x = 50 + static_cast<token_id>(pick(900));
        if (!c.is_swapped(id) && c.append_token(id, x)) toks[id].push_back(x);
      } else if (what < 7) {
        const seq_id parent = live[static_cast<std::size_t>(pick(static_cast<int>(live.size())))];
        if (!c.is_swapped(parent) && c.fork(parent, next)) {
          live.push_back(next);
          toks[next] = toks[parent];
        }
        ++next;
      } else if (what < 8) {
        const seq_id id = live[static_cast<std::size_t>(pick(static_cast<int>(live.size())))];
        if (c.is_swapped(id) ? c.swap_in(id) : c.swap_out(id)) ++swaps;
      } else {
        const std::size_t i = static_cast<std::size_t>(pick(static_cast<int>(live.size())));
        ASSERT_TRUE(c.free_sequence(live[i]));
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
    // The step: the plan, then each table's K/V through its slot mapping (K = token x 8 + table, V = position).
    copies += static_cast<std::int64_t>(c.plan().copies().size());
    ASSERT_TRUE(pools.executor().run_plan(c.plan()));
    const std::int64_t n = c.plan().num_append_tokens();
    slots.resize(static_cast<std::size_t>(n));
    for (std::int32_t t = 0; t < tables; ++t) {
      ASSERT_TRUE(c.export_slot_mapping(t, slots));
      k.clear();
      v.clear();
      for (const token_range& r : c.plan().appends())
        for (std::int32_t p = r.first_pos; p < r.first_pos + r.count; ++p) {
          const token_id tok = toks.at(r.seq)[static_cast<std::size_t>(p)];
          for (std::int32_t d = 0; d < dim; ++d) {
            k.push_back(static_cast<float>(tok * 8 + t));
            v.push_back(static_cast<float>(p));
          }
        }
      ASSERT_TRUE(pools.executor().append(t, slots, k.data(), v.data()));
    }
    for (const seq_id id : live) {
      if (c.is_swapped(id)) continue;
      const std::vector<token_id>& tk = toks.at(id);
      for (std::int32_t t = 0; t < tables; ++t) {
        const auto bt = c.block_table(t, id);
        ASSERT_TRUE(bt);
        for (std::int32_t p = 0; p < static_cast<std::int32_t>(tk.size()); ++p) {
          const block_id b = (*bt)[static_cast<std::size_t>(p / bs)];
          if (b == cache_type::null_block) continue;
          ASSERT_EQ(read(pools, t, b, 0, p % bs), static_cast<float>(tk[static_cast<std::size_t>(p)] * 8 + t))
              << "step " << step << " seq " << id << " table " << t << " pos " << p;
          ASSERT_EQ(read(pools, t, b, 1, p % bs), static_cast<float>(p));
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(swaps, 20);
  EXPECT_GT(copies, 20);
  EXPECT_GT(hits, 20) << "admitted " << next << " live " << live.size();
  EXPECT_GT(checked, 10000);
}

}  // namespace
