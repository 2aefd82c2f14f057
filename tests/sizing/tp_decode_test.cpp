// SPDX-License-Identifier: Apache-2.0
// Tensor parallelism on the CPU backend (sizing/tp_executors.hpp): one paged_kv_cache decides, every rank keeps its
// KV heads in its own pool and runs the same plan, slot mapping and block table; decode per rank on its query heads,
// the outputs concatenated over heads, equals decode with TP = 1. Also the kernels' block sizes as the advisor's
// predicate (sizing/kernel_block_sizes.hpp).
#include <kvpager/cache/paged_kv_cache.hpp>
#include <kvpager/kernels/attention.hpp>
#include <kvpager/kernels/float16.hpp>
#include <kvpager/tuning/block_size_advisor.hpp>
#include <kvpager/sizing/kernel_block_sizes.hpp>
#include <kvpager/sizing/tp_executors.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <vector>

using namespace kvpager;

namespace {

// Random fp16 values in [-1, 1): `n` elements.
std::vector<std::byte> random_half(std::size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(-1.0F, 1.0F);
  std::vector<std::byte> out(n * 2);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint16_t h = detail::float_to_half(d(rng));
    std::memcpy(out.data() + 2 * i, &h, 2);
  }
  return out;
}

// One model's serving run: a cache, sequences with prompts of `prompts` tokens, a fork of the first, then
// `decode_steps` decode steps,
// K/V of every appended token drawn at random for all KV heads (one stream, so every TP degree sees the same bytes).
struct tp_run {
  kv_geometry g;
  std::int32_t q_heads;
  std::vector<std::int32_t> prompts;
  int decode_steps = 3;

  // Decode output [seqs, q_heads, head_dim] (fp16) after the run, with `tp` ranks, concatenated over heads.
  std::vector<std::byte> decode(std::int32_t tp, std::int32_t num_splits) const {
    auto cache = paged_kv_cache<>::create(cache_config_for(g));
    EXPECT_TRUE(cache.ok());
    auto ranks = tp_cpu_executors::create(g, q_heads, tp, 0);
    EXPECT_TRUE(ranks.ok());
    if (!cache.ok() || !ranks.ok()) return {};
    std::mt19937 rng(42);
    int copies = 0;
    const std::int64_t row = std::int64_t{g.head_dim} * elem_bytes(g.dtype);

    // Executes the cache's plan on every rank: each rank gets its heads of the step's K and V.
    auto execute = [&] {
      std::vector<std::int64_t> slots(static_cast<std::size_t>(cache->slot_mapping_size()));
      EXPECT_TRUE(cache->export_slot_mapping(slots));
      const auto n = static_cast<std::int64_t>(slots.size());
      const std::vector<std::byte> k = random_half(static_cast<std::size_t>(n * g.num_kv_heads * g.head_dim), rng);
      const std::vector<std::byte> v = random_half(static_cast<std::size_t>(n * g.num_kv_heads * g.head_dim), rng);
      std::vector<std::vector<std::byte>> ks, vs;
      std::vector<std::span<const std::byte>> kspan, vspan;
      for (std::int32_t r = 0; r < tp; ++r) {
        const tp_rank_layout& l = ranks->layout(r);
        ks.emplace_back(static_cast<std::size_t>(n * l.geometry.num_kv_heads * row));
        vs.emplace_back(static_cast<std::size_t>(n * l.geometry.num_kv_heads * row));
        EXPECT_TRUE(copy_rank_kv_heads(l, g.num_kv_heads, n, k, ks.back()));
        EXPECT_TRUE(copy_rank_kv_heads(l, g.num_kv_heads, n, v, vs.back()));
      }
      for (std::int32_t r = 0; r < tp; ++r) {
        kspan.emplace_back(ks[static_cast<std::size_t>(r)]);
        vspan.emplace_back(vs[static_cast<std::size_t>(r)]);
      }
      copies += static_cast<int>(cache->plan().copies().size());
      EXPECT_TRUE(ranks->execute(cache->plan(), slots, kspan, vspan));
      cache->begin_step();
    };

    std::vector<seq_id> ids;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      ids.push_back(100 + i);
      EXPECT_TRUE(cache->add_sequence(ids.back(), prompts[i]));
    }
    execute();
    // A fork shares the first sequence's blocks; its first decode copies the shared partial block (copy-on-write),
    // a copy in the plan that every rank runs on its own pool.
    ids.push_back(999);
    EXPECT_TRUE(cache->fork(ids.front(), ids.back()));
    for (int s = 0; s < decode_steps; ++s) {
      for (const seq_id id : ids) EXPECT_TRUE(cache->append_tokens(id));
      execute();
    }

    EXPECT_GT(copies, 0);  // the first prompt must not fill its last block
    // One block table for every rank.
    const auto seqs = static_cast<std::int32_t>(ids.size());
    const std::int32_t stride = 64;
    std::vector<std::int32_t> table(static_cast<std::size_t>(seqs * stride)), lens(ids.size());
    EXPECT_TRUE(cache->export_block_table(ids, table, stride, lens));
    std::mt19937 qrng(7);  // the same queries at every TP degree
    const std::vector<std::byte> query =
        random_half(static_cast<std::size_t>(seqs * q_heads * g.head_dim), qrng);
    std::vector<std::byte> out(query.size(), std::byte{0xFF});
    for (std::int32_t r = 0; r < tp; ++r) {
      const tp_rank_layout& l = ranks->layout(r);
      std::vector<std::byte> q(static_cast<std::size_t>(seqs * l.num_q_heads * row));
      std::vector<std::byte> o(q.size());
      EXPECT_TRUE(copy_rank_q_heads(l, q_heads, seqs, query, q));
      decode_params p;
      p.out = o.data();
      p.query = q.data();
      p.kv = ranks->view(r);
      p.pages.block_table = table.data();
      p.pages.row_stride = stride;
      p.pages.seq_lens = lens.data();
      p.num_seqs = seqs;
      p.num_q_heads = l.num_q_heads;
      p.scale = 1.0F / std::sqrt(static_cast<float>(g.head_dim));
      p.num_splits = num_splits;
      const status st = paged_attention_decode_cpu(p);
      EXPECT_TRUE(st) << st.message();
      // Rank r's heads go to their place in the concatenated output.
      for (std::int32_t s = 0; s < seqs; ++s)
        std::memcpy(out.data() + static_cast<std::size_t>((std::int64_t{s} * q_heads + l.q_head_begin) * row),
                    o.data() + static_cast<std::size_t>(std::int64_t{s} * l.num_q_heads * row),
                    static_cast<std::size_t>(l.num_q_heads * row));
    }
    return out;
  }
};

// Every element written (the output starts as 0xFFFF, an fp16 NaN) and finite.
bool all_finite(const std::vector<std::byte>& a) {
  for (std::size_t i = 0; i + 1 < a.size(); i += 2) {
    std::uint16_t x = 0;
    std::memcpy(&x, a.data() + i, 2);
    if (!std::isfinite(detail::half_to_float(x))) return false;
  }
  return !a.empty();
}

float max_abs_diff(const std::vector<std::byte>& a, const std::vector<std::byte>& b) {
  float m = 0;
  for (std::size_t i = 0; i + 1 < a.size(); i += 2) {
    std::uint16_t x = 0, y = 0;
    std::memcpy(&x, a.data() + i, 2);
    std::memcpy(&y, b.data() + i, 2);
    m = std::max(m, std::fabs(detail::half_to_float(x) - detail::half_to_float(y)));
  }
  return m;
}

// 8 KV heads, 16 query heads (GQA 2): TP = 2 and 4 split the KV heads; with one KV split per sequence each head's
// arithmetic is the same on every rank, so the output is bit for bit the TP = 1 output.
TEST(TpDecode, ConcatenatedRankOutputsEqualTp1) {
  const tp_run run{{128, 16, 8, 64, kv_dtype::f16}, 16, {37, 5, 70, 16}, 3};
  const std::vector<std::byte> tp1 = run.decode(1, 1);
  ASSERT_TRUE(all_finite(tp1));
  for (const std::int32_t tp : {2, 4}) {
    const std::vector<std::byte> out = run.decode(tp, 1);
    EXPECT_EQ(out, tp1) << "tp " << tp;
    // Split-KV planned per call (the split count may differ with the rank's head count): fp32 merge, fp16 output.
    EXPECT_LE(max_abs_diff(run.decode(tp, 0), tp1), 2e-3F) << "tp " << tp;
  }
}

// 2 KV heads over 4 ranks (8 query heads): each KV head replicated on two ranks, each rank one KV head and its two
// query heads; the concatenation is again the TP = 1 output. MQA (1 KV head) on 4 ranks likewise.
TEST(TpDecode, ReplicatedKvHeadsWhenFewerThanRanks) {
  const tp_run gqa{{64, 16, 2, 128, kv_dtype::f16}, 8, {33, 100, 1}, 2};
  const std::vector<std::byte> tp1 = gqa.decode(1, 1);
  ASSERT_TRUE(all_finite(tp1));
  EXPECT_EQ(gqa.decode(2, 1), tp1);
  EXPECT_EQ(gqa.decode(4, 1), tp1);
  const tp_run mqa{{64, 8, 1, 64, kv_dtype::f16}, 4, {20, 9}, 2};
  const std::vector<std::byte> mqa1 = mqa.decode(1, 1);
  ASSERT_TRUE(all_finite(mqa1));
  EXPECT_EQ(mqa.decode(4, 1), mqa1);
}

TEST(TpDecode, ExecutorSetUpPerRank) {
  const kv_geometry g{32, 16, 8, 128, kv_dtype::f16};
  auto ranks = tp_cpu_executors::create(g, 32, 4, 6);
  ASSERT_TRUE(ranks.ok());
  ASSERT_EQ(ranks->tp(), 4);
  for (std::int32_t r = 0; r < 4; ++r) {
    const tp_rank_layout& l = ranks->layout(r);
    EXPECT_EQ(l.geometry.num_kv_heads, 2);
    EXPECT_EQ(l.kv_head_begin, 2 * r);
    EXPECT_EQ(l.num_q_heads, 8);
    EXPECT_EQ(l.group_size(), 4);  // the model's 32 / 8
    // Each rank's pool is a quarter of the unsplit pool, with the cache's blocks.
    EXPECT_EQ(static_cast<std::int64_t>(ranks->rank(r).device_bytes().size()), kv_layout::of(g).pool_bytes() / 4);
    EXPECT_EQ(static_cast<std::int64_t>(ranks->rank(r).host_bytes().size()), 6 * kv_layout::of(g).block_bytes() / 4);
    EXPECT_EQ(ranks->view(r).num_blocks, 32);
    EXPECT_EQ(ranks->view(r).num_kv_heads, 2);
  }
  EXPECT_EQ(tp_cpu_executors::create(g, 32, 3, 0).code(), errc::invalid_argument);
  EXPECT_EQ(tp_cpu_executors::create(g, 32, 4, -1).code(), errc::invalid_argument);
  EXPECT_EQ(tp_cpu_executors::create(kv_geometry{0, 16, 8, 128, kv_dtype::f16}, 32, 4, 0).code(), errc::invalid_argument);
}

// A k/v too short for one rank, or a bad block id: an error, and no rank's pool changed.
TEST(TpDecode, BadInputChangesNoRank) {
  const kv_geometry g{8, 8, 4, 64, kv_dtype::f16};
  auto ranks = tp_cpu_executors::create(g, 4, 2, 0);
  ASSERT_TRUE(ranks.ok());
  const std::int64_t per_rank = 2 * 64 * 2;  // one token, 2 heads, fp16
  std::vector<std::byte> good(static_cast<std::size_t>(per_rank), std::byte{1}), short_(static_cast<std::size_t>(per_rank - 1));
  const std::vector<std::int64_t> slots{3};
  const step_plan plan;
  auto snapshot = [&] {
    std::vector<std::byte> all;
    for (std::int32_t r = 0; r < 2; ++r)
      all.insert(all.end(), ranks->rank(r).device_bytes().begin(), ranks->rank(r).device_bytes().end());
    return all;
  };
  const std::vector<std::byte> before = snapshot();
  const std::span<const std::byte> g0(good), s1(short_);
  {
    const std::span<const std::byte> k[] = {g0, s1}, v[] = {g0, g0};
    const status st = ranks->execute(plan, slots, k, v);
    EXPECT_EQ(st.code(), errc::buffer_too_small);
    EXPECT_EQ(st.detail(), 1);  // rank 1
  }
  {
    const std::span<const std::byte> k[] = {g0}, v[] = {g0};
    EXPECT_EQ(ranks->execute(plan, slots, k, v).code(), errc::invalid_argument);
  }
  {
    const std::vector<std::int64_t> bad{8 * 8};  // one past the pool
    const std::span<const std::byte> k[] = {g0, g0}, v[] = {g0, g0};
    EXPECT_EQ(ranks->execute(plan, bad, k, v).code(), errc::invalid_block);
  }
  EXPECT_EQ(snapshot(), before);
  const std::span<const std::byte> k[] = {g0, g0}, v[] = {g0, g0};
  EXPECT_TRUE(ranks->execute(plan, slots, k, v));
  EXPECT_NE(snapshot(), before);
}

// The kernels run block sizes 8, 16 and 32: restricted to them the advisor never recommends 64.
TEST(TpDecode, AdvisorRestrictedToTheKernelsBlockSizes) {
  const kernels_run_block_size kernels{{0, 16, 8, 128, kv_dtype::f16}};
  EXPECT_TRUE(kernels(8));
  EXPECT_TRUE(kernels(16));
  EXPECT_TRUE(kernels(32));
  EXPECT_FALSE(kernels(64));
  EXPECT_FALSE(kernels(4));
  EXPECT_FALSE((kernels_run_block_size{{0, 16, 8, 100, kv_dtype::f16}}(16)));  // head dim 100: nothing runs
  block_size_advisor a;
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(a.observe(4000, 4000));
  EXPECT_EQ(*a.recommend(), 64);
  EXPECT_EQ(*a.recommend(kernels), 32);
  EXPECT_EQ(a.recommend(kernels_run_block_size{{0, 16, 8, 100, kv_dtype::f16}}).code(), errc::unsupported);
}

}  // namespace
