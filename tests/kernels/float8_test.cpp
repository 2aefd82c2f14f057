// SPDX-License-Identifier: Apache-2.0
// fp8 E4M3 conversions (kvpager/kernels/float8.hpp) against a reference built here independently: the 256 codes'
// values from the format's definition (std::ldexp), and float -> e4m3 as "the nearest finite code, ties to the even
// code, saturated to +-448" found by searching all codes.
#include <kvpager/kernels/float8.hpp>

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace {

using kvpager::detail::e4m3_to_float;
using kvpager::detail::float_to_e4m3;

/// The value of code c by the format's definition: (-1)^s x 2^(e-7) x (1 + m/8), subnormal 2^-6 x m/8, NaN for
/// S.1111.111.
double definition(int c) {
  const int s = c >> 7, e = (c >> 3) & 0xF, m = c & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s != 0 ? -mag : mag;
}

/// The nearest finite code to x (in exact double arithmetic), ties to the code with an even low bit; beyond +-448
/// +-448; NaN -> NaN with x's sign. Zero keeps its sign.
int reference(float x) {
  if (std::isnan(x)) return (std::signbit(x) ? 0x80 : 0) | 0x7F;
  if (std::fabs(x) > 448.0F) return (std::signbit(x) ? 0x80 : 0) | 0x7E;  // saturation (infinities too)
  const double v = x;
  int best = -1;
  double best_err = 0;
  for (int c = 0; c < 256; ++c) {
    const double cv = definition(c);
    if (std::isnan(cv)) continue;
    if (cv == 0.0 && (c == 0x80) != std::signbit(x)) continue;  // +0 for +x, -0 for -x
    const double err = std::fabs(cv - v);
    if (best < 0 || err < best_err || (err == best_err && (c & 1) == 0 && (best & 1) != 0)) {
      best = c;
      best_err = err;
    }
  }
  return best;
}

TEST(Float8, EveryCodeDecodesToItsDefinitionAndRoundTrips) {
  int nans = 0;
  for (int c = 0; c < 256; ++c) {
    const auto b = static_cast<std::uint8_t>(c);
    const float f = e4m3_to_float(b);
    const double want = definition(c);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(f)) << c;
      EXPECT_EQ(std::signbit(f), c >= 0x80) << c;
      EXPECT_EQ(float_to_e4m3(f), b) << "NaN keeps its sign: " << c;
      ++nans;
      continue;
    }
    EXPECT_EQ(static_cast<double>(f), want) << c;
    EXPECT_EQ(std::signbit(f), c >= 0x80) << c;
    EXPECT_EQ(float_to_e4m3(f), b) << "round trip of code " << c;
  }
  EXPECT_EQ(nans, 2);
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0F);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0F, -9));
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0F, -6));
}

TEST(Float8, TiesRoundToEvenAndNeighboursRoundToNearest) {
  // Every midpoint between adjacent finite codes of one sign, and the floats just below and above it.
  int ties = 0;
  for (int sign : {0, 0x80}) {
    for (int c = 0; c < 0x7E; ++c) {
      const double lo = definition(sign | c), hi = definition(sign | (c + 1));
      const auto mid = static_cast<float>((lo + hi) / 2);  // exact: fewer than 24 significant bits
      ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
      const int even = (c & 1) == 0 ? c : c + 1;
      EXPECT_EQ(float_to_e4m3(mid), sign | even) << "tie between codes " << (sign | c) << " and " << (sign | (c + 1));
      EXPECT_EQ(float_to_e4m3(std::nextafter(mid, 0.0F)), sign | c) << c;
      EXPECT_EQ(float_to_e4m3(std::nextafter(mid, sign != 0 ? -1e9F : 1e9F)), sign | (c + 1)) << c;
      for (float x : {mid, std::nextafter(mid, 0.0F), std::nextafter(mid, 1e9F), std::nextafter(mid, -1e9F)})
        EXPECT_EQ(float_to_e4m3(x), reference(x)) << x;
      ++ties;
    }
  }
  EXPECT_EQ(ties, 2 * 126);
  // Ties named explicitly: 2^-10 (half the smallest subnormal) -> 0; 7.5 x 2^-9 -> 2^-6 (code 8, even);
  // 1.0625 (between 1 and 1.125) -> 1; 1.1875 (between 1.125 and 1.25) -> 1.25.
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0F, -10)), 0x00);
  EXPECT_EQ(float_to_e4m3(std::ldexp(3.0F, -10)), 0x02);  // 1.5 x 2^-9: between codes 1 and 2 -> 2
  EXPECT_EQ(float_to_e4m3(7.5F * std::ldexp(1.0F, -9)), 0x08);
  EXPECT_EQ(float_to_e4m3(1.0625F), 0x38);
  EXPECT_EQ(float_to_e4m3(1.1875F), 0x3A);
  EXPECT_EQ(float_to_e4m3(-1.1875F), 0xBA);
}

TEST(Float8, SaturatesToMaxAndKeepsNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {448.0F, 449.0F, 464.0F, 465.0F, 480.0F, 1e6F, 3.4e38F, inf}) {
    EXPECT_EQ(float_to_e4m3(x), 0x7E) << x;
    EXPECT_EQ(float_to_e4m3(-x), 0xFE) << x;
  }
  EXPECT_EQ(float_to_e4m3(std::nextafter(448.0F, 0.0F)), 0x7E);  // rounds up to 448 (nearest)
  EXPECT_EQ(float_to_e4m3(432.0F), 0x7E);                        // tie 416 | 448 -> 448 (code 0x7E even)
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(float_to_e4m3(-std::numeric_limits<float>::quiet_NaN()), 0xFF);
  EXPECT_EQ(float_to_e4m3(std::bit_cast<float>(0x7F800001U)), 0x7F);  // signalling NaN: still NaN
}

TEST(Float8, SubnormalsAndZeros) {
  EXPECT_EQ(float_to_e4m3(0.0F), 0x00);
  EXPECT_EQ(float_to_e4m3(-0.0F), 0x80);
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::denorm_min()), 0x00);
  EXPECT_EQ(float_to_e4m3(-std::numeric_limits<float>::min()), 0x80);
  for (int m = 1; m < 8; ++m) {
    const float x = std::ldexp(static_cast<float>(m), -9);
    EXPECT_EQ(float_to_e4m3(x), m);
    EXPECT_EQ(float_to_e4m3(-x), 0x80 | m);
    EXPECT_EQ(e4m3_to_float(static_cast<std::uint8_t>(m)), x);
  }
  EXPECT_EQ(float_to_e4m3(std::nextafter(std::ldexp(1.0F, -10), 1.0F)), 0x01);  // just above half of 2^-9
}

TEST(Float8, RandomFloatsMatchTheExhaustiveReference) {
  std::mt19937 rng(12);
  std::uniform_int_distribution<std::uint32_t> bits;
  std::uniform_real_distribution<float> exponent(-14.0F, 10.0F);
  for (int i = 0; i < 20000; ++i) {
    // Half uniformly random bit patterns (any float, NaN included), half in e4m3's own range.
    const float x = i % 2 == 0 ? std::bit_cast<float>(bits(rng))
                               : std::exp2(exponent(rng)) * (bits(rng) % 2 == 0 ? 1.0F : -1.0F);
    ASSERT_EQ(float_to_e4m3(x), reference(x)) << x << " bits " << std::bit_cast<std::uint32_t>(x);
  }
}

}  // namespace
