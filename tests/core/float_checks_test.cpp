// SPDX-License-Identifier: Apache-2.0
// core/float_checks.hpp against <cmath> over the special and boundary doubles.
#include <kvpager/core/float_checks.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace {
using lim = std::numeric_limits<double>;

TEST(FloatChecks, AgreeWithCmathOnEveryKindOfDouble) {
  const double values[] = {0.0,         -0.0,           1.0,          -1.0,         lim::max(),  -lim::max(),
                           lim::min(),  lim::denorm_min(), -lim::denorm_min(), lim::infinity(), -lim::infinity(),
                           lim::quiet_NaN(), -lim::quiet_NaN(), lim::signaling_NaN(), 1e308 * 10.0 / 10.0};
  for (const double x : values) {
    EXPECT_EQ(kvpager::detail::is_finite(x), std::isfinite(x)) << x;
    EXPECT_EQ(kvpager::detail::is_nan(x), std::isnan(x)) << x;
  }
  EXPECT_EQ(kvpager::detail::infinity, HUGE_VAL);
  static_assert(kvpager::detail::is_finite(1.0) && !kvpager::detail::is_finite(kvpager::detail::infinity));
  static_assert(kvpager::detail::is_nan(lim::quiet_NaN()) && !kvpager::detail::is_nan(0.0));
}
}  // namespace
