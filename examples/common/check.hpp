// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The examples' number checks. Every figure an example prints beside the value the seed document implies goes
/// through one of these: a wrong figure prints `WRONG` with the value expected and is counted, and the example's
/// exit code (exit_code()) is non-zero if any was wrong, so `run_examples` and ctest fail on it.

#include <cmath>
#include <cstdint>
#include <cstdio>

#include <kvpager/core/status.hpp>

namespace example {

/// Figures found wrong so far.
inline int wrong = 0;

/// Prints "  label = actual" and checks it equals `expected`.
inline void check(const char* label, std::int64_t actual, std::int64_t expected) {
  std::printf("  %-58s %lld", label, static_cast<long long>(actual));
  if (actual != expected) {
    std::printf("   WRONG (expected %lld)", static_cast<long long>(expected));
    ++wrong;
  }
  std::printf("\n");
}

/// Prints a percentage with `decimals` decimals and checks it rounds to `expected` (given with those decimals).
inline void check_percent(const char* label, double fraction, double expected, int decimals) {
  const double pct = 100.0 * fraction;
  std::printf("  %-58s %.*f%%", label, decimals, pct);
  if (std::fabs(pct - expected) > 0.5 * std::pow(10.0, -decimals)) {
    std::printf("   WRONG (expected %.*f%%)", decimals, expected);
    ++wrong;
  }
  std::printf("\n");
}

/// Checks a statement that must hold; prints it either way.
inline void check_that(bool ok, const char* what) {
  std::printf("  %s %s\n", ok ? "yes:" : "WRONG, not true:", what);
  if (!ok) ++wrong;
}

/// Whether a library call that must succeed did; a failure is reported and counted.
inline bool succeeded(const kvpager::status& st, const char* what) {
  if (st.ok()) return true;
  std::printf("  WRONG: %s failed: %s (%s)\n", what, st.message(), kvpager::to_string(st.code()));
  ++wrong;
  return false;
}
template <class T>
bool succeeded(const kvpager::result<T>& r, const char* what) {
  return r.ok() || succeeded(r.error(), what);
}

/// 0 if every figure was right; 1 (after a summary line) otherwise.
inline int exit_code() {
  if (wrong == 0) return 0;
  std::printf("%d figure(s) WRONG\n", wrong);
  return 1;
}

}  // namespace example
