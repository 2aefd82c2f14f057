// SPDX-License-Identifier: Apache-2.0
// The CPU kernels' exp (kernels/cpu/vec_math.inc) on every instruction set this CPU runs, against std::exp in double:
// vexp over the range it is documented for, and vexp_nonpos (the softmax's exp: vscalefps on AVX-512) over x <= 0,
// its subnormal results, -inf and NaN; and swap_lanes, with which the decode's softmax adds in a fixed order. Measured
// here (Zen 5): vexp 1.18-1.20 ulp at worst on every path, vexp_nonpos 0.86 on AVX-512 (vscalefps) and 1.21 elsewhere.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/vec_ops.hpp"

namespace {

// Each instruction set's functions over whole arrays (n a multiple of 16).
using eval_fn = void (*)(const float*, float*, int, bool);
using swap_fn = void (*)(const float*, float*, int);

namespace portable_t {
struct isa : kvpager::kernels::detail::scalar_vec {};
#include "kernels/cpu/vec_math.inc"
void eval(const float* x, float* y, int n, bool nonpos) {
  for (int i = 0; i < n; i += isa::W) isa::storef(y + i, nonpos ? vexp_nonpos(isa::loadf(x + i)) : vexp(isa::loadf(x + i)));
}
void swap(const float* x, float* y, int d) { isa::storef(y, isa::swap_lanes(isa::loadf(x), d)); }
}  // namespace portable_t

#if defined(KVPAGER_HAVE_X86_VEC_OPS)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2_t {
struct isa : kvpager::kernels::detail::avx2_vec {};
#include "kernels/cpu/vec_math.inc"
void eval(const float* x, float* y, int n, bool nonpos) {
  for (int i = 0; i < n; i += isa::W) isa::storef(y + i, nonpos ? vexp_nonpos(isa::loadf(x + i)) : vexp(isa::loadf(x + i)));
}
void swap(const float* x, float* y, int d) { isa::storef(y, isa::swap_lanes(isa::loadf(x), d)); }
}  // namespace avx2_t
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")
namespace avx512_t {
struct isa : kvpager::kernels::detail::avx512_vec {};
#include "kernels/cpu/vec_math.inc"
void eval(const float* x, float* y, int n, bool nonpos) {
  for (int i = 0; i < n; i += isa::W) isa::storef(y + i, nonpos ? vexp_nonpos(isa::loadf(x + i)) : vexp(isa::loadf(x + i)));
}
void swap(const float* x, float* y, int d) { isa::storef(y, isa::swap_lanes(isa::loadf(x), d)); }
}  // namespace avx512_t
#pragma GCC pop_options
#endif

struct path {
  const char* name;
  int width;
  eval_fn eval;
  swap_fn swap;
};

/// The paths this CPU runs.
std::vector<path> paths() {
  std::vector<path> out{{"portable", 1, &portable_t::eval, &portable_t::swap}};
#if defined(KVPAGER_HAVE_X86_VEC_OPS)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
    out.push_back({"avx2", 8, &avx2_t::eval, &avx2_t::swap});
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl"))
    out.push_back({"avx512", 16, &avx512_t::eval, &avx512_t::swap});
#endif
  return out;
}

/// |got - exp(x)| in units of the float spacing at exp(x) (the smallest subnormal's, below the normal range).
double ulps(float got, float x) {
  const double want = std::exp(static_cast<double>(x));
  const double spacing = std::max(std::ldexp(1.0, std::ilogb(want) - 23), static_cast<double>(std::numeric_limits<float>::denorm_min()));
  return std::abs(static_cast<double>(got) - want) / spacing;
}

/// n arguments spread over [lo, hi] (both ends included) and random ones in it; a multiple of 16.
std::vector<float> arguments(float lo, float hi) {
  std::vector<float> x;
  for (int i = 0; i <= 20000; ++i) x.push_back(lo + (hi - lo) * static_cast<float>(i) / 20000.0F);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(lo, hi);
  while (x.size() % 16 != 0 || x.size() < 40000) x.push_back(u(rng));
  return x;
}

TEST(CpuVecMath, ExpWithinTwoUlpOverItsRangeOnEveryPath) {
  const std::vector<float> x = arguments(-87.3F, 88.3F);
  for (const path& p : paths()) {
    std::vector<float> y(x.size());
    p.eval(x.data(), y.data(), static_cast<int>(x.size()), false);
    double worst = 0;
    for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, ulps(y[i], x[i]));
    EXPECT_LE(worst, 2.0) << p.name;
  }
}

TEST(CpuVecMath, SoftmaxExpWithinTwoUlpDownToSubnormalsAndZeroForMaskedOnEveryPath) {
  const std::vector<float> x = arguments(-87.3F, 0.0F);
  for (const path& p : paths()) {
    std::vector<float> y(x.size());
    p.eval(x.data(), y.data(), static_cast<int>(x.size()), true);
    double worst = 0;
    for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, ulps(y[i], x[i]));
    EXPECT_LE(worst, 2.0) << p.name;
    // Below the normal range: 0 (vexp) or exp(x) as a subnormal within one of its spacing (vscalefps); never
    // negative, never above exp(x) by more than that.
    const std::vector<float> tiny = arguments(-120.0F, -87.3F);
    std::vector<float> t(tiny.size());
    p.eval(tiny.data(), t.data(), static_cast<int>(tiny.size()), true);
    for (std::size_t i = 0; i < tiny.size(); ++i) {
      ASSERT_GE(t[i], 0.0F) << p.name << " at " << tiny[i];
      ASSERT_LE(static_cast<double>(t[i]), std::exp(static_cast<double>(tiny[i])) + std::numeric_limits<float>::denorm_min())
          << p.name << " at " << tiny[i];
    }
    // The masked score (-inf), a NaN, and arguments far below: exactly 0, so a masked token adds nothing; 0 and -0: 1.
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> special(16, -inf), out(16, -1.0F);
    special[1] = nan;
    special[2] = -1e30F;
    special[3] = -std::numeric_limits<float>::max();
    special[4] = -110.0F;
    special[5] = 0.0F;
    special[6] = -0.0F;
    special[7] = -1e-30F;
    p.eval(special.data(), out.data(), 16, true);
    for (int i = 0; i < 5; ++i) EXPECT_EQ(out[static_cast<std::size_t>(i)], 0.0F) << p.name << " at " << special[static_cast<std::size_t>(i)];
    for (int i = 5; i < 8; ++i) EXPECT_EQ(out[static_cast<std::size_t>(i)], 1.0F) << p.name << " at " << special[static_cast<std::size_t>(i)];
  }
}

TEST(CpuVecMath, SwapLanesExchangesLaneIWithLaneIXorD) {
  for (const path& p : paths()) {
    std::vector<float> x(16), y(16);
    for (int i = 0; i < 16; ++i) x[static_cast<std::size_t>(i)] = static_cast<float>(i);
    for (int d = p.width / 2; d >= 1; d /= 2) {
      p.swap(x.data(), y.data(), d);
      for (int i = 0; i < p.width; ++i) EXPECT_EQ(y[static_cast<std::size_t>(i)], static_cast<float>(i ^ d)) << p.name << " d " << d;
    }
  }
}

}  // namespace
