// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// IEEE fp16 and bfloat16 <-> float conversions in portable C++ (round to nearest even), for the CPU kernels and
/// the tests' reference. Bit-exact with hardware conversions for every input, NaN payloads aside.

#include <bit>
#include <cstdint>

#include "kvpager/core/config.hpp"

KVPAGER_NAMESPACE_BEGIN
namespace detail {

[[nodiscard]] inline float half_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000U) << 16;
  std::uint32_t exp = (h >> 10) & 0x1FU;
  std::uint32_t mant = h & 0x3FFU;
  if (exp == 0x1FU) return std::bit_cast<float>(sign | 0x7F800000U | (mant << 13));  // inf / nan
  if (exp == 0) {
    if (mant == 0) return std::bit_cast<float>(sign);
    exp = 127 - 15 + 1;  // subnormal: normalize
    while ((mant & 0x400U) == 0) {
      mant <<= 1;
      --exp;
    }
    mant &= 0x3FFU;
    return std::bit_cast<float>(sign | (exp << 23) | (mant << 13));
  }
  return std::bit_cast<float>(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

[[nodiscard]] inline std::uint16_t float_to_half(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000U);
  const std::uint32_t exp = (x >> 23) & 0xFFU;
  std::uint32_t mant = x & 0x7FFFFFU;
  if (exp == 0xFFU) return static_cast<std::uint16_t>(sign | 0x7C00U | (mant != 0 ? 0x200U : 0U));
  const int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 0x1F) return static_cast<std::uint16_t>(sign | 0x7C00U);  // overflow -> inf
  if (e <= 0) {                                                     // subnormal or zero
    if (e < -10) return sign;
    mant |= 0x800000U;
    const auto shift = static_cast<std::uint32_t>(14 - e);
    std::uint32_t half_mant = mant >> shift;
    const std::uint32_t rem = mant & ((1U << shift) - 1U), halfway = 1U << (shift - 1U);
    if (rem > halfway || (rem == halfway && (half_mant & 1U) != 0)) ++half_mant;
    return static_cast<std::uint16_t>(sign | half_mant);
  }
  std::uint32_t h = (static_cast<std::uint32_t>(e) << 10) | (mant >> 13);
  const std::uint32_t rem = mant & 0x1FFFU;
  if (rem > 0x1000U || (rem == 0x1000U && (h & 1U) != 0)) ++h;  // may carry into the exponent: still correct
  return static_cast<std::uint16_t>(sign | h);
}

[[nodiscard]] inline float bf16_to_float(std::uint16_t b) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

[[nodiscard]] inline std::uint16_t float_to_bf16(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7F800000U) == 0x7F800000U && (x & 0x7FFFFFU) != 0) return static_cast<std::uint16_t>((x >> 16) | 0x40U);
  const std::uint32_t rounding = 0x7FFFU + ((x >> 16) & 1U);
  return static_cast<std::uint16_t>((x + rounding) >> 16);
}

}  // namespace detail
KVPAGER_NAMESPACE_END
