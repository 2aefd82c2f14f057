// SPDX-License-Identifier: Apache-2.0
// Tensor-parallel head layout (sizing/tensor_parallel.hpp): every rank's query heads use exactly the KV heads the
// unsplit model gives them, KV heads are split evenly or replicated as vLLM does, and bad degrees are errors.
#include <kvpager/sizing/tensor_parallel.hpp>

#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

using namespace kvpager;

namespace {

kv_geometry geometry(std::int32_t kv_heads) { return kv_geometry{64, 16, kv_heads, 128, kv_dtype::f16}; }

static_assert(split_heads(64, 8, 8).ok());
static_assert(!split_heads(28, 4, 8).ok());
static_assert(rank_layout(kv_geometry{64, 16, 8, 128, kv_dtype::f16}, 64, 4, 3).ok());

TEST(TensorParallel, SplitHeadsEvenlyOrReplicated) {
  EXPECT_EQ(*split_heads(32, 32, 1), (tp_head_split{1, 32, 32, 1}));
  EXPECT_EQ(*split_heads(32, 32, 4), (tp_head_split{4, 8, 8, 1}));
  EXPECT_EQ(*split_heads(64, 8, 8), (tp_head_split{8, 8, 1, 1}));
  EXPECT_EQ(*split_heads(64, 8, 16), (tp_head_split{16, 4, 1, 2}));   // each KV head on 2 ranks
  EXPECT_EQ(*split_heads(28, 4, 4), (tp_head_split{4, 7, 1, 1}));
  EXPECT_EQ(*split_heads(32, 1, 4), (tp_head_split{4, 8, 1, 4}));     // MQA: the one KV head on every rank
}

TEST(TensorParallel, BadDegreesAndShapesAreErrors) {
  for (const auto& [q, kv, tp] : std::vector<std::array<std::int32_t, 3>>{
           {32, 32, 0}, {32, 32, -4}, {32, 0, 1}, {0, 8, 1}, {-32, 8, 1},
           {12, 8, 1},   // query heads not a multiple of KV heads
           {28, 4, 8},   // query heads not divisible by tp
           {48, 6, 4},   // KV heads >= tp but not divisible
           {48, 4, 6},   // KV heads < tp, tp not a multiple of them
       }) {
    const result<tp_head_split> s = split_heads(q, kv, tp);
    EXPECT_FALSE(s.ok()) << q << " " << kv << " " << tp;
    EXPECT_EQ(s.code(), errc::invalid_argument);
  }
  EXPECT_EQ(rank_layout(geometry(8), 64, 8, 8).code(), errc::invalid_argument);
  EXPECT_EQ(rank_layout(geometry(8), 64, 8, -1).code(), errc::invalid_argument);
  EXPECT_EQ(rank_layout(geometry(0), 64, 8, 0).code(), errc::invalid_argument);
}

// The defining property, over many shapes: for every rank and every query head it computes, the KV head it reads
// locally is the one the unsplit model's GQA grouping assigns to that query head; the pools keep the cache's block
// count, block size, head dim and dtype; with KV heads >= tp the ranks' KV heads partition the model's, and the GQA
// ratio is the model's on every rank; with fewer KV heads than ranks each KV head is on tp / KV heads ranks.
TEST(TensorParallel, EveryRankReadsTheKvHeadsItsQueryHeadsUse) {
  int checked = 0;
  for (std::int32_t kv = 1; kv <= 16; ++kv)
    for (std::int32_t group = 1; group <= 8; ++group)
      for (const std::int32_t tp : {1, 2, 4, 8, 16}) {
        const std::int32_t q = kv * group;
        const kv_geometry g = geometry(kv);
        if (!split_heads(q, kv, tp).ok()) continue;
        std::vector<int> holders(static_cast<std::size_t>(kv), 0);
        std::vector<int> q_seen(static_cast<std::size_t>(q), 0);
        for (std::int32_t r = 0; r < tp; ++r) {
          const result<tp_rank_layout> l = rank_layout(g, q, tp, r);
          ASSERT_TRUE(l.ok());
          EXPECT_EQ(l->rank, r);
          EXPECT_EQ(l->geometry.num_blocks, g.num_blocks);
          EXPECT_EQ(l->geometry.block_size, g.block_size);
          EXPECT_EQ(l->geometry.head_dim, g.head_dim);
          EXPECT_EQ(l->geometry.dtype, g.dtype);
          EXPECT_EQ(l->geometry.num_kv_heads, kv >= tp ? kv / tp : 1);
          EXPECT_EQ(l->num_q_heads, q / tp);
          if (kv >= tp) {
            EXPECT_EQ(l->group_size(), group);  // the GQA ratio survives the split
          }
          for (std::int32_t h = 0; h < l->geometry.num_kv_heads; ++h) ++holders[static_cast<std::size_t>(l->kv_head_begin + h)];
          for (std::int32_t j = 0; j < l->num_q_heads; ++j) {
            const std::int32_t global_q = l->q_head_begin + j;
            ++q_seen[static_cast<std::size_t>(global_q)];
            const std::int32_t local_kv = j / l->group_size();  // what the decode kernel reads on this rank
            ASSERT_EQ(l->kv_head_begin + local_kv, global_q / group) << "q " << q << " kv " << kv << " tp " << tp;
          }
          ++checked;
        }
        for (const int n : holders) EXPECT_EQ(n, kv >= tp ? 1 : tp / kv);
        for (const int n : q_seen) EXPECT_EQ(n, 1);
      }
  EXPECT_GT(checked, 500);  // rank layouts checked (840 with these ranges)
}

TEST(TensorParallel, CopyHeadSliceTakesARanksHeads) {
  // 3 rows of 4 heads, 2 bytes per head: byte value = row * 16 + head * 2 + byte.
  std::vector<std::byte> full(3 * 4 * 2);
  for (std::size_t i = 0; i < full.size(); ++i) full[i] = static_cast<std::byte>((i / 8) * 16 + (i % 8));
  std::vector<std::byte> shard(3 * 2 * 2, std::byte{0xEE});
  ASSERT_TRUE(copy_head_slice(4, 1, 2, 2, 3, full, shard));
  for (std::size_t row = 0; row < 3; ++row)
    for (std::size_t b = 0; b < 4; ++b) EXPECT_EQ(shard[row * 4 + b], static_cast<std::byte>(row * 16 + 2 + b));

  // Bad input: an error and nothing written.
  const std::vector<std::byte> before = shard;
  EXPECT_EQ(copy_head_slice(4, 3, 2, 2, 3, full, shard).code(), errc::invalid_argument);  // heads 3..4 of 4
  EXPECT_EQ(copy_head_slice(4, -1, 2, 2, 3, full, shard).code(), errc::invalid_argument);
  EXPECT_EQ(copy_head_slice(4, 0, 0, 2, 3, full, shard).code(), errc::invalid_argument);
  EXPECT_EQ(copy_head_slice(4, 0, 2, 0, 3, full, shard).code(), errc::invalid_argument);
  EXPECT_EQ(copy_head_slice(4, 0, 2, 2, -1, full, shard).code(), errc::invalid_argument);
  EXPECT_EQ(copy_head_slice(4, 0, 2, 2, 4, full, shard).code(), errc::buffer_too_small);  // full holds 3 rows
  EXPECT_EQ(copy_head_slice(4, 0, 2, 2, 3, full, std::span<std::byte>(shard).first(11)).code(), errc::buffer_too_small);
  EXPECT_EQ(shard, before);
}

}  // namespace
