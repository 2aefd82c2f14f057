// SPDX-License-Identifier: Apache-2.0
// plan_groups (issue 24, point 3): vLLM's grouping rule (the group size, the order, the padding) on the built-in
// hybrid shapes, and the native grouping that pads nothing (the gcd of the counts), equal to vLLM's wherever vLLM
// pads nothing; the units grouping (one group per kind, of native units); bad input refused.
#include <kvpager/kvpager.hpp>
#include <kvpager/sizing/hybrid_sizing.hpp>

#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <vector>

using namespace kvpager;

namespace {

using kl = kind_layers<any_group_kind>;

TEST(LayerGrouping, VllmGroupsAndPadsAsItsRuleSays) {
  // Gemma-3-27b: 52 sliding, 10 full: groups of 10 (the rarest count), 6 sliding (the last padded by 8), 1 full.
  const std::vector<kl> gemma3{{sliding_window{1024}, 52}, {full_attention{}, 10}};
  const auto v = plan_groups<any_group_kind>(gemma3, grouping::vllm);
  ASSERT_TRUE(v);
  EXPECT_EQ(v->group_size, 10);
  EXPECT_EQ(v->num_groups(), 7);
  EXPECT_EQ(v->padding_layers, 8);
  for (std::int32_t g = 0; g < 6; ++g) EXPECT_EQ(v->groups[static_cast<std::size_t>(g)], any_group_kind{sliding_window{1024}});
  EXPECT_EQ(v->groups[6], any_group_kind{full_attention{}});
  EXPECT_EQ(v->kind_of_group, (std::vector<std::int32_t>{0, 0, 0, 0, 0, 0, 1}));
  // Native: groups of gcd(52, 10) = 2, no padding.
  const auto n = plan_groups<any_group_kind>(gemma3, grouping::native);
  ASSERT_TRUE(n);
  EXPECT_EQ(n->group_size, 2);
  EXPECT_EQ(n->num_groups(), 31);
  EXPECT_EQ(n->padding_layers, 0);
  // Counts within 1.5x of the largest: vLLM takes the largest (9 and 7 layers: groups of 9, the 7 padded by 2).
  const std::vector<kl> close{{full_attention{}, 9}, {chunked_local{64}, 7}};
  EXPECT_EQ(plan_groups<any_group_kind>(close, grouping::vllm)->group_size, 9);
  EXPECT_EQ(plan_groups<any_group_kind>(close, grouping::vllm)->padding_layers, 2);
  EXPECT_EQ(plan_groups<any_group_kind>(close, grouping::native)->group_size, 1);
  // The built-in shapes where vLLM pads nothing: native forms exactly vLLM's groups.
  for (const hybrid_model& m : builtin_hybrid_models) {
    std::vector<kl> kinds;
    for (std::int32_t i = 0; i < m.num_kinds; ++i) {
      const layer_kind_count& k = m.kinds[static_cast<std::size_t>(i)];
      kinds.push_back({to_group_kind(k.kind, k.size), k.layers});
    }
    const auto a = plan_groups<any_group_kind>(kinds, grouping::vllm);
    const auto b = plan_groups<any_group_kind>(kinds, grouping::native);
    ASSERT_TRUE(a && b) << m.name;
    EXPECT_EQ(b->padding_layers, 0) << m.name;
    std::vector<vllm_kind> vk;
    for (const any_group_kind& k : a->groups) vk.push_back(vllm_kind_of(k));
    EXPECT_TRUE(check_vllm_layout(vk)) << m.name;  // vLLM's grouping gives a layout vLLM's checks accept
    if (a->padding_layers == 0) {
      EXPECT_EQ(a->groups, b->groups) << m.name;
      EXPECT_EQ(a->group_size, b->group_size) << m.name;
    } else {
      EXPECT_STREQ(m.name.data(), "Gemma-3-27b");  // the one built-in shape vLLM pads
    }
  }
}

TEST(LayerGrouping, EveryLayerInExactlyOneGroupOfTheSize) {
  // Random kind counts: the groups cover each kind's layers (native exactly, vLLM with its padding).
  std::mt19937 rng(5);
  for (int round = 0; round < 2000; ++round) {
    std::vector<kl> kinds;
    const int n = 1 + static_cast<int>(rng() % 3);
    for (int i = 0; i < n; ++i)
      kinds.push_back({i == 0 ? any_group_kind{full_attention{}} : any_group_kind{sliding_window{1 + i}},
                       1 + static_cast<std::int32_t>(rng() % 40)});
    for (const grouping how : {grouping::vllm, grouping::native}) {
      const auto p = plan_groups<any_group_kind>(kinds, how, 1 << 20);
      ASSERT_TRUE(p);
      std::vector<std::int64_t> capacity(kinds.size(), 0);
      for (const std::int32_t k : p->kind_of_group) capacity[static_cast<std::size_t>(k)] += p->group_size;
      std::int64_t padding = 0;
      for (std::size_t k = 0; k < kinds.size(); ++k) {
        ASSERT_GE(capacity[k], kinds[k].layers);
        ASSERT_LT(capacity[k] - kinds[k].layers, p->group_size);  // at most one short group per kind
        padding += capacity[k] - kinds[k].layers;
      }
      EXPECT_EQ(padding, p->padding_layers);
      if (how == grouping::native) {
        EXPECT_EQ(p->padding_layers, 0);
      }
    }
  }
}

TEST(LayerGrouping, UnitsGroupingIsOneGroupPerKindOverTheNativeUnits) {
  const std::vector<kl> gemma3{{sliding_window{1024}, 52}, {full_attention{}, 10}};
  const auto u = plan_groups<any_group_kind>(gemma3, grouping::units);
  ASSERT_TRUE(u);
  EXPECT_EQ(u->group_size, 2);  // a unit: 2 layers
  EXPECT_EQ(u->num_groups(), 2);
  EXPECT_EQ(u->units, (std::vector<std::int32_t>{26, 5}));
  EXPECT_EQ(u->kind_of_group, (std::vector<std::int32_t>{0, 1}));
  EXPECT_EQ(u->padding_layers, 0);
  // Every built-in shape: the native grouping's bytes (as many tables), one group per kind, and a hybrid cache
  // takes the plan as it is.
  for (const hybrid_model& m : builtin_hybrid_models) {
    std::vector<kl> kinds;
    for (std::int32_t i = 0; i < m.num_kinds; ++i) {
      const layer_kind_count& k = m.kinds[static_cast<std::size_t>(i)];
      kinds.push_back({to_group_kind(k.kind, k.size), k.layers});
    }
    const auto n = plan_groups<any_group_kind>(kinds, grouping::native);
    const auto p = plan_groups<any_group_kind>(kinds, grouping::units);
    ASSERT_TRUE(n && p) << m.name;
    EXPECT_EQ(p->num_groups(), m.num_kinds) << m.name;
    EXPECT_EQ(p->group_size, n->group_size) << m.name;
    EXPECT_EQ(std::accumulate(p->units.begin(), p->units.end(), 0), n->num_groups()) << m.name;
    EXPECT_EQ(n->units, std::vector<std::int32_t>(n->groups.size(), 1)) << m.name;
    cache_config cfg;
    cfg.num_blocks = 256;
    cfg.reserved_blocks = 1;
    auto c = kv_groups_cache::create(cfg, p->groups, {hybrid_conventions::native, p->units});
    ASSERT_TRUE(c) << m.name << ": " << c.error().message();
    EXPECT_EQ(c->num_tables(), n->num_groups()) << m.name;
  }
  // The tables count against max_groups as native groups do.
  const std::vector<kl> coprime{{full_attention{}, 63}, {sliding_window{8}, 64}};
  EXPECT_EQ(plan_groups<any_group_kind>(coprime, grouping::units).error().code(), errc::invalid_argument);
}

TEST(LayerGrouping, BadInputIsRefused) {
  EXPECT_EQ(plan_groups<any_group_kind>(std::vector<kl>{}, grouping::vllm).error().code(), errc::invalid_argument);
  EXPECT_EQ(plan_groups<any_group_kind>(std::vector<kl>{{full_attention{}, 0}}, grouping::native).error().code(),
            errc::invalid_argument);
  // 63 and 64 layers: gcd 1, 127 groups, more than a cache holds.
  const std::vector<kl> coprime{{full_attention{}, 63}, {sliding_window{8}, 64}};
  EXPECT_EQ(plan_groups<any_group_kind>(coprime, grouping::native).error().code(), errc::invalid_argument);
  EXPECT_TRUE(plan_groups<any_group_kind>(coprime, grouping::vllm));
  // A layer kind's window or chunk below 1 gives a kind that refuses itself, so plan_groups refuses it.
  const std::vector<kl> zero_window{{to_group_kind(layer_attention::sliding_window, 0), 4}};
  EXPECT_EQ(plan_groups<any_group_kind>(zero_window, grouping::native).error().code(), errc::invalid_argument);
  EXPECT_EQ(to_group_kind(layer_attention::chunked_local, 512), any_group_kind{chunked_local{512}});
  EXPECT_EQ(to_group_kind(layer_attention::full, 7), any_group_kind{full_attention{}});
}

}  // namespace
