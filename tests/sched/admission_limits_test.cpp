// SPDX-License-Identifier: Apache-2.0
// admission_limits alone: the watermark, the limits and the admission answer from plain numbers.
#include <kvpager/sched/admission_limits.hpp>

#include <gtest/gtest.h>

using namespace kvpager;

TEST(AdmissionLimits, WatermarkIsPermilleOfUsableBlocksClamped) {
  const admission_limits l{.usable_blocks = 500, .block_size = 16, .max_blocks_per_seq = 0};
  scheduler_config cfg;
  cfg.watermark_permille = 100;
  EXPECT_EQ(l.watermark_blocks(cfg), 50);
  cfg.watermark_permille = -5;
  EXPECT_EQ(l.watermark_blocks(cfg), 0);
  cfg.watermark_permille = 2000;
  EXPECT_EQ(l.watermark_blocks(cfg), 500);
}

TEST(AdmissionLimits, IdleKeepsNoWatermarkUnlessAsked) {
  const admission_limits l{.usable_blocks = 500, .block_size = 16, .max_blocks_per_seq = 0};
  scheduler_config cfg;
  cfg.watermark_permille = 100;
  EXPECT_EQ(l.blocks_to_keep(cfg, false, 7), 50);
  EXPECT_EQ(l.blocks_to_keep(cfg, true, 7), 0);
  cfg.watermark_when_idle = true;
  EXPECT_EQ(l.blocks_to_keep(cfg, true, 7), 50);
}

TEST(AdmissionLimits, SeedHeadroomKeepsATenthOfTheRequest) {
  const admission_limits l{.usable_blocks = 500, .block_size = 16, .max_blocks_per_seq = 0};
  scheduler_config cfg;
  cfg.admit_rule = admission_rule::request_headroom;  // headroom_permille 100: free >= 1.1 x needed
  EXPECT_EQ(admission_limits::headroom_blocks(cfg, 90), 9);
  EXPECT_EQ(admission_limits::headroom_blocks(cfg, 91), 10) << "rounded up: 91 x 1.1 = 100.1 blocks must be free";
  EXPECT_EQ(admission_limits::headroom_blocks(cfg, 0), 0);
  EXPECT_EQ(l.blocks_to_keep(cfg, false, 90), 9);
  EXPECT_EQ(l.blocks_to_keep(cfg, true, 90), 0) << "idle: nothing kept unless watermark_when_idle";
  EXPECT_TRUE(l.keeps_blocks(cfg, false));
  EXPECT_FALSE(l.keeps_blocks(cfg, true));
  // The seed's numbers: 100 of 500 blocks free. The seed admits up to 90 blocks (99 <= 100 < 100.1) ...
  EXPECT_EQ(l.check(cfg, 90 * 16, 100), admission::ok);
  EXPECT_EQ(l.check(cfg, 90 * 16 + 1, 100), admission::later);
  // ... a 10% watermark up to 50 (100 - 50 = 50 kept).
  scheduler_config wm;
  wm.watermark_permille = 100;
  EXPECT_EQ(l.check(wm, 50 * 16, 100), admission::ok);
  EXPECT_EQ(l.check(wm, 50 * 16 + 1, 100), admission::later);
  // NEVER: the largest request the seed's rule admits into an empty pool is 454 blocks (454 + 46 = 500).
  EXPECT_EQ(l.check(cfg, 454 * 16, 500), admission::ok);
  EXPECT_EQ(l.check(cfg, 455 * 16, 500), admission::never);
  cfg.headroom_permille = 0;
  EXPECT_FALSE(l.keeps_blocks(cfg, false));
  EXPECT_EQ(l.check(cfg, 500 * 16, 500), admission::ok) << "no headroom: the whole pool";
}

TEST(AdmissionLimits, AnswersOkLaterNever) {
  const admission_limits l{.usable_blocks = 500, .block_size = 16, .max_blocks_per_seq = 0};
  scheduler_config cfg;
  cfg.watermark_permille = 100;  // 50 blocks kept
  EXPECT_EQ(l.check(cfg, 50 * 16, 100), admission::ok) << "100 free - 50 needed = 50 kept";
  EXPECT_EQ(l.check(cfg, 50 * 16 + 1, 100), admission::later) << "51 blocks would leave 49";
  EXPECT_EQ(l.check(cfg, 450 * 16, 500), admission::ok);
  EXPECT_EQ(l.check(cfg, 450 * 16 + 1, 500), admission::never) << "451 blocks + 50 kept exceed 500";
  EXPECT_EQ(l.check(cfg, 0, 500), admission::never);
  cfg.max_num_seqs = 0;
  EXPECT_EQ(l.check(cfg, 16, 500), admission::never) << "a configuration that runs nothing";
}

TEST(AdmissionLimits, LengthCapAppliesWhateverRejectImpossibleSays) {
  const admission_limits l{.usable_blocks = 100, .block_size = 16, .max_blocks_per_seq = 4};
  scheduler_config cfg;
  EXPECT_FALSE(l.limit_reached(cfg, 64, false));
  EXPECT_EQ(l.limit_reached(cfg, 65, false), finish_reason::length_cap);
  cfg.reject_impossible = false;
  EXPECT_EQ(l.limit_reached(cfg, 65, false), finish_reason::length_cap);
  const admission_limits big{.usable_blocks = 100, .block_size = 16, .max_blocks_per_seq = 0};
  EXPECT_FALSE(big.limit_reached(cfg, 101 * 16, false)) << "vLLM queues what cannot fit";
  cfg.reject_impossible = true;
  EXPECT_EQ(big.limit_reached(cfg, 101 * 16, false), finish_reason::too_long);
  cfg.chunked_prefill = false;
  cfg.max_num_batched_tokens = 32;
  EXPECT_EQ(big.limit_reached(cfg, 33, true), finish_reason::too_long) << "a whole prompt over the budget";
  EXPECT_FALSE(big.limit_reached(cfg, 33, false)) << "a running request computes one token at a time";
}
