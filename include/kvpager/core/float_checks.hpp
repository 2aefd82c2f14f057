// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Classifying doubles without <cmath>: is_finite, is_nan and an infinity, for headers that only need these. <cmath>
/// (with its C++17 special functions) is among the costliest standard headers to compile, and a consumer of
/// <kvpager/kvpager.hpp> should not pay for it (bench/RESULTS.md, "Consumer build"). Exact for every IEEE double, as
/// std::isfinite, std::isnan and HUGE_VAL are, and written without == on doubles (clean under -Wfloat-equal).

#include <limits>

#include "kvpager/core/config.hpp"

KVPAGER_NAMESPACE_BEGIN

namespace detail {

/// std::isfinite(x): neither infinite nor NaN (NaN fails both comparisons).
[[nodiscard]] constexpr bool is_finite(double x) noexcept {
  return x >= -std::numeric_limits<double>::max() && x <= std::numeric_limits<double>::max();
}

/// std::isnan(x): the only value neither <= 0 nor >= 0.
[[nodiscard]] constexpr bool is_nan(double x) noexcept { return !(x <= 0.0) && !(x >= 0.0); }

/// HUGE_VAL: positive infinity.
inline constexpr double infinity = std::numeric_limits<double>::infinity();

}  // namespace detail

KVPAGER_NAMESPACE_END
