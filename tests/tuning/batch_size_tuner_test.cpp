// SPDX-License-Identifier: Apache-2.0
// Dynamic max batch size on synthetic signals: shrinks on high utilization or a preemption, grows below the low
// threshold, bounded, with hysteresis (patience and cooldown), and settles without oscillating on steady loads.
#include <kvpager/tuning/batch_size_tuner.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

using namespace kvpager;

namespace {
batch_size_tuning tuning(std::int32_t min_seqs, std::int32_t max_seqs) {
  batch_size_tuning t;
  t.enabled = true;
  t.min_seqs = min_seqs;
  t.max_seqs = max_seqs;
  return t;
}
}  // namespace

TEST(BatchSizeTuner, DisabledHoldsWithoutLimit) {
  batch_size_tuner off;
  EXPECT_FALSE(off.enabled());
  EXPECT_EQ(off.limit(), INT32_MAX);
  EXPECT_EQ(off.update(1.0, 5), batch_size_change::hold);
  batch_size_tuning t = tuning(1, 8);
  t.enabled = false;
  batch_size_tuner not_enabled(t);
  EXPECT_EQ(not_enabled.update(0.99, 1), batch_size_change::hold);
  EXPECT_EQ(not_enabled.limit(), INT32_MAX);
}

TEST(BatchSizeTuner, BadConfigsAreRejectedByName) {
  const auto bad = [](auto edit) {
    batch_size_tuning t = tuning(2, 16);
    edit(t);
    return t;
  };
  const std::vector<batch_size_tuning> cases = {
      bad([](batch_size_tuning& t) { t.min_seqs = 0; }),
      bad([](batch_size_tuning& t) { t.max_seqs = 1; }),
      bad([](batch_size_tuning& t) { t.initial_seqs = 17; }),
      bad([](batch_size_tuning& t) { t.initial_seqs = 1; }),
      bad([](batch_size_tuning& t) { t.low_utilization = 0.9; }),  // low == high: no band
      bad([](batch_size_tuning& t) { t.high_utilization = 1.5; }),
      bad([](batch_size_tuning& t) { t.low_utilization = -0.1; }),
      bad([](batch_size_tuning& t) { t.high_utilization = __builtin_nan(""); }),
      bad([](batch_size_tuning& t) { t.shrink_permille = 1000; }),
      bad([](batch_size_tuning& t) { t.shrink_permille = -1; }),
      bad([](batch_size_tuning& t) { t.grow_step = 0; }),
      bad([](batch_size_tuning& t) { t.patience_steps = 0; }),
      bad([](batch_size_tuning& t) { t.cooldown_steps = -1; }),
  };
  for (const batch_size_tuning& t : cases) {
    const status st = t.validate();
    EXPECT_EQ(st.code(), errc::invalid_argument);
    EXPECT_NE(std::string_view(st.message()).find("batch_size_tuning:"), std::string_view::npos) << st.message();
    EXPECT_EQ(batch_size_tuner::create(t).code(), errc::invalid_argument);
    batch_size_tuner constructed(t);
    EXPECT_FALSE(constructed.enabled()) << "a bad config gives a disabled tuner, not a half-configured one";
  }
  EXPECT_TRUE(tuning(2, 16).validate());
  EXPECT_TRUE(batch_size_tuner::create(tuning(2, 16)).ok());
}

TEST(BatchSizeTuner, ShrinksAfterPatienceAboveHighAndAtOnceOnPreemption) {
  batch_size_tuning t = tuning(1, 100);
  t.patience_steps = 3;
  t.cooldown_steps = 0;
  batch_size_tuner b(t);
  EXPECT_EQ(b.limit(), 100) << "initial_seqs 0 starts at max_seqs";
  EXPECT_EQ(b.update(0.95, 0), batch_size_change::hold);
  EXPECT_EQ(b.update(0.95, 0), batch_size_change::hold);
  EXPECT_EQ(b.update(0.95, 0), batch_size_change::shrink) << "third consecutive step above 0.90";
  EXPECT_EQ(b.limit(), 75);
  EXPECT_EQ(b.update(0.50, 1), batch_size_change::shrink) << "a preemption shrinks at once, whatever utilization";
  EXPECT_EQ(b.limit(), 56);
  EXPECT_EQ(b.shrinks(), 2);
  EXPECT_EQ(b.grows(), 0);
}

TEST(BatchSizeTuner, GrowsAfterPatienceBelowLowAndStaysInBounds) {
  batch_size_tuning t = tuning(4, 10);
  t.initial_seqs = 4;
  t.grow_step = 2;
  t.patience_steps = 2;
  t.cooldown_steps = 0;
  batch_size_tuner b(t);
  std::vector<std::int32_t> limits;
  for (int i = 0; i < 12; ++i) {
    (void)b.update(0.10, 0);
    limits.push_back(b.limit());
  }
  EXPECT_EQ(limits, (std::vector<std::int32_t>{4, 6, 6, 8, 8, 10, 10, 10, 10, 10, 10, 10}));
  EXPECT_EQ(b.grows(), 3) << "no growth is counted at the bound";
  for (int i = 0; i < 40; ++i) (void)b.update(1.0, 3);
  EXPECT_EQ(b.limit(), 4) << "never below min_seqs";
  const std::int64_t shrinks = b.shrinks();
  EXPECT_EQ(b.update(1.0, 3), batch_size_change::hold) << "at min_seqs a shrink is no change";
  EXPECT_EQ(b.shrinks(), shrinks);
}

TEST(BatchSizeTuner, CooldownHoldsAfterEveryChange) {
  batch_size_tuning t = tuning(1, 64);
  t.cooldown_steps = 5;
  batch_size_tuner b(t);
  ASSERT_EQ(b.update(0.5, 1), batch_size_change::shrink);
  const std::int32_t after = b.limit();
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(b.update(0.99, 2), batch_size_change::hold) << "step " << i << " of the cooldown";
    EXPECT_EQ(b.limit(), after);
  }
  EXPECT_EQ(b.update(0.99, 2), batch_size_change::shrink) << "the cooldown is over";
}

TEST(BatchSizeTuner, HysteresisIgnoresSignalsThatFlipEveryStepOrStayInTheBand) {
  batch_size_tuning t = tuning(1, 64);
  t.initial_seqs = 32;
  t.patience_steps = 2;
  batch_size_tuner b(t);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(b.update(i % 2 == 0 ? 0.97 : 0.20, 0), batch_size_change::hold);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(b.update(0.60 + 0.30 * (i % 7) / 6.0, 0), batch_size_change::hold);
  EXPECT_EQ(b.update(__builtin_nan(""), 0), batch_size_change::hold) << "NaN counts as inside the band";
  EXPECT_EQ(b.limit(), 32);
}

namespace {
/// A steady load: `demand` requests always want to run, each holding `share` of the pool. Requests finish after
/// `lifetime` steps; at most `admit_per_step` are admitted per step, up to the tuner's limit. Utilization above 1
/// is a shortage: the scheduler preempts the excess (one preemption signal, running trimmed to what fits).
struct steady_load {
  double share;
  std::int32_t demand;
  std::int32_t lifetime;
  std::int32_t admit_per_step;
  std::uint32_t noise_seed;  ///< 0: no noise; else +-1% deterministic jitter on the utilization signal

  struct run {
    std::vector<std::int32_t> limits;
    std::vector<batch_size_change> changes;
    double utilization = 0;  ///< the last step's, without noise
  };

  run simulate(batch_size_tuner& b, int steps) const {
    run out;
    std::vector<std::int32_t> ages;  // one entry per running request: steps run
    std::uint32_t rng = noise_seed;
    for (int s = 0; s < steps; ++s) {
      for (auto& a : ages) ++a;
      std::erase_if(ages, [&](std::int32_t a) { return a >= lifetime; });  // finished: replaced by new demand
      const auto limit = std::min(b.limit(), demand);
      for (int i = 0; i < admit_per_step && static_cast<std::int32_t>(ages.size()) < limit; ++i) ages.push_back(0);
      std::int32_t preemptions = 0;
      while (static_cast<double>(ages.size()) * share > 1.0) {  // shortage: the newest is preempted
        ages.pop_back();
        ++preemptions;
      }
      double u = static_cast<double>(ages.size()) * share;
      out.utilization = u;
      if (noise_seed != 0) {
        rng = rng * 1664525U + 1013904223U;
        u += (static_cast<double>(rng >> 8) / 16777216.0 - 0.5) * 0.02;
      }
      out.changes.push_back(b.update(u, preemptions));
      out.limits.push_back(b.limit());
    }
    return out;
  }
};
}  // namespace

TEST(BatchSizeTuner, SettlesAndDoesNotOscillateOnSteadyLoads) {
  const std::vector<steady_load> loads = {
      {0.004, 1000, 50, 8, 0},   // 250 requests fill the pool: the limit must come down from 256
      {0.004, 1000, 50, 8, 7},   // the same with noise
      {0.010, 1000, 20, 4, 0},   // 100 fill it
      {0.010, 1000, 20, 4, 11},
      {0.002, 1000, 200, 16, 3},  // 500 would fill it: max_seqs 256 is never a shortage, it stays at the top
      {0.030, 1000, 30, 2, 5},   // 33 fill it
  };
  for (std::size_t i = 0; i < loads.size(); ++i) {
    batch_size_tuning t = tuning(1, 256);
    batch_size_tuner b(t);
    const auto r = loads[i].simulate(b, 4000);
    // Settled: in the second half of the run the limit never changes.
    const auto changed = std::count_if(r.changes.begin() + 2000, r.changes.end(),
                                       [](batch_size_change c) { return c != batch_size_change::hold; });
    EXPECT_EQ(changed, 0) << "load " << i << " oscillates (final limit " << b.limit() << ")";
    // And settled where it should: utilization inside the band (noise aside), or below it with the limit not
    // binding (at max_seqs, or above what the admission rate keeps running).
    const auto running = static_cast<std::int32_t>(r.utilization / loads[i].share + 0.5);
    EXPECT_LE(r.utilization, t.high_utilization + 0.011) << "load " << i;
    if (running == b.limit() && b.limit() < t.max_seqs) {
      EXPECT_GE(r.utilization, t.low_utilization - 0.011) << "load " << i;
    }
    // Never a direction reversal after the first shrink phase: at most one change of direction in total.
    int reversals = 0;
    batch_size_change last = batch_size_change::hold;
    for (const batch_size_change c : r.changes) {
      if (c == batch_size_change::hold) continue;
      if (last != batch_size_change::hold && c != last) ++reversals;
      last = c;
    }
    EXPECT_LE(reversals, 1) << "load " << i;
  }
}

TEST(BatchSizeTuner, ShrinksUnderPressureThenGrowsBackWhenLoadDrops) {
  batch_size_tuning t = tuning(2, 128);
  batch_size_tuner b(t);
  steady_load heavy{0.02, 1000, 40, 8, 0};  // 50 requests fill the pool
  (void)heavy.simulate(b, 1500);
  const std::int32_t under_pressure = b.limit();
  EXPECT_LT(under_pressure, 50);
  EXPECT_GT(under_pressure * 0.02, t.low_utilization - 0.02);
  // The load drops: each request holds a quarter of what it did; utilization falls below the band and the limit
  // grows until it is back inside (or at max_seqs).
  steady_load light{0.005, 1000, 40, 8, 0};
  (void)light.simulate(b, 6000);
  EXPECT_GT(b.limit(), under_pressure);
  EXPECT_GE(std::min(b.limit(), 1000) * 0.005, t.low_utilization);
}
