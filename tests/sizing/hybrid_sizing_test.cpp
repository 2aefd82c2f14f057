// SPDX-License-Identifier: Apache-2.0
// KV sizing by layer kind (issue 24, point 3): one request's KV when window and chunked layers keep only what their
// next token reads, against the K/V strictly needed (at most 1.03 for every built-in hybrid model at 8k, 32k and
// 128k), against one full-attention group and against vLLM's padded grouping; hand-computed cases and bad input.
#include <kvpager/sizing/hybrid_sizing.hpp>

#include <gtest/gtest.h>

#include <cstdint>

using namespace kvpager;

namespace {

TEST(HybridSizing, GptOss20bAt8kHandComputed) {
  const hybrid_model* m = find_hybrid_model("gpt-oss-20b");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->num_layers(), 24);
  const auto r = request_kv(*m, 8192, 16, 2);
  ASSERT_TRUE(r.ok());
  const std::int64_t token_layer = 2 * 8 * 64 * 2;  // 2 KiB
  // Window 128: the next token reads the last 127; whole blocks from floor((8192 - 127) / 16) = 504: 8 blocks.
  EXPECT_EQ(r->kind_blocks[0], 512 - (8192 - 128 + 1) / 16);
  EXPECT_EQ(r->kind_blocks[0], 8);
  EXPECT_EQ(r->kind_blocks[1], 512);
  EXPECT_EQ(r->needed, (12 * 127 + 12 * 8192) * token_layer);
  EXPECT_EQ(r->groups, (12 * 8 + 12 * 512) * 16 * token_layer);
  EXPECT_EQ(r->one_group, 24 * 512 * 16 * token_layer);
  EXPECT_EQ(r->vllm_group_size, 12);
  EXPECT_EQ(r->vllm_groups, 2);
  EXPECT_EQ(r->vllm_padding_layers, 0);
  EXPECT_EQ(r->vllm_padded, r->groups);  // equal group sizes: vLLM pads nothing
}

TEST(HybridSizing, AllocatedOverNeededAtMost103AtLongContexts) {
  for (const hybrid_model& m : builtin_hybrid_models)
    for (const std::int64_t ctx : {8192, 32768, 131072}) {
      const auto r = request_kv(m, ctx, 16, 2);
      ASSERT_TRUE(r.ok()) << m.name;
      EXPECT_LE(r->allocated_over_needed(), 1.03) << m.name << " at " << ctx;
      EXPECT_GE(r->groups, r->needed) << m.name;
      EXPECT_LE(r->groups, r->vllm_padded) << m.name;
      EXPECT_LE(r->vllm_padded, r->one_group) << m.name;
    }
}

TEST(HybridSizing, VllmPadsGemma3_27bsLastWindowGroup) {
  // 52 sliding layers and 10 full: vLLM's group size is 10, so 6 window groups (60 layer slots) and one full group:
  // 8 of the last window group's 10 layers are padding.
  const auto r = request_kv(*find_hybrid_model("Gemma-3-27b"), 32768, 16, 2);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->vllm_group_size, 10);
  EXPECT_EQ(r->vllm_groups, 7);
  EXPECT_EQ(r->vllm_padding_layers, 8);
  EXPECT_GT(r->vllm_padded, r->groups);
  // Gemma 3 12b (40 / 8) divides evenly: no padding.
  EXPECT_EQ(request_kv(*find_hybrid_model("Gemma-3-12b"), 8192, 16, 2)->vllm_padding_layers, 0);
  // Counts within 1.5x of each other use the larger as the group size (12 and 13 layers: one group each).
  hybrid_model near{"near", "", 8, 128, {{{layer_attention::sliding_window, 512, 13}, {layer_attention::full, 0, 12}}}, 2};
  const auto n = request_kv(near, 8192, 16, 2);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->vllm_group_size, 13);
  EXPECT_EQ(n->vllm_groups, 2);
  EXPECT_EQ(n->vllm_padding_layers, 1);
}

TEST(HybridSizing, ChunkedAndWindowEdges) {
  const layer_kind_count chunk{layer_attention::chunked_local, 8192, 36};
  EXPECT_EQ(held_blocks(chunk, 8192, 16), 0);      // at a chunk boundary the next token starts a fresh chunk
  EXPECT_EQ(held_blocks(chunk, 8193, 16), 1);
  EXPECT_EQ(held_blocks(chunk, 12000, 16), 750 - 512);
  EXPECT_EQ(needed_tokens(chunk, 12000), 12000 - 8192);
  const layer_kind_count w1{layer_attention::sliding_window, 1, 4};
  EXPECT_EQ(needed_tokens(w1, 100), 0);
  EXPECT_EQ(held_blocks(w1, 100, 16), 1);  // the block the next token is written into
  const layer_kind_count w{layer_attention::sliding_window, 4096, 32};
  EXPECT_EQ(held_blocks(w, 100, 16), 7);   // shorter than the window: every block
  EXPECT_EQ(needed_tokens(w, 100), 100);
}

TEST(HybridSizing, BadInputIsAnError) {
  const hybrid_model& m = *find_hybrid_model("Gemma-2-9b");
  EXPECT_EQ(request_kv(m, 0, 16, 2).error().code(), errc::invalid_argument);
  EXPECT_EQ(request_kv(m, 100, 0, 2).error().code(), errc::invalid_argument);
  EXPECT_EQ(request_kv(m, 100, 16, 0).error().code(), errc::invalid_argument);
  hybrid_model bad = m;
  bad.kinds[0].size = 0;
  EXPECT_EQ(request_kv(bad, 100, 16, 2).error().code(), errc::invalid_argument);
  bad = m;
  bad.num_kinds = 0;
  EXPECT_EQ(request_kv(bad, 100, 16, 2).error().code(), errc::invalid_argument);
  EXPECT_EQ(find_hybrid_model("gemma-9"), nullptr);
  static_assert(request_kv(builtin_hybrid_models[0], 4096, 16, 2).ok());  // constexpr
}

}  // namespace
