// SPDX-License-Identifier: Apache-2.0
// step_executor: a step's plan over every layer's pools through the shipped block-move kernels, checked against the
// memcpy model of those kernels (kvpager_testing::memcpy_executor), its errors (nothing moved), and an engine step
// from the scheduler's step_output alone: plan, appends, then decode and prefill attention over the step's tables,
// equal to the same attention over tables exported from the cache by hand.
#include <kvpager/kernels/block_moves.hpp>
#include <kvpager/kernels/prefill.hpp>
#include <kvpager/kvpager.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "kvpager_testing/memcpy_executor.hpp"

using namespace kvpager;

namespace {

/// Fills every pool byte of every layer with a pattern that differs per layer.
void fill(host_kv_pools& p, std::int32_t layers, std::uint32_t seed) {
  std::mt19937 rng(seed);
  for (std::int32_t l = 0; l < layers; ++l) {
    for (std::byte& b : p.device_bytes(l)) b = static_cast<std::byte>(rng());
    for (std::byte& b : p.host_bytes(l)) b = static_cast<std::byte>(rng());
  }
}

struct bytes_of {
  std::vector<std::vector<std::byte>> device, host;
  friend bool operator==(const bytes_of&, const bytes_of&) = default;
};
bytes_of snapshot(host_kv_pools& p, std::int32_t layers) {
  bytes_of s;
  for (std::int32_t l = 0; l < layers; ++l) {
    s.device.emplace_back(p.device_bytes(l).begin(), p.device_bytes(l).end());
    s.host.emplace_back(p.host_bytes(l).begin(), p.host_bytes(l).end());
  }
  return s;
}

constexpr kv_geometry geom{12, 16, 2, 64, kv_dtype::f16};

step_plan mixed_plan() {
  step_plan plan;
  plan.add_swap_out({3, 0});
  plan.add_swap_out({4, 1});  // a run of two
  plan.add_swap_out({9, 5});
  plan.add_swap_in({6, 2});
  plan.add_swap_in({7, 3});
  plan.add_copy({1, 10});
  plan.add_copy({2, 11});
  return plan;
}

}  // namespace

TEST(StepExecutor, PlanOnEveryLayerEqualsTheMemcpyModel) {
  constexpr std::int32_t layers = 3;
  auto pools = host_kv_pools::create(geom, 6, layers);
  ASSERT_TRUE(pools.ok()) << pools.error().message();
  fill(*pools, layers, 7);
  std::vector<kvpager_testing::memcpy_executor> model;
  for (std::int32_t l = 0; l < layers; ++l) {
    model.emplace_back(geom, 6);
    std::memcpy(model.back().device_bytes().data(), pools->device_bytes(l).data(), pools->device_bytes(l).size());
    std::memcpy(model.back().host_bytes().data(), pools->host_bytes(l).data(), pools->host_bytes(l).size());
  }
  const step_plan plan = mixed_plan();
  ASSERT_TRUE(pools->executor().run_plan(plan));
  const std::vector<std::int64_t> slots = {5, -1, 17, 190};
  std::vector<std::uint16_t> k(slots.size() * 2 * 64), v(k.size());
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = static_cast<std::uint16_t>(i * 7 + 1), v[i] = static_cast<std::uint16_t>(i * 3);
  for (std::int32_t l = 0; l < layers; ++l) {
    ASSERT_TRUE(pools->executor().append(l, slots, k.data(), v.data()));
    ASSERT_TRUE(model[static_cast<std::size_t>(l)].execute(plan, slots, std::as_bytes(std::span(k)),
                                                           std::as_bytes(std::span(v))));
    const auto want_d = model[static_cast<std::size_t>(l)].device_bytes();
    const auto want_h = model[static_cast<std::size_t>(l)].host_bytes();
    EXPECT_TRUE(std::equal(want_d.begin(), want_d.end(), pools->device_bytes(l).begin())) << "layer " << l;
    EXPECT_TRUE(std::equal(want_h.begin(), want_h.end(), pools->host_bytes(l).begin())) << "layer " << l;
  }
}

TEST(StepExecutor, WithLayerGroupsEachEntryMovesOnlyItsGroupsLayers) {
  // Layers 0, 2 in group 0, layers 1, 3 in group 1, layer 4 in group 3 (group 2 has no layer): each layer's bytes
  // equal the memcpy model run on the plan's entries of the layer's group alone.
  constexpr std::int32_t layers = 5;
  const std::vector<std::int32_t> groups{0, 1, 0, 1, 3};
  auto pools = host_kv_pools::create(geom, 6, layers, groups);
  ASSERT_TRUE(pools.ok()) << pools.error().message();
  fill(*pools, layers, 17);
  step_plan plan;
  plan.add_swap_out({3, 0, 0});
  plan.add_swap_out({4, 1, 1});
  plan.add_swap_out({9, 5, 3});
  plan.add_swap_in({6, 2, 1});
  plan.add_swap_in({7, 3, 0});
  plan.add_copy({1, 10, 0});
  plan.add_copy({2, 11, 1});
  plan.add_copy({5, 8, 3});
  std::vector<kvpager_testing::memcpy_executor> model;
  for (std::int32_t l = 0; l < layers; ++l) {
    model.emplace_back(geom, 6);
    std::memcpy(model.back().device_bytes().data(), pools->device_bytes(l).data(), pools->device_bytes(l).size());
    std::memcpy(model.back().host_bytes().data(), pools->host_bytes(l).data(), pools->host_bytes(l).size());
  }
  ASSERT_TRUE(pools->executor().run_plan(plan));
  for (std::int32_t l = 0; l < layers; ++l) {
    const std::int32_t g = groups[static_cast<std::size_t>(l)];
    step_plan mine;
    for (const block_swap& w : plan.swap_outs())
      if (w.group == g) mine.add_swap_out(w);
    for (const block_swap& w : plan.swap_ins())
      if (w.group == g) mine.add_swap_in(w);
    for (const block_copy& c : plan.copies())
      if (c.group == g) mine.add_copy(c);
    ASSERT_TRUE(model[static_cast<std::size_t>(l)].execute(mine, {}, {}, {}));
    const auto want_d = model[static_cast<std::size_t>(l)].device_bytes();
    const auto want_h = model[static_cast<std::size_t>(l)].host_bytes();
    EXPECT_TRUE(std::equal(want_d.begin(), want_d.end(), pools->device_bytes(l).begin())) << "layer " << l;
    EXPECT_TRUE(std::equal(want_h.begin(), want_h.end(), pools->host_bytes(l).begin())) << "layer " << l;
  }
  // An entry naming a group no layer has, or a bad layer_groups: refused, nothing moved.
  const bytes_of before = snapshot(*pools, layers);
  step_plan stray = plan;
  stray.add_copy({0, 9, 2});
  EXPECT_EQ(pools->executor().run_plan(stray).code(), errc::invalid_block);
  step_plan stray_swap = plan;
  stray_swap.add_swap_in({0, 4, 7});
  EXPECT_EQ(pools->executor().run_plan(stray_swap).code(), errc::invalid_block);
  EXPECT_TRUE(snapshot(*pools, layers) == before);
  const std::vector<std::int32_t> short_groups{0, 1};
  const std::vector<std::int32_t> bad_group{0, 64, 0, 0, 0};
  EXPECT_EQ(host_kv_pools::create(geom, 6, layers, short_groups).code(), errc::invalid_argument);
  EXPECT_EQ(host_kv_pools::create(geom, 6, layers, bad_group).code(), errc::invalid_argument);
}

TEST(StepExecutor, BadPlansAndAppendsMoveNothing) {
  constexpr std::int32_t layers = 2;
  auto pools = host_kv_pools::create(geom, 6, layers);
  ASSERT_TRUE(pools.ok());
  fill(*pools, layers, 11);
  const bytes_of before = snapshot(*pools, layers);
  // Each bad plan is valid up to its last entry, so a check after the first move would leave bytes moved.
  auto bad = [](auto add_bad) {
    step_plan p = mixed_plan();
    add_bad(p);
    return p;
  };
  const step_plan plans[] = {
      bad([](step_plan& p) { p.add_copy({1, 12}); }),      // copy past the device pool
      bad([](step_plan& p) { p.add_copy({-1, 8}); }),      // negative source
      bad([](step_plan& p) { p.add_swap_in({8, 6}); }),    // host block past the host pool
      bad([](step_plan& p) { p.add_swap_out({12, 4}); }),  // device block past the pool
  };
  for (const step_plan& p : plans) EXPECT_EQ(pools->executor().run_plan(p).code(), errc::invalid_block);
  EXPECT_TRUE(snapshot(*pools, layers) == before);

  const std::vector<std::int64_t> slots = {0, 12 * 16};  // the second is one past the last slot
  std::vector<std::uint16_t> k(slots.size() * 2 * 64, 1), v(k.size(), 2);
  EXPECT_EQ(pools->executor().append(0, slots, k.data(), v.data()).code(), errc::invalid_block);
  EXPECT_EQ(pools->executor().append(2, slots, k.data(), v.data()).code(), errc::invalid_argument);
  EXPECT_EQ(pools->executor().append(-1, slots, k.data(), v.data()).code(), errc::invalid_argument);
  // host_kv_pools::execute checks the slots before it runs the plan: a good plan with a bad slot moves nothing.
  EXPECT_EQ(pools->execute(mixed_plan(), slots, std::as_bytes(std::span(k)), std::as_bytes(std::span(v))).code(),
            errc::invalid_block);
  EXPECT_EQ(pools->execute(mixed_plan(), std::span(slots).first(1), std::as_bytes(std::span(k)).first(8),
                           std::as_bytes(std::span(v)))
                .code(),
            errc::buffer_too_small);
  EXPECT_TRUE(snapshot(*pools, layers) == before);
}

TEST(StepExecutor, SwapsNeedHostPools) {
  auto pools = host_kv_pools::create(geom, 0, 2);
  ASSERT_TRUE(pools.ok());
  step_plan p;
  p.add_swap_out({1, 0});
  EXPECT_EQ(pools->executor().run_plan(p).code(), errc::invalid_block);
  EXPECT_TRUE(pools->host_bytes(0).empty());
  step_plan copies;
  copies.add_copy({1, 2});
  EXPECT_TRUE(pools->executor().run_plan(copies));
}

TEST(StepExecutor, CreateChecksThePools) {
  std::vector<std::byte> a(static_cast<std::size_t>(block_bytes(geom)) * 12), b(a.size()), h(a.size());
  void* const two[] = {a.data(), b.data()};
  void* const one_null[] = {a.data(), nullptr};
  void* const host_one[] = {h.data()};
  EXPECT_TRUE(step_executor::create({geom, 0, two, {}}));
  EXPECT_EQ(step_executor::create({geom, 0, {}, {}}).code(), errc::invalid_argument);
  EXPECT_EQ(step_executor::create({geom, 0, one_null, {}}).code(), errc::invalid_argument);
  EXPECT_EQ(step_executor::create({geom, 12, two, host_one}).code(), errc::invalid_argument);  // one host pool for two layers
  EXPECT_EQ(step_executor::create({geom, 0, two, host_one}).code(), errc::invalid_argument);   // host pools without blocks
  EXPECT_EQ(step_executor::create({geom, -1, two, {}}).code(), errc::invalid_argument);
  EXPECT_EQ(step_executor::create({kv_geometry{12, 4, 2, 64, kv_dtype::f16}, 0, two, {}}).code(), errc::unsupported);
  EXPECT_EQ(host_kv_pools::create(geom, 0, 0).code(), errc::invalid_argument);
  EXPECT_EQ(host_kv_pools::create(kv_geometry{12, 16, 2, 60, kv_dtype::f16}, 0).code(), errc::unsupported);
  // A host pool whose size overflows int64 is refused before anything is allocated (2^36-byte blocks x 2^30).
  EXPECT_EQ(host_kv_pools::create(kv_geometry{1, 32, 1 << 20, 256, kv_dtype::f32}, 1 << 30).code(),
            errc::invalid_argument);
  const auto e = step_executor::create({geom, 0, two, {}});
  EXPECT_EQ(e->num_layers(), 2);
  EXPECT_EQ(e->view(1).data, b.data());
  EXPECT_EQ(e->view(1).geometry(), geom);
}

TEST(StepExecutor, Fp8AppendQuantizesWithTheLayersScales) {
  const kv_geometry g{4, 16, 1, 64, kv_dtype::fp8_e4m3};
  auto pools = host_kv_pools::create(g, 0, 2);
  ASSERT_TRUE(pools.ok());
  std::vector<std::byte> want(pools->device_bytes(1).size());
  const std::vector<std::int64_t> slots = {3, 40};
  std::vector<float> k(slots.size() * 64), v(k.size());
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = 0.01F * static_cast<float>(i), v[i] = -0.02F * static_cast<float>(i);
  ASSERT_EQ(kvpager_cpu_kv_append_fp8(want.data(), k.data(), v.data(), slots.data(), 2, 1, 64, 16, 4,
                                      KVPAGER_DTYPE_FP32, 0.5F, 2.0F),
            KVPAGER_STATUS_OK);
  ASSERT_TRUE(pools->executor().append(1, slots, k.data(), v.data(), {KVPAGER_DTYPE_FP32, 0.5F, 2.0F}));
  EXPECT_TRUE(std::equal(want.begin(), want.end(), pools->device_bytes(1).begin()));
  EXPECT_EQ(pools->executor().append(1, slots, k.data(), v.data(), {KVPAGER_DTYPE_FP32, 0.0F, 2.0F}).code(),
            errc::invalid_argument);
}

TEST(StepExecutor, AnEngineStepFromTheStepOutputAlone) {
  // A decode batch and a prefill chunk in one step (chunked prefill), over two layers; attention over the step's
  // tables must equal attention over tables the test exports from the cache itself.
  constexpr std::int32_t layers = 2, q_heads = 4;
  const kv_geometry g{64, 16, 2, 64, kv_dtype::f32};
  auto cache = vllm_v1_cache::create(cache_config_for(g, {.reserved_blocks = 1}), can_implement);
  ASSERT_TRUE(cache.ok()) << cache.error().message();
  auto pools = host_kv_pools::create(cache->geometry(), 0, layers);
  ASSERT_TRUE(pools.ok());
  scheduler_config cfg;
  cfg.max_num_batched_tokens = 40;
  scheduler<vllm_v1_cache> sched(*cache, cfg);
  std::vector<token_id> p1(37), p2(70);
  for (std::size_t i = 0; i < p1.size(); ++i) p1[i] = static_cast<token_id>(i + 1);
  for (std::size_t i = 0; i < p2.size(); ++i) p2[i] = static_cast<token_id>(1000 + i);
  ASSERT_TRUE(sched.add_request(1, p1));
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  bool saw_mixed = false;
  for (int step = 0; step < 6; ++step) {
    if (step == 1) {
      ASSERT_TRUE(sched.add_request(2, p2));
    }
    const step_output& out = sched.schedule();
    ASSERT_TRUE(out.error.ok());
    const std::int64_t n = out.num_tokens();
    ASSERT_EQ(static_cast<std::int64_t>(out.input_ids.size()), n);
    ASSERT_EQ(static_cast<std::int64_t>(out.positions.size()), n);
    ASSERT_EQ(out.query_start_loc.size(), out.scheduled.size() + 1);
    ASSERT_EQ(out.decode.rows() + out.prefill.rows(), out.scheduled.size());
    saw_mixed = saw_mixed || (!out.decode.empty() && !out.prefill.empty());
    for (std::size_t i = 0; i < out.scheduled.size(); ++i) {
      const scheduled_sequence& e = out.scheduled[i];
      for (std::int32_t j = 0; j < e.num_tokens; ++j) {
        const auto t = static_cast<std::size_t>(out.query_start_loc[i] + j);
        EXPECT_EQ(out.positions[t], e.start + j);
        EXPECT_EQ(out.input_ids[t], sched.tokens(e.id)[static_cast<std::size_t>(e.start + j)]);
      }
    }
    ASSERT_TRUE(pools->executor().run_plan(*out.plan));
    const std::size_t kv_row = 2 * 64, q_row = q_heads * 64;
    std::vector<float> k(static_cast<std::size_t>(n) * kv_row), v(k.size()), q(static_cast<std::size_t>(n) * q_row);
    for (std::int32_t layer = 0; layer < layers; ++layer) {
      for (float& x : k) x = nd(rng);
      for (float& x : v) x = nd(rng);
      for (float& x : q) x = nd(rng);
      ASSERT_TRUE(pools->executor().append(layer, out.slot_mapping, k.data(), v.data()));
      for (const step_tables* grp : {&out.decode, &out.prefill}) {
        if (grp->empty()) continue;
        // The group's queries, row after row.
        std::vector<float> gq, got(static_cast<std::size_t>(grp->num_query_rows()) * q_row), want(got.size());
        std::vector<seq_id> ids;
        for (std::size_t r = 0; r < grp->rows(); ++r) {
          const auto e = static_cast<std::size_t>(grp->entries[r]);
          ids.push_back(out.scheduled[e].id);
          const float* b = q.data() + static_cast<std::size_t>(out.query_start_loc[e]) * q_row;
          gq.insert(gq.end(), b, b + static_cast<std::size_t>(out.scheduled[e].num_tokens) * q_row);
        }
        // The same tables exported by hand.
        const std::int32_t stride = grp->row_stride;
        std::vector<std::int32_t> table(ids.size() * static_cast<std::size_t>(stride)), lens(ids.size());
        ASSERT_TRUE(cache->export_block_table(ids, table, stride, lens));
        EXPECT_EQ(table, grp->block_table);
        EXPECT_EQ(lens, grp->seq_lens);
        prefill_params p;
        p.query = gq.data();
        p.kv = pools->executor().view(layer);
        p.qo_indptr = grp->qo_indptr.data();
        p.num_seqs = static_cast<std::int32_t>(grp->rows());
        p.num_q_heads = q_heads;
        p.scale = 0.125F;
        p.out = got.data();
        p.pages = {.block_table = grp->block_table.data(), .row_stride = stride, .seq_lens = grp->seq_lens.data()};
        ASSERT_TRUE(paged_attention_prefill_cpu(p));
        // CSR tables give the same rows.
        p.out = want.data();
        p.pages = {.indptr = grp->kv_indptr.data(), .indices = grp->kv_indices.data(),
                   .last_page_len = grp->kv_last_page_len.data()};
        ASSERT_TRUE(paged_attention_prefill_cpu(p));
        EXPECT_EQ(got, want);
        if (grp == &out.decode) {  // the decode kernel over the decode group's dense table, the same rows
          decode_params d;
          d.query = gq.data();
          d.out = want.data();
          d.kv = p.kv;
          d.pages = {.block_table = grp->block_table.data(), .row_stride = stride, .seq_lens = grp->seq_lens.data()};
          d.num_seqs = p.num_seqs;
          d.num_q_heads = q_heads;
          d.scale = 0.125F;
          ASSERT_TRUE(paged_attention_decode_cpu(d));
          for (std::size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5F);
        }
      }
    }
    for (std::size_t i = 0; i < out.scheduled.size(); ++i)
      if (out.scheduled[i].last_chunk) {
        ASSERT_TRUE(sched.complete_scheduled(i, 5));
      }
  }
  EXPECT_TRUE(saw_mixed) << "a step with both groups";
}

TEST(StepExecutor, TablesOffLeaveTheOutputEmpty) {
  auto cache = *vllm_v1_cache::create({16, 32, 1, 0});
  scheduler_config cfg;
  cfg.export_tables = false;
  scheduler<vllm_v1_cache> sched(cache, cfg);
  const std::vector<token_id> p(20, 3);
  ASSERT_TRUE(sched.add_request(1, p));
  const step_output& out = sched.schedule();
  ASSERT_EQ(out.scheduled.size(), 1U);
  EXPECT_TRUE(out.input_ids.empty());
  EXPECT_TRUE(out.positions.empty());
  EXPECT_TRUE(out.query_start_loc.empty());
  EXPECT_TRUE(out.decode.empty() && out.prefill.empty() && out.prefill.block_table.empty());
  EXPECT_EQ(out.slot_mapping.size(), 20U);
}

TEST(BlockMoves, AppendThroughAnyViewWritesWhereTheViewSays) {
  // The same tokens appended through an HND and an NHD view of two pools: every K/V row lands at view.offset().
  const kv_geometry g{6, 8, 3, 64, kv_dtype::bf16};
  std::vector<std::uint16_t> hnd(static_cast<std::size_t>(block_bytes(g)) / 2 * 6), nhd(hnd.size());
  const std::vector<std::int64_t> slots = {0, 13, -1, 47};
  std::vector<std::uint16_t> k(slots.size() * 3 * 64), v(k.size());
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = static_cast<std::uint16_t>(i + 1), v[i] = static_cast<std::uint16_t>(40000 - i);
  append_params p;
  p.key = k.data();
  p.value = v.data();
  p.slot_mapping = slots.data();
  p.num_tokens = 4;
  for (const bool interleaved : {false, true}) {
    p.kv = interleaved ? paged_kv_view::nhd(nhd.data(), g) : paged_kv_view::hnd(hnd.data(), g);
    ASSERT_TRUE(kv_append_cpu(p));
    const auto* pool = static_cast<const std::uint16_t*>(p.kv.data);
    for (std::size_t t = 0; t < slots.size(); ++t) {
      if (slots[t] < 0) continue;
      for (std::int32_t h = 0; h < 3; ++h)
        for (std::int32_t d = 0; d < 64; ++d) {
          const std::size_t src = (t * 3 + static_cast<std::size_t>(h)) * 64 + static_cast<std::size_t>(d);
          const auto b = slots[t] / 8;
          const auto off = static_cast<std::int32_t>(slots[t] % 8);
          ASSERT_EQ(pool[static_cast<std::size_t>(p.kv.offset(b, 0, h, off) + d)], k[src]);
          ASSERT_EQ(pool[static_cast<std::size_t>(p.kv.offset(b, 1, h, off) + d)], v[src]);
        }
    }
  }
  // The HND view is the C function's layout: the same bytes.
  std::vector<std::uint16_t> c(hnd.size());
  ASSERT_EQ(kvpager_cpu_kv_append(c.data(), k.data(), v.data(), slots.data(), 4, 3, 64, 8, 6, KVPAGER_DTYPE_BF16),
            KVPAGER_STATUS_OK);
  EXPECT_EQ(c, hnd);
}

TEST(BlockMoves, OneCheckPerCallAndNothingWrittenOnError) {
  const kv_geometry g{4, 16, 1, 64, kv_dtype::f16};
  std::vector<std::uint16_t> pool(static_cast<std::size_t>(block_bytes(g)) / 2 * 4, 7);
  const std::vector<std::uint16_t> before = pool;
  const std::vector<std::int64_t> slots = {1, 64};  // 64 is one past the last slot
  std::vector<std::uint16_t> k(2 * 64, 1), v(k.size(), 2);
  append_params p;
  p.kv = paged_kv_view::hnd(pool.data(), g);
  p.key = k.data();
  p.value = v.data();
  p.slot_mapping = slots.data();
  p.num_tokens = 2;
  EXPECT_EQ(kv_append_cpu(p).detail(), KVPAGER_STATUS_INVALID_BLOCK);
  p.num_tokens = 1;
  p.src_dtype = KVPAGER_DTYPE_FP32;  // a plain pool takes only its own dtype
  EXPECT_EQ(kv_append_cpu(p).detail(), KVPAGER_STATUS_UNSUPPORTED_DTYPE);
  p.src_dtype = -1;
  p.kv.stride_token = -64;  // a view that reaches outside itself
  EXPECT_EQ(kv_append_cpu(p).detail(), KVPAGER_STATUS_INVALID_ARGUMENT);
  p.kv = paged_kv_view::hnd(pool.data(), g);
  p.num_tokens = -1;
  EXPECT_EQ(kv_append_cpu(p).detail(), KVPAGER_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(pool, before);
  // The C entry points answer as the operation they forward to.
  EXPECT_EQ(kvpager_cpu_kv_append(pool.data(), k.data(), v.data(), slots.data(), 2, 1, 64, 16, 4, KVPAGER_DTYPE_FP16),
            KVPAGER_STATUS_INVALID_BLOCK);
  EXPECT_EQ(kvpager_cpu_kv_append(pool.data(), k.data(), v.data(), slots.data(), 1, 1, 64, 16, 4, KVPAGER_DTYPE_FP8_E4M3),
            KVPAGER_STATUS_UNSUPPORTED_DTYPE);
  p.num_tokens = 1;
  EXPECT_TRUE(kv_append_cpu(p));
  EXPECT_NE(pool, before);
  const std::int64_t pairs[] = {0, 3, 2, 4};
  void* const layers[] = {pool.data()};
  EXPECT_EQ(copy_blocks_cpu({layers, 1, pairs, 2, 4, block_bytes(g)}).detail(), KVPAGER_STATUS_INVALID_BLOCK);
  EXPECT_TRUE(copy_blocks_cpu({layers, 1, pairs, 1, 4, block_bytes(g)}));
  std::vector<std::uint16_t> host(pool.size() / 2);
  EXPECT_EQ(swap_blocks_cpu({host.data(), 2, pool.data(), 4, block_bytes(g), pairs, 1}).detail(),
            KVPAGER_STATUS_INVALID_BLOCK);  // host block 3 of 2
  const std::int64_t to_host[] = {3, 1};
  EXPECT_TRUE(swap_blocks_cpu({host.data(), 2, pool.data(), 4, block_bytes(g), to_host, 1}));
  EXPECT_TRUE(std::equal(host.begin() + static_cast<std::ptrdiff_t>(host.size() / 2), host.end(),
                         pool.begin() + static_cast<std::ptrdiff_t>(3 * pool.size() / 4)));
}

TEST(StepExecutor, TheFirstTokenEndsTheStepAndARefusedOneChangesNothing) {
  auto cache = *vllm_v1_cache::create({16, 32, 1, 0});
  scheduler_config cfg;
  cfg.max_num_batched_tokens = 16;  // a 20-token prompt in two chunks
  scheduler<vllm_v1_cache> sched(cache, cfg);
  const std::vector<token_id> p(20, 3), q(4, 5);
  ASSERT_TRUE(sched.add_request(1, p));
  const step_output& out = sched.schedule();
  ASSERT_EQ(out.scheduled.size(), 1U);
  ASSERT_FALSE(out.scheduled[0].last_chunk);
  ASSERT_EQ(out.plan->num_append_tokens(), 16);
  // Refused tokens (a chunk that is not the prompt's last, an unknown request, no such entry) leave the step open.
  EXPECT_EQ(sched.complete(1, 9).code(), errc::invalid_argument);
  EXPECT_EQ(sched.complete_scheduled(0, 9).code(), errc::invalid_argument);
  EXPECT_EQ(sched.complete_scheduled(1, 9).code(), errc::invalid_argument);
  EXPECT_EQ(sched.complete(77, 9).code(), errc::unknown_sequence);
  EXPECT_EQ(sched.complete(77, 9, true).code(), errc::unknown_sequence);
  EXPECT_EQ(out.plan->num_append_tokens(), 16) << "the plan is still the step's";
  // The second step computes the last chunk; its token is taken, and the step ends with it.
  const step_output& two = sched.schedule();
  ASSERT_TRUE(two.scheduled.at(0).last_chunk);
  ASSERT_EQ(two.plan->num_append_tokens(), 4);
  ASSERT_TRUE(sched.add_request(2, q));  // queued: adding changes nothing in the cache's step
  EXPECT_EQ(two.plan->num_append_tokens(), 4);
  ASSERT_TRUE(sched.complete_scheduled(0, 9));
  EXPECT_TRUE(two.plan->empty()) << "the step's first token takes its plan as executed";
}

namespace {

/// Layer l's block x of a block_major pool: block x * layers + l of the one pool.
std::span<const std::byte> major_block(host_kv_pools& p, bool host, std::int32_t layers, std::int32_t l, std::int32_t x) {
  const auto bb = static_cast<std::size_t>(block_bytes(p.geometry()));
  const auto all = host ? p.host_bytes() : p.device_bytes();
  return all.subspan((static_cast<std::size_t>(x) * static_cast<std::size_t>(layers) + static_cast<std::size_t>(l)) * bb, bb);
}
std::span<const std::byte> layer_block(host_kv_pools& p, bool host, std::int32_t l, std::int32_t x) {
  const auto bb = static_cast<std::size_t>(block_bytes(p.geometry()));
  return (host ? p.host_bytes(l) : p.device_bytes(l)).subspan(static_cast<std::size_t>(x) * bb, bb);
}

/// A random valid plan over geom's device blocks and `host_blocks` host blocks, as a cache's plan is: up to two
/// swap-outs, swap-ins and copies each, distinct destinations that are never sources. Each entry names the group
/// `group(host, block)` gives for its source (a swap-in's host block, else a device block).
template <class Group>
step_plan random_plan(std::mt19937& rng, std::int32_t host_blocks, Group&& group) {
  std::vector<block_id> dev(static_cast<std::size_t>(geom.num_blocks)), host(static_cast<std::size_t>(host_blocks));
  for (std::size_t i = 0; i < dev.size(); ++i) dev[i] = static_cast<block_id>(i);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<block_id>(i);
  std::shuffle(dev.begin(), dev.end(), rng);
  std::shuffle(host.begin(), host.end(), rng);
  const int outs = static_cast<int>(rng() % 3), ins = static_cast<int>(rng() % 3), copies = static_cast<int>(rng() % 3);
  step_plan plan;
  std::size_t d = 0, h = 0;
  for (int i = 0; i < outs; ++i, ++d, ++h) plan.add_swap_out({dev[d], host[h], group(false, dev[d])});
  for (int i = 0; i < ins; ++i, ++d, ++h) plan.add_swap_in({dev[d], host[h], group(true, host[h])});
  for (int i = 0; i < copies; ++i, d += 2) plan.add_copy({dev[d], dev[d + 1], group(false, dev[d])});
  return plan;
}

}  // namespace

TEST(StepExecutor, BlockMajorPoolsMoveAndReadExactlyAsPerLayerPools) {
  constexpr std::int32_t layers = 3, host_blocks = 7;
  auto flat = host_kv_pools::create(geom, host_blocks, layers);
  auto major = host_kv_pools::create(geom, host_blocks, layers, {}, kv_pool_layout::block_major);
  ASSERT_TRUE(flat && major);
  ASSERT_EQ(major->pool_layout(), kv_pool_layout::block_major);
  EXPECT_EQ(major->device_bytes().size(), flat->device_bytes(0).size() * layers);
  fill(*flat, layers, 11);
  const auto bb = static_cast<std::size_t>(block_bytes(geom));
  for (std::int32_t l = 0; l < layers; ++l)  // the same content, laid out block-major
    for (std::int32_t x = 0; x < geom.num_blocks + host_blocks; ++x) {
      const bool host = x >= geom.num_blocks;
      const std::int32_t b = host ? x - geom.num_blocks : x;
      const auto src = layer_block(*flat, host, l, b);
      auto dst = major_block(*major, host, layers, l, b);
      std::memcpy(const_cast<std::byte*>(dst.data()), src.data(), bb);
    }
  auto same = [&] {
    for (std::int32_t l = 0; l < layers; ++l) {
      for (std::int32_t b = 0; b < geom.num_blocks; ++b) {
        const auto a = layer_block(*flat, false, l, b), m = major_block(*major, false, layers, l, b);
        if (!std::equal(a.begin(), a.end(), m.begin())) return false;
      }
      for (std::int32_t b = 0; b < host_blocks; ++b) {
        const auto a = layer_block(*flat, true, l, b), m = major_block(*major, true, layers, l, b);
        if (!std::equal(a.begin(), a.end(), m.begin())) return false;
      }
    }
    return true;
  };
  ASSERT_TRUE(same());
  std::mt19937 rng(5);
  for (int round = 0; round < 200; ++round) {
    const step_plan plan = random_plan(rng, host_blocks, [](bool, block_id) { return 0; });
    ASSERT_TRUE(flat->executor().run_plan(plan));
    ASSERT_TRUE(major->executor().run_plan(plan));
    const std::vector<std::int64_t> slots{static_cast<std::int64_t>(rng() % 192), -1,
                                          static_cast<std::int64_t>(rng() % 192)};
    std::vector<std::uint16_t> k(slots.size() * 2 * 64), v(k.size());
    for (auto& x : k) x = static_cast<std::uint16_t>(rng() & 0x3bff);
    for (auto& x : v) x = static_cast<std::uint16_t>(rng() & 0x3bff);
    for (std::int32_t l = 0; l < layers; ++l) {
      ASSERT_TRUE(flat->executor().append(l, slots, k.data(), v.data()));
      ASSERT_TRUE(major->executor().append(l, slots, k.data(), v.data()));
    }
    ASSERT_TRUE(same()) << "round " << round;
  }
  // Attention over each layer's view reads the same values, so gives the same output, bit for bit.
  const std::vector<std::int32_t> table{3, 7, 1, 10};
  const std::vector<std::int32_t> lens{57};
  std::vector<std::uint16_t> q(4 * 64), out_flat(q.size()), out_major(q.size());
  for (auto& x : q) x = static_cast<std::uint16_t>(rng() & 0x37ff);
  for (std::int32_t l = 0; l < layers; ++l) {
    decode_params d;
    d.query = q.data();
    d.pages = {.block_table = table.data(), .row_stride = 4, .seq_lens = lens.data()};
    d.num_seqs = 1;
    d.num_q_heads = 4;
    d.scale = 0.125F;
    d.num_threads = 1;
    d.kv = flat->view(l);
    d.out = out_flat.data();
    ASSERT_TRUE(paged_attention_decode_cpu(d));
    d.kv = major->view(l);
    d.out = out_major.data();
    ASSERT_TRUE(paged_attention_decode_cpu(d));
    EXPECT_EQ(out_flat, out_major) << "layer " << l;
    EXPECT_EQ(major->view(l).stride_block, flat->view(l).stride_block * layers);
  }
}

TEST(StepExecutor, ABlockMajorPoolOfOneGroupsLayersServesEveryKvCacheGroup) {
  // KV cache groups of equal size share one pool (hybrid_kv_cache): block b holds the layers of the group it was
  // handed to. Laid out block-major over a group's layer slots (group g's j-th layer reads slot j), b's bytes for its
  // group are one run, so a swap or copy moves the whole run whatever group it names: a host tier's load or store of
  // a group's block is one copy. Checked against per-layer pools with layer_groups (each entry moving only its
  // group's layers) over random plans whose entries name each block's owner group.
  constexpr std::int32_t slots = 2, groups = 2, host_blocks = 7;
  const std::vector<std::int32_t> layer_groups{0, 0, 1, 1};  // group g's layer j is layer g * slots + j
  auto flat = host_kv_pools::create(geom, host_blocks, slots * groups, layer_groups);
  auto major = host_kv_pools::create(geom, host_blocks, slots, {}, kv_pool_layout::block_major);
  ASSERT_TRUE(flat && major);
  fill(*flat, slots * groups, 23);
  std::mt19937 rng(9);
  std::vector<std::int32_t> owner(static_cast<std::size_t>(geom.num_blocks)), host_owner(host_blocks);
  for (auto& o : owner) o = static_cast<std::int32_t>(rng() % groups);
  for (auto& o : host_owner) o = static_cast<std::int32_t>(rng() % groups);
  const auto bb = static_cast<std::size_t>(block_bytes(geom));
  for (std::int32_t j = 0; j < slots; ++j) {  // the same content: each block's owner group's layers, block-major
    for (std::int32_t b = 0; b < geom.num_blocks; ++b) {
      const auto src = layer_block(*flat, false, owner[static_cast<std::size_t>(b)] * slots + j, b);
      std::memcpy(const_cast<std::byte*>(major_block(*major, false, slots, j, b).data()), src.data(), bb);
    }
    for (std::int32_t b = 0; b < host_blocks; ++b) {
      const auto src = layer_block(*flat, true, host_owner[static_cast<std::size_t>(b)] * slots + j, b);
      std::memcpy(const_cast<std::byte*>(major_block(*major, true, slots, j, b).data()), src.data(), bb);
    }
  }
  const auto same = [&] {
    for (std::int32_t j = 0; j < slots; ++j) {
      for (std::int32_t b = 0; b < geom.num_blocks; ++b) {
        const auto a = layer_block(*flat, false, owner[static_cast<std::size_t>(b)] * slots + j, b);
        const auto m = major_block(*major, false, slots, j, b);
        if (!std::equal(a.begin(), a.end(), m.begin())) return false;
      }
      for (std::int32_t b = 0; b < host_blocks; ++b) {
        const auto a = layer_block(*flat, true, host_owner[static_cast<std::size_t>(b)] * slots + j, b);
        const auto m = major_block(*major, true, slots, j, b);
        if (!std::equal(a.begin(), a.end(), m.begin())) return false;
      }
    }
    return true;
  };
  ASSERT_TRUE(same());
  std::int64_t moved_in_group_1 = 0;
  for (int round = 0; round < 200; ++round) {
    // Each entry names its source block's owner group; its destination then holds that group's layers.
    const step_plan plan = random_plan(rng, host_blocks, [&](bool host, block_id b) {
      return (host ? host_owner : owner)[static_cast<std::size_t>(b)];
    });
    ASSERT_TRUE(flat->executor().run_plan(plan));
    ASSERT_TRUE(major->executor().run_plan(plan));
    for (const block_swap& w : plan.swap_outs()) host_owner[static_cast<std::size_t>(w.host)] = w.group;
    for (const block_swap& w : plan.swap_ins()) owner[static_cast<std::size_t>(w.device)] = w.group;
    for (const block_copy& c : plan.copies()) owner[static_cast<std::size_t>(c.dst)] = c.group;
    for (const block_swap& w : plan.swap_outs()) moved_in_group_1 += w.group;
    for (const block_swap& w : plan.swap_ins()) moved_in_group_1 += w.group;
    ASSERT_TRUE(same()) << "round " << round;
  }
  EXPECT_GT(moved_in_group_1, 20) << "both groups' blocks should move";
}

TEST(StepExecutor, BlockMajorPoolsAreCheckedAtCreation) {
  std::vector<std::byte> a(static_cast<std::size_t>(block_bytes(geom)) * 12 * 2), b(a.size());
  void* one[] = {a.data()};
  void* two[] = {a.data(), b.data()};
  kv_pools p{geom, 0, one, {}, {}, kv_pool_layout::block_major, 2};
  EXPECT_TRUE(step_executor::create(p));
  p.device = two;  // one pool, not one per layer
  EXPECT_EQ(step_executor::create(p).error().code(), errc::invalid_argument);
  p.device = one;
  p.num_layers = 0;
  EXPECT_EQ(step_executor::create(p).error().code(), errc::invalid_argument);
  p.num_layers = 2;
  const std::int32_t groups[] = {0, 1};
  p.layer_groups = groups;
  EXPECT_EQ(step_executor::create(p).error().code(), errc::invalid_argument);
  p.layer_groups = {};
  p.num_host_blocks = 3;  // host blocks without a host pool
  EXPECT_EQ(step_executor::create(p).error().code(), errc::invalid_argument);
  p.host = one;
  EXPECT_TRUE(step_executor::create(p));
}
