// SPDX-License-Identifier: Apache-2.0
// Adaptive swap-or-recompute: the cost model's choice, measurements moving it, the swap-frequency penalty, and bad
// configurations and measurements refused without changing anything.
#include <kvpager/tuning/swap_cost_model.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string_view>
#include <vector>

using namespace kvpager;

namespace {
/// Llama-2-7B in fp16, 16-token blocks: 8 MiB a block; a 25 GB/s link; `prefill` seconds per token.
swap_cost_model llama7b(double prefill) {
  swap_cost_model m;
  m.block_bytes = kv_block_bytes(kv_geometry{.num_blocks = 1, .block_size = 16, .num_kv_heads = 32, .head_dim = 128,
                                             .dtype = kv_dtype::f16},
                                 32);
  m.link_bytes_per_second = 25.0e9;
  m.prefill_seconds_per_token = prefill;
  return m;
}
}  // namespace

TEST(SwapCostModel, BlockBytesFromTheGeometry) {
  constexpr kv_geometry g{.num_blocks = 1, .block_size = 16, .num_kv_heads = 32, .head_dim = 128,
                          .dtype = kv_dtype::f16};
  static_assert(kv_block_bytes(g, 32) == std::int64_t{8} << 20);  // 512 KiB a token x 16 tokens
  EXPECT_EQ(kv_block_bytes(g, 1), 256 * 1024);
  EXPECT_EQ(kv_block_bytes(kv_geometry{.num_blocks = 1, .block_size = 16, .num_kv_heads = 8, .head_dim = 128,
                                       .dtype = kv_dtype::f32},
                           2),
            2 * 2 * 16 * 8 * 128 * 4);
  EXPECT_EQ(kv_block_bytes(g, 0), 0);
}

TEST(SwapCostModel, ChoosesTheCheaperWay) {
  // Swapping a full block out and back: 2 x 8 MiB / 25 GB/s = 0.67 ms, 42 us a token.
  adaptive_preemption slow_prefill(llama7b(100e-6));  // recompute at 10k tokens/s: 100 us a token
  EXPECT_NEAR(slow_prefill.swap_seconds(7), 2.0 * 7 * 8388608 / 25.0e9, 1e-12);
  EXPECT_NEAR(slow_prefill.recompute_seconds(100), 0.01, 1e-12);
  EXPECT_EQ(slow_prefill.choose(7, 100), preempt_choice::swap);
  adaptive_preemption fast_prefill(llama7b(20e-6));  // 50k tokens/s: 20 us a token
  EXPECT_EQ(fast_prefill.choose(7, 100), preempt_choice::recompute);
  // A victim with few tokens in many blocks (a short tail in each) is cheap to recompute either way.
  EXPECT_EQ(slow_prefill.choose(64, 64), preempt_choice::recompute);
  EXPECT_EQ(slow_prefill.choose(0, 0), preempt_choice::recompute) << "ties go to recompute";
}

TEST(SwapCostModel, MeasurementsMoveTheChoice) {
  swap_cost_model m = llama7b(100e-6);
  m.measurement_smoothing = 1.0;  // follow each measurement fully
  adaptive_preemption p(m);
  ASSERT_EQ(p.choose(7, 100), preempt_choice::swap);
  // The link turns out to move 4 GB/s (a shared or unpinned host path): 7 blocks take 29 ms, more than 10 ms.
  ASSERT_TRUE(p.observe_transfer(std::int64_t{4} << 30, 1.0737418));
  EXPECT_NEAR(p.link_bytes_per_second(), 4.0e9, 1e3);
  EXPECT_EQ(p.choose(7, 100), preempt_choice::recompute);
  // Prefill turns out to run at 2k tokens/s (a long context): recompute is 50 ms, swap wins again.
  ASSERT_TRUE(p.observe_prefill(2000, 1.0));
  EXPECT_NEAR(p.prefill_seconds_per_token(), 500e-6, 1e-12);
  EXPECT_EQ(p.choose(7, 100), preempt_choice::swap);

  swap_cost_model smooth = llama7b(100e-6);
  smooth.measurement_smoothing = 0.25;
  adaptive_preemption q(smooth);
  ASSERT_TRUE(q.observe_transfer(10'000'000'000, 1.0));
  EXPECT_NEAR(q.link_bytes_per_second(), 25.0e9 + 0.25 * (10.0e9 - 25.0e9), 1.0) << "a moving average";
}

TEST(SwapCostModel, BadMeasurementsChangeNothing) {
  adaptive_preemption p(llama7b(100e-6));
  const double bw = p.link_bytes_per_second();
  const double pf = p.prefill_seconds_per_token();
  EXPECT_EQ(p.observe_transfer(0, 1.0).code(), errc::invalid_argument);
  EXPECT_EQ(p.observe_transfer(100, 0.0).code(), errc::invalid_argument);
  EXPECT_EQ(p.observe_transfer(100, -1.0).code(), errc::invalid_argument);
  EXPECT_EQ(p.observe_transfer(100, std::nan("")).code(), errc::invalid_argument);
  EXPECT_EQ(p.observe_transfer(100, HUGE_VAL).code(), errc::invalid_argument);
  EXPECT_EQ(p.observe_transfer(INT64_MAX, 1e-320).code(), errc::invalid_argument) << "an infinite bandwidth";
  EXPECT_EQ(p.observe_prefill(-3, 1.0).code(), errc::invalid_argument);
  EXPECT_EQ(p.observe_prefill(10, std::nan("")).code(), errc::invalid_argument);
  EXPECT_EQ(p.link_bytes_per_second(), bw);
  EXPECT_EQ(p.prefill_seconds_per_token(), pf);
}

TEST(SwapCostModel, FrequentSwapsRaiseTheThresholdAndItRelaxesAgain) {
  swap_cost_model m = llama7b(60e-6);  // recompute 60 us a token against swap 42 us: swap by 1.43x
  m.frequency_penalty = 0.5;
  m.rate_smoothing = 0.2;
  adaptive_preemption p(m);
  ASSERT_EQ(p.choose(16, 256), preempt_choice::swap);
  // A storm: two swap-outs every step. The rate climbs towards 2 and the penalty towards 2x: swapping the same
  // victim now costs more than recomputing it.
  int steps_until_recompute = -1;
  for (int s = 1; s <= 50; ++s) {
    p.end_step(2);
    if (steps_until_recompute < 0 && p.choose(16, 256) == preempt_choice::recompute) steps_until_recompute = s;
  }
  EXPECT_GT(steps_until_recompute, 1) << "one busy step does not flip it";
  EXPECT_GT(p.swap_rate(), 1.9);
  EXPECT_NEAR(p.swap_penalty(), 1.0 + 0.5 * p.swap_rate(), 1e-12);
  // Quiet steps: the rate decays and swapping is chosen again.
  int quiet = 0;
  while (p.choose(16, 256) == preempt_choice::recompute && quiet < 100) {
    p.end_step(0);
    ++quiet;
  }
  EXPECT_GT(quiet, 1);
  EXPECT_LT(quiet, 100);
  EXPECT_EQ(p.choose(16, 256), preempt_choice::swap);
  p.end_step(-4);
  EXPECT_GE(p.swap_rate(), 0.0) << "a negative count is 0";
}

TEST(SwapCostModel, BadConfigsAreRejectedByName) {
  const auto bad = [](auto edit) {
    swap_cost_model m = llama7b(50e-6);
    edit(m);
    return m;
  };
  const std::vector<swap_cost_model> cases = {
      bad([](swap_cost_model& m) { m.block_bytes = 0; }),
      bad([](swap_cost_model& m) { m.link_bytes_per_second = 0.0; }),
      bad([](swap_cost_model& m) { m.link_bytes_per_second = HUGE_VAL; }),
      bad([](swap_cost_model& m) { m.prefill_seconds_per_token = 0.0; }),
      bad([](swap_cost_model& m) { m.prefill_seconds_per_token = std::nan(""); }),
      bad([](swap_cost_model& m) { m.frequency_penalty = -1.0; }),
      bad([](swap_cost_model& m) { m.rate_smoothing = 0.0; }),
      bad([](swap_cost_model& m) { m.rate_smoothing = 1.5; }),
      bad([](swap_cost_model& m) { m.measurement_smoothing = 0.0; }),
  };
  for (const swap_cost_model& m : cases) {
    const status st = m.validate();
    EXPECT_EQ(st.code(), errc::invalid_argument);
    EXPECT_NE(std::string_view(st.message()).find("swap_cost_model:"), std::string_view::npos) << st.message();
    EXPECT_EQ(adaptive_preemption::create(m).code(), errc::invalid_argument);
    const adaptive_preemption p(m);
    EXPECT_EQ(p.choose(1, 1'000'000), preempt_choice::recompute) << "an invalid model never swaps";
  }
  EXPECT_EQ(swap_cost_model{}.validate().code(), errc::invalid_argument) << "block_bytes must be configured";
  EXPECT_TRUE(adaptive_preemption::create(llama7b(50e-6)).ok());
}
