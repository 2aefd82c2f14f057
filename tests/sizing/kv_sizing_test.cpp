// SPDX-License-Identifier: Apache-2.0
// Model sizing (sizing/model_shape.hpp, sizing/kv_sizing.hpp): the built-in shapes against their config fields,
// KV bytes per token (per layer and in total), block bytes, budgets, blocks, concurrent sequences, per-rank figures
// under tensor parallelism, and the errors for bad input.
#include <kvpager/sizing/kv_sizing.hpp>
#include <kvpager/sizing/model_shape.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string_view>

using namespace kvpager;

namespace {

constexpr std::int64_t KiB = 1024;
constexpr std::int64_t MiB = 1024 * KiB;
constexpr std::int64_t GiB = 1024 * MiB;

model_shape model(std::string_view name) {
  result<model_shape> m = find_model(name);
  EXPECT_TRUE(m.ok()) << name;
  return m.ok() ? *m : model_shape{};
}

// Checked at compile time: the functions are constexpr.
static_assert(builtin_models.size() == 7);
static_assert(kv_bytes_per_token(builtin_models[0], 2).ok());
static_assert(!kv_bytes_per_token(builtin_models[0], 0).ok());
static_assert(plan_pool({builtin_models[0], 24 * GiB, 0.9, 2, 2, 16, 1, 1 * GiB, 2048}).ok());
static_assert(plan_pool({builtin_models[2], 24 * GiB, 0.9, 2, 2, 16, 1, 1 * GiB, 2048}).code() == errc::out_of_blocks);

// The seed's "16KB per token" for a 7B model in fp16 is Llama-2-7B's per-layer figure; over its 32 layers a token
// takes 512 KiB.
TEST(KvSizing, Llama2_7BIs16KiBPerLayerAnd512KiBPerToken) {
  const model_shape m = model("Llama-2-7B");
  EXPECT_EQ(*kv_bytes_per_token_per_layer(m, 2), 2 * 32 * 128 * 2);
  EXPECT_EQ(*kv_bytes_per_token_per_layer(m, 2), 16 * KiB);
  EXPECT_EQ(*kv_bytes_per_token(m, 2), 512 * KiB);
  EXPECT_EQ(*kv_block_bytes(m, 2, 16), 8 * MiB);
  // The seed's 2048-token preallocation: 32 MiB per layer, 1 GiB over the model.
  EXPECT_EQ(*kv_bytes_per_token_per_layer(m, 2) * 2048, 32 * MiB);
  EXPECT_EQ(*kv_bytes_per_token(m, 2) * 2048, 1 * GiB);
  // fp32 KV doubles it, fp8 halves it.
  EXPECT_EQ(*kv_bytes_per_token(m, 4), 1024 * KiB);
  EXPECT_EQ(*kv_bytes_per_token(m, 1), 256 * KiB);
}

// Published per-token fp16 KV sizes of the other built-in models (2 x KV heads x head dim x 2 bytes x layers).
TEST(KvSizing, PerTokenBytesOfEveryBuiltInModel) {
  struct expected {
    std::string_view name;
    std::int64_t per_layer, total;
  };
  for (const expected& e : {expected{"Llama-2-7B", 16 * KiB, 512 * KiB}, expected{"Llama-2-13B", 20 * KiB, 800 * KiB},
                            expected{"Llama-2-70B", 4 * KiB, 320 * KiB}, expected{"Llama-3-8B", 4 * KiB, 128 * KiB},
                            expected{"Llama-3-70B", 4 * KiB, 320 * KiB}, expected{"Mistral-7B", 4 * KiB, 128 * KiB},
                            expected{"Qwen2.5-7B", 2 * KiB, 56 * KiB}}) {
    const model_shape m = model(e.name);
    EXPECT_EQ(*kv_bytes_per_token_per_layer(m, 2), e.per_layer) << e.name;
    EXPECT_EQ(*kv_bytes_per_token(m, 2), e.total) << e.name;
  }
}

// Each built-in shape is consistent with the config.json fields it records: head_dim = hidden_size / heads, and the
// parameter count is that of the Llama architecture (embeddings and untied LM head, attention with GQA and optional
// q/k/v bias, gated MLP, two RMSNorms per layer and a final one).
TEST(KvSizing, BuiltInShapesAgreeWithTheirConfigFields) {
  for (const model_shape& m : builtin_models) {
    SCOPED_TRACE(std::string(m.name));
    EXPECT_TRUE(validate(m));
    EXPECT_EQ(m.head_dim * m.num_q_heads, m.hidden_size);
    const std::int64_t h = m.hidden_size;
    const std::int64_t kv = std::int64_t{m.num_kv_heads} * m.head_dim;
    const std::int64_t attention = 2 * h * h + 2 * h * kv + (m.qkv_bias ? h + 2 * kv : 0);
    const std::int64_t per_layer = attention + 3 * h * m.intermediate_size + 2 * h;
    EXPECT_EQ(m.num_params, m.num_layers * per_layer + 2 * std::int64_t{m.vocab_size} * h + h);
    EXPECT_FALSE(m.source.empty());
  }
  // The published sizes, in billions.
  EXPECT_NEAR(static_cast<double>(model("Llama-2-7B").num_params) / 1e9, 6.74, 0.005);
  EXPECT_NEAR(static_cast<double>(model("Llama-3-8B").num_params) / 1e9, 8.03, 0.005);
  EXPECT_NEAR(static_cast<double>(model("Mistral-7B").num_params) / 1e9, 7.24, 0.005);
  EXPECT_NEAR(static_cast<double>(model("Qwen2.5-7B").num_params) / 1e9, 7.61, 0.01);
  EXPECT_NEAR(static_cast<double>(model("Llama-3-70B").num_params) / 1e9, 70.55, 0.01);
}

TEST(KvSizing, FindModelIsCaseInsensitiveAndRejectsUnknownNames) {
  EXPECT_EQ(model("llama-2-70b").num_kv_heads, 8);
  EXPECT_EQ(model("QWEN2.5-7B").num_layers, 28);
  const result<model_shape> none = find_model("gpt-5");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.code(), errc::invalid_argument);
  EXPECT_FALSE(find_model("").ok());
  EXPECT_FALSE(find_model("llama-2-7").ok());
}

// Per rank: max(1, KV heads / tp) heads (vLLM replicates KV heads when there are fewer than ranks).
TEST(KvSizing, PerRankBytesUnderTensorParallelism) {
  const model_shape l70 = model("Llama-2-70B");  // 64 q heads, 8 KV heads
  EXPECT_EQ(*kv_bytes_per_token(l70, 2, 2), 160 * KiB);
  EXPECT_EQ(*kv_bytes_per_token(l70, 2, 8), 40 * KiB);
  EXPECT_EQ(*kv_bytes_per_token(l70, 2, 16), 40 * KiB);  // 16 ranks: each of the 8 heads on two ranks
  EXPECT_EQ(*kv_bytes_per_token(l70, 2, 64), 40 * KiB);
  const model_shape qwen = model("Qwen2.5-7B");  // 28 q heads, 4 KV heads
  EXPECT_EQ(*kv_bytes_per_token(qwen, 2, 2), 28 * KiB);
  EXPECT_EQ(*kv_bytes_per_token(qwen, 2, 4), 14 * KiB);
  // 28 query heads do not split over 8 ranks (vLLM refuses it too).
  EXPECT_EQ(kv_bytes_per_token(qwen, 2, 8).code(), errc::invalid_argument);
  EXPECT_EQ(kv_bytes_per_token(model("Llama-2-7B"), 2, 3).code(), errc::invalid_argument);
  // Weights split evenly (rounded up).
  EXPECT_EQ(*weight_bytes_per_rank(l70, 2, 1), 2 * l70.num_params);
  EXPECT_EQ(*weight_bytes_per_rank(l70, 2, 8), 2 * l70.num_params / 8);
  EXPECT_EQ(*weight_bytes_per_rank(model("Llama-2-7B"), 1, 3), (model("Llama-2-7B").num_params + 2) / 3);
}

TEST(KvSizing, BadShapesAndArgumentsAreErrors) {
  model_shape m = model("Llama-3-8B");
  const auto bad = [](model_shape s) { return kv_bytes_per_token(s, 2).code(); };
  m.num_kv_heads = 0;
  EXPECT_EQ(bad(m), errc::invalid_argument);
  m = model("Llama-3-8B");
  m.num_layers = 0;
  EXPECT_EQ(bad(m), errc::invalid_argument);
  m = model("Llama-3-8B");
  m.head_dim = -128;
  EXPECT_EQ(bad(m), errc::invalid_argument);
  m = model("Llama-3-8B");
  m.num_q_heads = 12;  // not a multiple of 8 KV heads
  EXPECT_EQ(bad(m), errc::invalid_argument);
  m = model("Llama-3-8B");
  m.num_params = -1;
  EXPECT_EQ(weight_bytes_per_rank(m, 2).code(), errc::invalid_argument);
  m.num_params = std::numeric_limits<std::int64_t>::max() / 2 + 1;
  EXPECT_EQ(weight_bytes_per_rank(m, 2).code(), errc::invalid_argument);
  m = model("Llama-3-8B");
  EXPECT_EQ(kv_bytes_per_token(m, 0).code(), errc::invalid_argument);
  EXPECT_EQ(kv_bytes_per_token(m, 2, 0).code(), errc::invalid_argument);
  EXPECT_EQ(kv_bytes_per_token(m, 2, -2).code(), errc::invalid_argument);
  EXPECT_EQ(kv_block_bytes(m, 2, 0).code(), errc::invalid_argument);
  EXPECT_EQ(weight_bytes_per_rank(m, 0).code(), errc::invalid_argument);
  EXPECT_EQ(weight_bytes_per_rank(m, 2, 0).code(), errc::invalid_argument);
  EXPECT_EQ(blocks_for_budget(-1, 16).code(), errc::invalid_argument);
  EXPECT_EQ(blocks_for_budget(100, 0).code(), errc::invalid_argument);
  EXPECT_EQ(max_concurrent_sequences(-1, 16, 10).code(), errc::invalid_argument);
  EXPECT_EQ(max_concurrent_sequences(10, 0, 10).code(), errc::invalid_argument);
  EXPECT_EQ(max_concurrent_sequences(10, 16, 0).code(), errc::invalid_argument);
}

TEST(KvSizing, BudgetIsCardTimesUtilizationMinusWeightsAndReserve) {
  EXPECT_EQ(*kv_budget_bytes({24 * GiB, 0.5, 4 * GiB, 1 * GiB}), 7 * GiB);
  EXPECT_EQ(*kv_budget_bytes({80 * GiB, 1.0, 0, 0}), 80 * GiB);
  // Does not fit: out_of_blocks, detail = bytes missing for a one-byte budget.
  const result<std::int64_t> over = kv_budget_bytes({24 * GiB, 0.5, 12 * GiB, 1 * GiB});
  EXPECT_EQ(over.code(), errc::out_of_blocks);
  EXPECT_EQ(over.error().detail(), 1 * GiB + 1);
  EXPECT_EQ(kv_budget_bytes({24 * GiB, 0.5, 12 * GiB, 0}).code(), errc::out_of_blocks);  // exactly full: no KV room
  EXPECT_EQ(kv_budget_bytes({0, 0.9, 0, 0}).code(), errc::invalid_argument);
  EXPECT_EQ(kv_budget_bytes({-GiB, 0.9, 0, 0}).code(), errc::invalid_argument);
  EXPECT_EQ(kv_budget_bytes({GiB, 0.0, 0, 0}).code(), errc::invalid_argument);
  EXPECT_EQ(kv_budget_bytes({GiB, 1.5, 0, 0}).code(), errc::invalid_argument);
  EXPECT_EQ(kv_budget_bytes({GiB, std::nan(""), 0, 0}).code(), errc::invalid_argument);
  EXPECT_EQ(kv_budget_bytes({GiB, 0.9, -1, 0}).code(), errc::invalid_argument);
  EXPECT_EQ(kv_budget_bytes({GiB, 0.9, 0, -1}).code(), errc::invalid_argument);
}

TEST(KvSizing, BlocksAndConcurrentSequences) {
  EXPECT_EQ(*blocks_for_budget(7 * GiB, 8 * MiB), 896);
  EXPECT_EQ(*blocks_for_budget(8 * MiB - 1, 8 * MiB), 0);
  EXPECT_EQ(*max_concurrent_sequences(896, 16, 2048), 7);   // 128 blocks each
  EXPECT_EQ(*max_concurrent_sequences(896, 16, 2049), 6);   // 129 blocks each
  EXPECT_EQ(*max_concurrent_sequences(100, 16, 17), 50);    // 2 blocks each
  EXPECT_EQ(*max_concurrent_sequences(0, 16, 1), 0);
}

// plan_pool is the composition: Llama-2-7B on a 24 GiB card (RTX 4090), 90% usable, 1 GiB activation reserve.
TEST(KvSizing, PlanPoolForLlama2_7BOnA24GiBCard) {
  const model_shape m = model("Llama-2-7B");
  const result<pool_plan> p = plan_pool({m, 24 * GiB, 0.9, 2, 2, 16, 1, 1 * GiB, 2048});
  ASSERT_TRUE(p.ok());
  const std::int64_t usable = static_cast<std::int64_t>(24.0 * static_cast<double>(GiB) * 0.9);
  const std::int64_t budget = usable - 2 * m.num_params - 1 * GiB;
  EXPECT_EQ(p->kv_heads_per_rank, 32);
  EXPECT_EQ(p->kv_bytes_per_token_per_layer, 16 * KiB);
  EXPECT_EQ(p->kv_bytes_per_token, 512 * KiB);
  EXPECT_EQ(p->model_kv_bytes_per_token, 512 * KiB);
  EXPECT_EQ(p->block_bytes, 8 * MiB);
  EXPECT_EQ(p->weight_bytes, 2 * m.num_params);
  EXPECT_EQ(p->budget_bytes, budget);
  EXPECT_EQ(p->num_blocks, budget / (8 * MiB));
  EXPECT_EQ(p->token_capacity, p->num_blocks * 16);
  EXPECT_EQ(p->max_sequences, p->num_blocks / 128);
  // About 8 GiB of KV: 1030 16-token blocks, 8 sequences of 2048 tokens at once.
  EXPECT_GT(p->num_blocks, 900);
  EXPECT_LT(p->num_blocks, 1100);
  EXPECT_EQ(p->max_sequences, 8);
}

// Under TP every rank holds its share of the weights and of each block; all ranks have the same block count.
TEST(KvSizing, PlanPoolPerRankUnderTensorParallelism) {
  const model_shape m = model("Llama-2-70B");
  pool_request r{m, 80 * GiB, 0.9, 2, 2, 16, 1, 2 * GiB, 4096};
  EXPECT_EQ(plan_pool(r).code(), errc::out_of_blocks);  // 138 GB of weights on one 80 GiB card
  for (const std::int32_t tp : {2, 4, 8}) {
    r.tp = tp;
    const result<pool_plan> p = plan_pool(r);
    ASSERT_TRUE(p.ok()) << tp;
    EXPECT_EQ(p->kv_heads_per_rank, 8 / tp);
    EXPECT_EQ(p->kv_bytes_per_token, 320 * KiB / tp);
    EXPECT_EQ(p->model_kv_bytes_per_token, 320 * KiB);
    EXPECT_EQ(p->block_bytes, 16 * 320 * KiB / tp);
    EXPECT_EQ(p->weight_bytes, (2 * m.num_params + tp - 1) / tp);
    EXPECT_EQ(p->num_blocks, *blocks_for_budget(p->budget_bytes, p->block_bytes));
    EXPECT_EQ(p->max_sequences, *max_concurrent_sequences(p->num_blocks, 16, 4096));
  }
  // Bad input reaches plan_pool's caller as an error value.
  r.tp = 3;
  EXPECT_EQ(plan_pool(r).code(), errc::invalid_argument);
  r.tp = 2;
  r.block_size = 0;
  EXPECT_EQ(plan_pool(r).code(), errc::invalid_argument);
  r.block_size = 16;
  r.seq_len = 0;
  EXPECT_EQ(plan_pool(r).code(), errc::invalid_argument);
}

}  // namespace
