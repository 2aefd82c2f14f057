// SPDX-License-Identifier: Apache-2.0
// Priority aging: boosts, the per-step tick, and the bound on the longest wait (max_overtakers, wait_bound). The
// bound is checked against the real scheduler with adversarial arrivals in tests/sched/tuning_test.cpp.
#include <kvpager/tuning/priority_aging.hpp>

#include <gtest/gtest.h>

#include <cstdint>

using namespace kvpager;

TEST(PriorityAging, BoostIsOneLevelPerStepsPerLevel) {
  constexpr priority_aging off{};
  static_assert(!off.enabled());
  EXPECT_EQ(off.boost(1000), 0);
  constexpr priority_aging every3{3};
  static_assert(every3.boost(9) == 3);
  EXPECT_EQ(every3.boost(0), 0);
  EXPECT_EQ(every3.boost(2), 0);
  EXPECT_EQ(every3.boost(3), 1);
  EXPECT_EQ(every3.boost(-5), 0);
}

TEST(PriorityAging, TickKeepsAgedEqualToBoostAndSaturates) {
  const priority_aging a{4};
  std::int32_t waited = 0;
  std::int64_t aged = 0;
  for (std::int64_t step = 1; step <= 100; ++step) {
    a.tick(waited, aged);
    ASSERT_EQ(aged, a.boost(step)) << "after " << step << " steps";
  }
  aged = INT64_MAX;
  for (int i = 0; i < 8; ++i) a.tick(waited, aged);
  EXPECT_EQ(aged, INT64_MAX);
  std::int32_t w = 0;
  std::int64_t g = 0;
  priority_aging{}.tick(w, g);
  EXPECT_EQ(w, 0) << "no aging: the counters do not move";
}

TEST(PriorityAging, ValidateRejectsNegativeSteps) {
  EXPECT_TRUE(priority_aging{0}.validate());
  EXPECT_TRUE(priority_aging{5}.validate());
  const status st = priority_aging{-1}.validate();
  EXPECT_EQ(st.code(), errc::invalid_argument);
  EXPECT_EQ(st.detail(), -1);
}

TEST(PriorityAging, OvertakersAndWaitBound) {
  const priority_aging a{5};
  // W queued ahead + A x k x P joining in R's first k x P steps.
  EXPECT_EQ(a.max_overtakers(3, 2, 4), 3 + 2 * 5 * 4);
  EXPECT_EQ(a.max_overtakers(3, 2, 4, /*front_entries=*/true), 3 + 2 * 5 * 5);
  EXPECT_EQ(a.wait_bound(3, 2, 4, 1), 3 + 2 * 5 * 4 + 1);
  EXPECT_EQ(a.wait_bound(3, 2, 4, 3), 3 * (3 + 2 * 5 * 4 + 1));
  EXPECT_EQ(a.max_overtakers(7, 0, 100), 7) << "no arrivals: only those already queued";
  EXPECT_EQ(a.max_overtakers(7, 9, 0), 7) << "no higher priority: first come first served";
  EXPECT_EQ(a.max_overtakers(-1, -1, -1), 0);
  // Without aging only the trivial cases have a bound.
  EXPECT_FALSE(priority_aging{}.max_overtakers(0, 1, 1).has_value()) << "starvation is possible";
  EXPECT_EQ(priority_aging{}.max_overtakers(4, 1, 0), 4);
  EXPECT_FALSE(a.wait_bound(0, 1, 1, 0).has_value()) << "S must be at least 1";
  // Overflow gives no bound rather than a wrong one.
  EXPECT_FALSE(a.max_overtakers(0, INT64_MAX / 2, INT64_MAX / 2).has_value());
  EXPECT_FALSE(a.max_overtakers(INT64_MAX, 1, 1).has_value());
  EXPECT_FALSE(a.max_overtakers(0, 1, INT64_MAX, true).has_value());
  EXPECT_FALSE(a.wait_bound(INT64_MAX, 0, 0, 1).has_value());
}
