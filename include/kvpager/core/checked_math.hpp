// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Checked 64-bit arithmetic for byte and token counts computed from user input: products and sums that report
/// overflow instead of wrapping (signed overflow is undefined behaviour), and saturating versions for counters,
/// which must never go negative in an export. constexpr, noexcept, header-only (GCC/Clang builtins).

#include <cstdint>
#include <limits>
#include <optional>

#include "kvpager/core/config.hpp"

KVPAGER_NAMESPACE_BEGIN

namespace detail {
__extension__ typedef __int128 checked_i128;  // a GCC/Clang extension; __extension__ keeps -Wpedantic quiet
}  // namespace detail

/// a x b, or nullopt where the product does not fit in int64.
[[nodiscard]] constexpr std::optional<std::int64_t> checked_mul(std::int64_t a, std::int64_t b) noexcept {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

/// a + b, or nullopt where the sum does not fit in int64.
[[nodiscard]] constexpr std::optional<std::int64_t> checked_add(std::int64_t a, std::int64_t b) noexcept {
  std::int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

/// a x b saturated to [INT64_MIN, INT64_MAX].
[[nodiscard]] constexpr std::int64_t saturating_mul(std::int64_t a, std::int64_t b) noexcept {
  std::int64_t r = 0;
  if (!__builtin_mul_overflow(a, b, &r)) return r;
  return (a < 0) != (b < 0) ? std::numeric_limits<std::int64_t>::min() : std::numeric_limits<std::int64_t>::max();
}

/// a + b saturated to [INT64_MIN, INT64_MAX].
[[nodiscard]] constexpr std::int64_t saturating_add(std::int64_t a, std::int64_t b) noexcept {
  std::int64_t r = 0;
  if (!__builtin_add_overflow(a, b, &r)) return r;
  return b < 0 ? std::numeric_limits<std::int64_t>::min() : std::numeric_limits<std::int64_t>::max();
}

/// x x num / den for x, num >= 0 and den > 0 without forming x x num when it overflows (exact while the result
/// fits), saturated to INT64_MAX; 0 for a non-positive den.
[[nodiscard]] constexpr std::int64_t saturating_mul_div(std::int64_t x, std::int64_t num, std::int64_t den) noexcept {
  if (den <= 0) return 0;
  if (const auto p = checked_mul(x, num)) return *p / den;
  // x num = (q den + r) num with q = x / den, r = x % den: q num + r num / den.
  const std::int64_t q = x / den, r = x % den;
  const auto rn = checked_mul(r, num);  // r < den, so r num / den < num fits; r num itself may not
  const std::int64_t tail = rn ? *rn / den
                               : static_cast<std::int64_t>(static_cast<detail::checked_i128>(r) * num / den);
  return saturating_add(saturating_mul(q, num), tail);
}

KVPAGER_NAMESPACE_END
